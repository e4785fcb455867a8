"""The `quartet inspect` page in a real headless browser (Debian's chromium driven by selenium; nothing is
downloaded): it loads two real 3-step runs, its curves hold the metrics file's values, filters change the
list as a plain-Python pass over the table says, a sample's tokens carry the recorded values, the group
shows the prompt's samples and compare shows both runs. `make test-browser` installs chromium when
missing; without it these tests skip."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq
import pytest

from quartet.inspector.server import InspectServer

pytestmark = pytest.mark.browser

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DRIVER = shutil.which("chromedriver")
if CHROMIUM is None or DRIVER is None:
    pytest.skip("no chromium + chromedriver here: `make test-browser` installs them", allow_module_level=True)
webdriver = pytest.importorskip("selenium.webdriver")
from selenium.common.exceptions import StaleElementReferenceException  # noqa: E402
from selenium.webdriver.common.by import By  # noqa: E402
from selenium.webdriver.support import expected_conditions as ec  # noqa: E402
from selenium.webdriver.support.ui import Select, WebDriverWait  # noqa: E402

WAIT_S = 30.0


@pytest.fixture(scope="module")
def page(inspect_runs: tuple[Path, Path]) -> Iterator[tuple[Any, str]]:
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1400,1000"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=str(DRIVER)))
    driver.set_page_load_timeout(WAIT_S)
    try:
        with InspectServer(list(inspect_runs)) as url:
            driver.get(url)
            _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
            yield driver, url
    finally:
        driver.quit()


def _wait(driver: Any, condition: Any) -> Any:
    # The page re-renders its tables on every filter change: a row found just before a re-render is stale
    # when read, which means "not yet", not a failure.
    stale = (StaleElementReferenceException,)
    return WebDriverWait(driver, WAIT_S, ignored_exceptions=stale).until(condition)


def _shot(driver: Any, name: str) -> None:
    folder = os.environ.get("QUARTET_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        driver.save_screenshot(str(Path(folder) / f"inspect_{name}.png"))


def _rows(run: Path, step: int) -> list[dict[str, Any]]:
    return pq.read_table(run / "rollouts" / f"step_{step}.parquet").to_pylist()


def _tab(driver: Any, view: str) -> None:
    driver.find_element(By.CSS_SELECTOR, f'button.tab[data-view="{view}"]').click()


def _view(driver: Any) -> str:
    return str(driver.find_element(By.TAG_NAME, "body").get_attribute("data-view"))


def _table_rows(driver: Any) -> list[Any]:
    return driver.find_elements(By.CSS_SELECTOR, "#sample-table tbody tr")


def _set_filter(driver: Any, element_id: str, value: str) -> None:
    field = driver.find_element(By.ID, element_id)
    if field.tag_name == "select":
        Select(field).select_by_value(value)
    else:
        field.clear()
        field.send_keys(value)


def _matched(driver: Any, expected: int) -> None:
    _wait(
        driver, lambda d: d.find_element(By.ID, "sample-count").get_attribute("data-matched") == str(expected)
    )
    _wait(driver, lambda d: len(_table_rows(d)) == expected)


def test_overview_curves_hold_the_metrics_and_hover_shows_a_step(
    page: tuple[Any, str], inspect_runs: tuple[Path, Path]
) -> None:
    driver, _ = page
    records = [json.loads(x) for x in (inspect_runs[0] / "metrics.jsonl").read_text().splitlines()]
    scores = [r["critic/score/mean"] for r in records if r["kind"] == "step"]
    line = driver.find_element(By.CSS_SELECTOR, 'polyline[data-metric="critic/score/mean"]')
    assert len(line.get_attribute("points").split()) == len(scores) == 3
    svg = line.find_element(By.XPATH, "..")
    webdriver.ActionChains(driver).move_to_element(svg).perform()
    tip = _wait(driver, ec.visibility_of_element_located((By.ID, "tooltip")))
    assert tip.text.startswith("step ") and "critic/score/mean" in tip.text
    step = int(tip.text.split()[1])
    shown = dict(line.split(": ") for line in tip.text.splitlines()[1:])
    assert float(shown["critic/score/mean"]) == pytest.approx(scores[step - 1], abs=1e-4)
    _shot(driver, "overview")


def test_filters_change_the_list(page: tuple[Any, str], inspect_runs: tuple[Path, Path]) -> None:
    driver, _ = page
    rows = _rows(inspect_runs[0], 3)
    _tab(driver, "samples")
    Select(driver.find_element(By.ID, "step")).select_by_value("3")
    _matched(driver, 16)
    _set_filter(driver, "f-min-score", "0.5")
    _matched(driver, sum(r["score"] >= 0.5 for r in rows))
    _set_filter(driver, "f-min-score", "")
    _set_filter(driver, "f-max-score", "0")
    _matched(driver, sum(r["score"] <= 0 for r in rows))
    _set_filter(driver, "f-max-score", "")
    needle = rows[0]["prompt"][-12:]
    _set_filter(driver, "f-text", needle)
    _matched(driver, sum(needle.lower() in (r["prompt"] + r["response"]).lower() for r in rows))
    _set_filter(driver, "f-text", "")
    _set_filter(driver, "f-sort", "advantage")
    _set_filter(driver, "f-order", "desc")
    _matched(driver, 16)
    expected = [r["row"] for r in sorted(rows, key=lambda r: (-r["advantage"], r["row"]))]
    _wait(driver, lambda d: [int(tr.get_attribute("data-row")) for tr in _table_rows(d)] == expected)
    _shot(driver, "samples")


def test_a_sample_shows_each_token_with_its_recorded_values(
    page: tuple[Any, str], inspect_runs: tuple[Path, Path]
) -> None:
    driver, _ = page
    rows = _rows(inspect_runs[0], 3)
    _tab(driver, "samples")
    Select(driver.find_element(By.ID, "step")).select_by_value("3")
    _wait(driver, lambda d: len(_table_rows(d)) == 16)
    target = max(rows, key=lambda r: r["response_tokens"])
    driver.find_element(By.CSS_SELECTOR, f'#sample-table tbody tr[data-row="{target["row"]}"]').click()
    _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-view") == "sample")
    spans = driver.find_elements(By.CSS_SELECTOR, "#sample-turns span.tok")
    assert [s.get_attribute("data-i") for s in spans] == [str(i) for i in range(target["response_tokens"])]
    assert "".join(s.get_attribute("textContent") for s in spans) == "".join(target["token_text"])
    for field, expected in (
        ("advantages", target["advantages"]),
        ("entropy", target["entropy"]),
        (
            "logprob_diff",
            [b - a for a, b in zip(target["logprobs"], target["rollout_logprobs"], strict=True)],
        ),
    ):
        Select(driver.find_element(By.ID, "color-by")).select_by_value(field)
        spans = driver.find_elements(By.CSS_SELECTOR, "#sample-turns span.tok")
        assert [float(s.get_attribute("data-value")) for s in spans] == pytest.approx(expected, abs=1e-5)
        webdriver.ActionChains(driver).move_to_element(spans[0]).perform()
        info = dict(x.split(": ", 1) for x in driver.find_element(By.ID, "token-info").text.splitlines())
        assert float(info["logprobs"]) == pytest.approx(target["logprobs"][0], abs=1e-5)
        assert float(info["advantages"]) == pytest.approx(target["advantages"][0], abs=1e-5)
        text = json.dumps(target["token_text"][0], ensure_ascii=False)
        assert info["token 0"] == f"{text} (id {target['token_ids'][0]})"
    Select(driver.find_element(By.ID, "color-by")).select_by_value("advantages")
    _shot(driver, "sample")


def test_group_view_shows_the_prompts_samples(page: tuple[Any, str], inspect_runs: tuple[Path, Path]) -> None:
    driver, _ = page
    rows = _rows(inspect_runs[0], 3)
    _tab(driver, "samples")
    Select(driver.find_element(By.ID, "step")).select_by_value("3")
    _wait(driver, lambda d: len(_table_rows(d)) == 16)
    _set_filter(driver, "f-sort", "row")
    _set_filter(driver, "f-order", "asc")
    _wait(driver, lambda d: _table_rows(d)[0].get_attribute("data-row") == "0")
    _table_rows(driver)[0].find_element(By.CSS_SELECTOR, "a.group-link").click()
    _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-view") == "group")
    cols = driver.find_elements(By.CSS_SELECTOR, "#group-cols .col")
    members = [r for r in rows if r["uid"] == rows[0]["uid"]]
    assert [int(c.get_attribute("data-row")) for c in cols] == [r["row"] for r in members]
    for col, r in zip(cols, members, strict=True):
        assert col.find_element(By.TAG_NAME, "pre").get_attribute("textContent") == r["response"]
        assert f"adv {r['advantage']:.3f}" in col.text
    _shot(driver, "group")


def test_compare_shows_the_same_prompt_in_both_runs(
    page: tuple[Any, str], inspect_runs: tuple[Path, Path]
) -> None:
    driver, _ = page
    a, b = inspect_runs
    target = _rows(a, 3)[0]
    _tab(driver, "samples")
    Select(driver.find_element(By.ID, "step")).select_by_value("3")
    _set_filter(driver, "f-sort", "row")
    _set_filter(driver, "f-order", "asc")
    _wait(driver, lambda d: _table_rows(d) and _table_rows(d)[0].get_attribute("data-row") == "0")
    _table_rows(driver)[0].click()
    _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-view") == "sample")
    _tab(driver, "compare")
    Select(driver.find_element(By.ID, "compare-target")).select_by_value("run:1")
    here = [r for r in _rows(a, 3) if r["index"] == target["index"]]
    there = [(s, r["row"]) for s in (1, 2, 3) for r in _rows(b, s) if r["index"] == target["index"]]

    def both(d: Any) -> bool:
        left = d.find_elements(By.CSS_SELECTOR, "#compare-left .col")
        right = d.find_elements(By.CSS_SELECTOR, "#compare-right .col")
        return len(left) == len(here) and len(right) == len(there)

    _wait(driver, both)
    right = driver.find_elements(By.CSS_SELECTOR, "#compare-right .col")
    assert [(int(c.get_attribute("data-step")), int(c.get_attribute("data-row"))) for c in right] == there
    assert "run_b" in driver.find_element(By.ID, "compare-right").text
    _shot(driver, "compare")


def test_steps_whose_alarm_fired_are_marked(page: tuple[Any, str], inspect_runs: tuple[Path, Path]) -> None:
    """Run B's engine samples in bf16 next to an fp32 trainer: every step's mismatch alarm tripped."""
    driver, _ = page
    written = [json.loads(x) for x in (inspect_runs[1] / "metrics.jsonl").read_text().splitlines()]
    alarmed = [str(r["step"]) for r in written if r["kind"] == "alarm"]
    assert alarmed == ["1", "2", "3"]
    badge = driver.find_element(By.ID, "alarms")
    assert not badge.is_displayed()  # run A: none
    run = Select(driver.find_element(By.ID, "run"))
    run.select_by_value("1")
    try:
        _wait(
            driver, lambda d: d.find_element(By.ID, "alarms").get_attribute("data-steps") == ",".join(alarmed)
        )
        assert badge.is_displayed() and "step 1, 2, 3" in badge.text
        marked = driver.find_elements(By.CSS_SELECTOR, "#step option.alarm")
        assert [o.get_attribute("value") for o in marked] == alarmed
        assert all("mismatch (recompute)" in o.text for o in marked)
        _shot(driver, "alarm")
    finally:
        run.select_by_value("0")
        _wait(driver, lambda d: not d.find_element(By.ID, "alarms").is_displayed())


def test_a_live_runs_new_step_appears_without_a_reload(
    inspect_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    """The page of a run that is still going: a step recorded after the page opened shows up by itself."""
    live = tmp_path / "live"
    shutil.copytree(inspect_runs[0], live, ignore=shutil.ignore_patterns("checkpoints"))
    later = live / "rollouts" / "step_3.parquet"
    held = later.read_bytes()
    later.unlink()
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=str(DRIVER)))
    try:
        with InspectServer([live]) as url:
            driver.get(url)
            _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")

            def steps(d: Any) -> list[str]:
                return [o.get_attribute("value") for o in d.find_elements(By.CSS_SELECTOR, "#step option")]

            assert steps(driver) == ["1", "2"]
            later.write_bytes(held)  # the trainer records step 3
            _wait(driver, lambda d: steps(d) == ["1", "2", "3"])
    finally:
        driver.quit()


def test_a_sample_shows_its_images_beside_its_tokens(tmp_path: Path) -> None:
    """A vision-language run (written without training): the sample with two images shows both, loaded from
    the run's image endpoint, and a sample without images shows none."""
    from vision_run import BLUE, RED, write_run

    run = tmp_path / "vision"
    write_run(run, [[RED, BLUE], []])
    options = webdriver.ChromeOptions()
    options.binary_location = str(CHROMIUM)
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1200,800"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=webdriver.ChromeService(executable_path=str(DRIVER)))
    try:
        with InspectServer([run]) as url:
            driver.get(url)
            _wait(driver, lambda d: d.find_element(By.TAG_NAME, "body").get_attribute("data-ready") == "1")
            _tab(driver, "samples")
            _wait(driver, lambda d: len(_table_rows(d)) == 2)
            _table_rows(driver)[0].click()
            _wait(driver, lambda d: _view(d) == "sample")
            recorded = pq.read_table(run / "rollouts" / "step_1.parquet")["images"].to_pylist()[0]

            def loaded(d: Any) -> list[Any]:
                imgs = d.find_elements(By.CSS_SELECTOR, "#sample-images img")
                complete = all(d.execute_script("return arguments[0].naturalWidth", i) == 6 for i in imgs)
                return imgs if len(imgs) == 2 and complete else []

            imgs = _wait(driver, loaded)
            assert [img.get_attribute("title") for img in imgs] == recorded
            assert driver.find_element(By.ID, "sample-images").is_displayed()
            assert driver.find_elements(By.CSS_SELECTOR, "#sample-turns span.tok")  # the tokens beside them
            _shot(driver, "sample_images")
            _tab(driver, "samples")
            _table_rows(driver)[1].click()
            _wait(driver, lambda d: not d.find_elements(By.CSS_SELECTOR, "#sample-images img"))
            assert not driver.find_element(By.ID, "sample-images").is_displayed()
    finally:
        driver.quit()
