"""The `quartet inspect` HTTP API over real runs, on a real socket: what it serves equals what the tables
hold; bad parameters are 400 naming the parameter; nothing outside the run folders and the page's own
assets is reachable; it is read-only."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from quartet.cli.main import main as cli_main
from quartet.inspector.server import InspectServer


@pytest.fixture(scope="module")
def url(inspect_runs: tuple[Path, Path]) -> Iterator[str]:
    with InspectServer(list(inspect_runs)) as base:
        yield base


def _get(url: str, method: str = "GET") -> tuple[int, Any]:
    request = urllib.request.Request(url, method=method)
    try:
        with urllib.request.urlopen(request, timeout=30) as res:
            body = res.read().decode()
            return res.status, json.loads(
                body
            ) if res.headers.get_content_type() == "application/json" else body
    except urllib.error.HTTPError as err:
        return err.code, err.read().decode()


def test_the_api_serves_what_the_tables_hold(url: str, inspect_runs: tuple[Path, Path]) -> None:
    a, b = inspect_runs
    status, runs = _get(f"{url}/api/runs")
    assert status == 200 and [r["name"] for r in runs] == ["run_a", "run_b"]
    assert [r["path"] for r in runs] == [str(a.resolve()), str(b.resolve())]
    rows = pq.read_table(a / "rollouts" / "step_2.parquet").to_pylist()
    status, page = _get(f"{url}/api/run/0/step/2/samples?sort=score&order=desc&limit=5")
    assert status == 200 and page["total"] == page["matched"] == len(rows)
    expected = sorted(rows, key=lambda r: (-r["score"], r["row"]))[:5]
    assert [r["row"] for r in page["rows"]] == [r["row"] for r in expected]
    status, sample = _get(f"{url}/api/run/1/step/3/sample/4")
    raw = pq.read_table(b / "rollouts" / "step_3.parquet").to_pylist()[4]
    assert status == 200 and [t["advantages"] for t in sample["tokens"]] == pytest.approx(raw["advantages"])
    status, curves = _get(f"{url}/api/run/0/curves")
    scores = [json.loads(x) for x in (a / "metrics.jsonl").read_text().splitlines()]
    expected_points = [(r["step"], r["critic/score/mean"]) for r in scores if r["kind"] == "step"]
    got = [(int(step), value) for step, value in curves["panels"]["score"]["critic/score/mean"]]
    assert [s for s, _ in got] == [s for s, _ in expected_points] == [1, 2, 3]
    assert [v for _, v in got] == pytest.approx([v for _, v in expected_points])
    assert {"timing_s/gen", "timing_s/step"} <= set(curves["panels"]["time per phase"])
    status, alarms = _get(f"{url}/api/run/1/alarms")  # run B: bf16 engine, fp32 trainer
    written = [json.loads(x) for x in (b / "metrics.jsonl").read_text().splitlines()]
    assert status == 200 and alarms == [
        {
            "value": r["alarm/mismatch_value"],
            "threshold": r["alarm/mismatch_threshold"],
            **{k: r[k] for k in ("step", "alarm", "phase", "message")},
        }
        for r in written
        if r["kind"] == "alarm"
    ]
    assert [x["step"] for x in alarms] == [1, 2, 3] and _get(f"{url}/api/run/0/alarms") == (200, [])


@pytest.mark.parametrize(
    ("path", "status", "says"),
    [
        ("/api/run/0/step/2/samples?min_score=high", 400, "min_score must be a number"),
        ("/api/run/0/step/2/samples?truncated=maybe", 400, "truncated must be true or false"),
        ("/api/run/0/step/2/samples?limit=0", 400, "limit must lie in 1..5000"),
        ("/api/run/0/step/2/samples?sort=prompt", 400, "cannot sort by 'prompt'"),
        ("/api/run/0/step/x/samples", 400, "step must be an integer"),
        ("/api/run/0/step/9/samples", 404, "recorded steps: 1, 2, 3"),
        ("/api/run/0/step/2/sample/99", 404, "no row 99"),
        ("/api/run/0/step/2/group/nope", 404, "no group 'nope'"),
        ("/api/run/2/steps", 404, "runs are 0..1"),
        ("/api/run/..%2F..%2Fetc/steps", 404, "no run"),
        ("/static/..%2Finspect.js", 404, ""),
        ("/static/run_data.py", 404, "no asset"),
        ("/static/%2Fetc%2Fpasswd", 404, ""),
    ],
)
def test_bad_requests_are_named_and_nothing_else_is_reachable(
    url: str, path: str, status: int, says: str
) -> None:
    code, body = _get(url + path)
    assert code == status and says in str(body)


def test_the_page_and_its_assets_are_served_and_writes_are_refused(url: str) -> None:
    code, html = _get(url + "/")
    assert code == 200 and '<script src="/static/inspect.js">' in html
    assert _get(url + "/static/inspect.js")[0] == 200 and _get(url + "/static/inspect.css")[0] == 200
    assert "http" not in html.replace("http-equiv", "")  # nothing fetched from the network
    for method in ("POST", "PUT", "DELETE"):
        assert _get(url + "/api/runs", method)[0] == 405


def test_the_cli_names_a_folder_that_is_not_a_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert cli_main(["inspect", str(tmp_path)]) == 1
    assert "is not a run folder: it has neither metrics.jsonl nor rollouts/" in capsys.readouterr().err
