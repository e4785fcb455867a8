"""Two GRPO steps of the tiny Qwen2-VL through `RLTrainer` (in-process roles) with agent loops on and the
`zoom` tool: every model turn zooms (a parser that reads each turn as a call, since a random model writes
none), so trajectories carry the prompt's image and the tool's, and the trainer's log-probs of the model's
tokens equal the engine's."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from agent_cases import ZoomEveryTurn, rows

from quartet.agents.tools.parsing import PARSERS
from quartet.config import load_config
from quartet.models.loading import load_tokenizer
from quartet.trainer import RLTrainer

REWARD = (
    "def compute_score(data_source, solution_str, ground_truth, extra_info=None):\n"
    "    return len(solution_str) % 3\n"
)


def _model(source: Path, folder: Path) -> Path:
    """The tiny VLM whose every odd token id also ends a turn: a random model's turns then end by STOP
    after a few tokens, as a trained model's end at its end-of-turn token, so the loop goes on to the tool."""
    shutil.copytree(source, folder)
    tokenizer = load_tokenizer(folder)
    config = json.loads((folder / "generation_config.json").read_text())
    stops = {*range(1, len(tokenizer), 2), tokenizer.convert_tokens_to_ids("<|im_end|>")}
    config["eos_token_id"] = sorted(stops)
    (folder / "generation_config.json").write_text(json.dumps(config))
    return folder


def test_grpo_with_image_tool_turns(
    tiny_vlm_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(PARSERS, "hermes", ZoomEveryTurn)
    model = _model(tiny_vlm_dir, tmp_path / "model")
    data = tmp_path / "train.parquet"
    pq.write_table(pa.Table.from_pylist(rows() * 2), data)
    (tmp_path / "reward.py").write_text(REWARD)
    cfg = load_config(
        None,
        [
            f"model.path={model}",
            f"trainer.output_dir={tmp_path / 'out'}",
            f"data.train_files=[{data}]",
            f"reward.function={tmp_path / 'reward.py'}:compute_score",
            "data.max_prompt_length=128",
            "data.max_response_length=96",
            "data.train_batch_size=2",
            "rollout.n=2",
            "rollout.multi_turn.enable=true",
            "rollout.multi_turn.tools=[zoom]",
            "rollout.multi_turn.max_assistant_turns=2",
            "algorithm.adv_estimator=grpo",
            "actor.mini_batch_size=2",
            "actor.micro_batch_size_per_device=4",
            "actor.mixed_precision=float32",
            "cluster.backend=local",
            "trainer.total_steps=2",
            "trainer.rollout_freq=1",
            "trainer.loggers=[jsonl]",
        ],
    )
    result = RLTrainer(cfg).run()
    assert result.steps == 2
    metrics = result.last_metrics
    assert abs(metrics["rollout/logprob_diff_mean"]) < 1e-5  # engine and trainer agree on every image turn
    assert metrics["tool/zoom/calls/total"] == 4 and metrics["agent/finish/max_turns"] == 1.0
    for step in (1, 2):
        records = [
            json.loads(x)
            for x in (result.run_dir / "rollouts" / f"step_{step}.jsonl").read_text().splitlines()
        ]
        # each sample shows its prompt's images, then the zoom's
        counts = sorted(len(r["images"]) for r in records)
        assert counts and all(c in (2, 3) for c in counts), counts
