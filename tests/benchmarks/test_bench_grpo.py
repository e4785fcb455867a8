"""The GRPO benchmarks (quartet vs TRL, time to accuracy, scaling): their arithmetic checked against
independent computations, and a CI smoke of each (`--smoke`: it runs both sides and writes a valid result;
the timing goals are not tests)."""

from __future__ import annotations

import math
import random
from pathlib import Path

import pytest
from arith_reward import exact_answer
from bench_smoke import finite_positive, run_smoke
from grpo_runs import RunResult
from grpo_vs_trl import floor_seconds
from scaling import analyse, linear_fit
from time_to_accuracy import crossing

from quartet.tasks.arithmetic import compute_score


def test_trl_side_scores_exactly_like_quartet() -> None:
    rng = random.Random(0)
    texts = [
        "7",
        " 7 ",
        "7.",
        "3+4=7",
        "3+4 = 7.",
        "=7",
        "07",
        "+7",
        "-7",
        "7a",
        "",
        "seven",
        "3+4=8",
        "1=2=7",
    ]
    texts += [f"{rng.randint(-99, 199)}{rng.choice(['', '.', ' ', '=5', 'x'])}" for _ in range(300)]
    for text in texts:
        for truth in ("7", "-7", "12", "0"):
            assert exact_answer(text, truth) == compute_score(text, truth), (text, truth)


def test_floor_counts_six_n_per_trained_token_and_two_n_per_forward_token() -> None:
    params, rows, prompt, response, peak = 1_000_000, 64, 20.0, 30.0, 50.0
    floor = floor_seconds(params, rows, prompt, response, logprob_passes=1, gflops=peak)
    tokens = 64 * 50
    assert floor["train_s"] == pytest.approx(6e6 * tokens / 50e9)
    assert floor["logprob_s"] == pytest.approx(2e6 * tokens / 50e9)
    assert floor["gen_s"] == pytest.approx(2e6 * tokens / 50e9)
    assert floor["total_s"] == pytest.approx(10e6 * tokens / 50e9)
    assert floor_seconds(params, rows, prompt, response, 0, peak)["logprob_s"] == 0.0


def test_scaling_fit_and_knee() -> None:
    xs = [8.0, 16.0, 32.0, 64.0]
    line = [0.5 + 0.01 * x for x in xs]
    assert linear_fit(xs, line) == pytest.approx((0.5, 0.01))
    fit = analyse(xs, line)
    assert fit["max_abs_deviation"] < 1e-12 and fit["knees"] == []
    bent = [0.5 + 0.01 * x if x <= 32 else 0.82 + 0.03 * (x - 32) for x in xs]  # 3x the cost past 32
    knees = analyse(xs, bent)["knees"]
    assert [k["between"][1] for k in knees] == [32.0]
    assert knees[0]["marginal_after"] == pytest.approx(0.03)


def test_time_to_accuracy_takes_the_first_evaluation_at_the_threshold() -> None:
    evals = [
        {"step": 0, "train_seconds": 0.0, "accuracy": 0.2},
        {"step": 5, "train_seconds": 3.0, "accuracy": 0.31},
        {"step": 10, "train_seconds": 6.0, "accuracy": 0.29},
        {"step": 15, "train_seconds": 9.0, "accuracy": 0.4},
    ]
    run = RunResult("quartet", [0.6] * 15, evals=evals)
    assert crossing(run, 0.3) == {"step": 5, "train_seconds": 3.0, "accuracy": 0.31}
    assert crossing(run, 0.5) == {"step": None, "train_seconds": None, "accuracy": 0.4}


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_grpo_vs_trl_smoke(tmp_path: Path) -> None:
    record = run_smoke("grpo_vs_trl.py", tmp_path, timeout_s=900)
    tiny = record["summary"]["tiny"]
    assert record["versions"]["trl"]
    for side in ("quartet_step_s", "trl_step_s"):
        assert tiny[side]["n"] == 4 and finite_positive(
            tiny[side]["median"]
        )  # 2 rounds x (3 steps - warm-up)
    assert finite_positive(tiny["trl_over_quartet"]) and finite_positive(tiny["floor"]["total_s"])
    assert {"gen", "update_actor"} <= set(tiny["quartet_phases_median_s"])
    for side in ("quartet", "trl"):  # both sides generated (up to 8 tokens: end-of-text may stop a row early)
        assert 1 <= tiny["mean_response_tokens"][side] <= 8
        assert [len(r["step_seconds"]) for r in record["raw"]["tiny"][side]] == [3, 3]


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_time_to_accuracy_smoke(tmp_path: Path) -> None:
    record = run_smoke("time_to_accuracy.py", tmp_path, timeout_s=900)
    summary = record["summary"]
    assert 0 <= summary["warm_start_accuracy"] <= 1 and summary["threshold"] > summary["warm_start_accuracy"]
    for side in ("quartet", "trl"):
        (run,) = record["raw"][side]
        assert [e["step"] for e in run["evals"]] == [0, 1, 2]  # evaluated before training and every step
        assert all(0 <= e["accuracy"] <= 1 for e in run["evals"])
        assert len(run["step_seconds"]) == 2 or summary[side]["steps_to_threshold"][0] is not None


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_scaling_smoke(tmp_path: Path) -> None:
    record = run_smoke("scaling.py", tmp_path, timeout_s=900)
    for sweep, key in (("prompts", "prompts"), ("lengths", "max_new_tokens")):
        points = record["summary"][sweep]["points"]
        assert [p[key] for p in points] == ([2, 4] if sweep == "prompts" else [8, 16])
        assert all(finite_positive(p["step_s"]) and finite_positive(p["generated_tokens"]) for p in points)
        assert math.isfinite(record["summary"][sweep]["slope_s"])


def test_prompt_length_of_the_floor_counts_tokens(tmp_path: Path) -> None:
    from grpo_runs import prepare
    from grpo_vs_trl import mean_prompt_tokens
    from transformers import AutoTokenizer

    w = prepare(tmp_path, "tiny", train_size=64, val_size=8)
    tok = AutoTokenizer.from_pretrained(w.model_dir)
    import pyarrow.parquet as pq

    prompts = [r["prompt"] for r in pq.read_table(w.train_parquet).to_pylist()[:16]]
    rendered = [tok.apply_chat_template(p, add_generation_prompt=True, return_dict=True) for p in prompts]
    ids = [r["input_ids"] for r in rendered]
    assert mean_prompt_tokens(w, 16) == pytest.approx(sum(map(len, ids)) / 16)
    assert mean_prompt_tokens(w, 16) > 8  # the question and the chat markup, not the number of keys of a dict
