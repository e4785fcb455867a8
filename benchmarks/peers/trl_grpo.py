"""TRL's side of the GRPO comparisons: `GRPOTrainer` on CPU with the settings a JSON file gives.

Runs in the TRL virtual environment (`benchmarks/peers/trl_env.py` makes it), never in quartet's: it imports
nothing from quartet. The reward is the arithmetic task's exact verifier (`arith_reward.py`, beside this file,
checked against quartet's by the tests), so both sides score alike.

    .venv-trl/bin/python benchmarks/peers/trl_grpo.py SETTINGS.json OUT.json

SETTINGS keys: model_dir, train_parquet, val_parquet (optional), steps, prompts_per_step, n,
max_new_tokens, temperature, lr, dtype ("float32" | "bfloat16"), seed, threads, eval_every (0: none),
eval_size, target_accuracy (stop once reached; null: run all steps), device ("cpu", the default, or "cuda").

Settings are matched to quartet's GRPO: one generation per optimizer step (per_device_train_batch_size =
prompts x n, gradient_accumulation_steps = 1), one PPO epoch (num_iterations = 1), token-mean loss over the
batch (`dapo`, quartet's `token-mean`), no KL term (beta = 0), clip 0.2, advantages scaled by the group's
std, no top-k/top-p, AdamW without weight decay and a constant learning rate, no warm-up.

OUT gets: per-step wall seconds (from the step's start to its end, generation included; evaluation time is
not inside), completion lengths, start-up seconds, and the evaluations (step, train seconds so far, accuracy).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

T_START = time.perf_counter()

import pyarrow.parquet as pq  # noqa: E402 (the start-up time includes the imports)
import torch  # noqa: E402
from arith_reward import exact_answer  # noqa: E402 (this folder: the script's own)
from datasets import Dataset  # noqa: E402
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402


def read_rows(path: str, limit: int | None = None) -> list[dict[str, Any]]:
    """The prompt set in verl's layout: `prompt` (chat messages) and `reward_model.ground_truth`."""
    rows = pq.read_table(path).to_pylist()[:limit]
    return [{"prompt": r["prompt"], "ground_truth": str(r["reward_model"]["ground_truth"])} for r in rows]


def reward_exact(completions: list[Any], ground_truth: list[str], **_: Any) -> list[float]:
    texts = [c[-1]["content"] if isinstance(c, list) else str(c) for c in completions]
    return [exact_answer(t, g) for t, g in zip(texts, ground_truth, strict=True)]


def greedy_accuracy(model: Any, tokenizer: Any, rows: list[dict[str, Any]], max_new_tokens: int) -> float:
    """Greedy answers to `rows` with transformers `generate` (left padding), scored by the verifier."""
    model.eval()
    prompts = [
        tokenizer.apply_chat_template(r["prompt"], tokenize=False, add_generation_prompt=True) for r in rows
    ]
    side, tokenizer.padding_side = tokenizer.padding_side, "left"
    correct = 0.0
    with torch.no_grad():
        for i in range(0, len(prompts), 64):
            enc = tokenizer(prompts[i : i + 64], return_tensors="pt", padding=True, add_special_tokens=False)
            out = model.generate(**enc, max_new_tokens=max_new_tokens, do_sample=False)
            texts = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :], skip_special_tokens=True)
            correct += sum(
                exact_answer(t, r["ground_truth"]) for t, r in zip(texts, rows[i : i + 64], strict=True)
            )
    tokenizer.padding_side = side
    model.train()
    return correct / len(rows)


class StepClock(TrainerCallback):  # type: ignore[misc]
    """Wall time of each optimizer step, evaluations between steps, and a stop at the target accuracy."""

    def __init__(self, settings: dict[str, Any], tokenizer: Any, val_rows: list[dict[str, Any]]) -> None:
        self.s, self.tokenizer, self.val_rows = settings, tokenizer, val_rows
        self.step_seconds: list[float] = []
        self.evals: list[dict[str, float]] = []
        self.lengths: list[float] = []
        self._t = 0.0
        self.first_step_end_unix = 0.0

    def evaluate(self, model: Any, step: int) -> float:
        t = time.perf_counter()
        acc = greedy_accuracy(model, self.tokenizer, self.val_rows, int(self.s["max_new_tokens"]))
        self.evals.append(
            {
                "step": step,
                "train_seconds": sum(self.step_seconds),
                "accuracy": acc,
                "eval_seconds": time.perf_counter() - t,
            }
        )
        return acc

    def on_step_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
        self._t = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
        self.step_seconds.append(time.perf_counter() - self._t)
        if len(self.step_seconds) == 1:
            self.first_step_end_unix = time.time()  # benchmarks/startup.py: time to the first step
        every = int(self.s.get("eval_every") or 0)
        if every and state.global_step % every == 0:
            target = self.s.get("target_accuracy")
            if self.evaluate(model, state.global_step) >= (target if target is not None else 2.0):
                control.should_training_stop = True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, float] | None = None, **kw: Any
    ) -> None:
        if logs and "completions/mean_length" in logs:
            self.lengths.append(float(logs["completions/mean_length"]))


def main(settings_path: str, out_path: str) -> None:
    s = json.loads(Path(settings_path).read_text())
    torch.set_num_threads(int(s["threads"]))
    torch.manual_seed(int(s["seed"]))
    batch = int(s["prompts_per_step"]) * int(s["n"])
    train = Dataset.from_list(read_rows(s["train_parquet"], batch * int(s["steps"])))
    val_rows = (
        read_rows(s["val_parquet"], int(s.get("eval_size") or 0) or None) if s.get("eval_every") else []
    )
    tokenizer = AutoTokenizer.from_pretrained(s["model_dir"])
    model = AutoModelForCausalLM.from_pretrained(s["model_dir"], dtype=torch.float32)
    bf16 = s["dtype"] == "bfloat16"
    config = GRPOConfig(
        output_dir=str(Path(out_path).parent / "trl_output"),
        use_cpu=s.get("device", "cpu") == "cpu",
        use_vllm=False,
        bf16=bf16,
        fp16=False,
        seed=int(s["seed"]),
        max_steps=int(s["steps"]),
        per_device_train_batch_size=batch,
        gradient_accumulation_steps=1,
        num_generations=int(s["n"]),
        max_completion_length=int(s["max_new_tokens"]),
        temperature=float(s["temperature"]),
        top_p=1.0,
        top_k=0,
        num_iterations=1,
        beta=0.0,
        epsilon=0.2,
        loss_type="dapo",
        scale_rewards="group",
        learning_rate=float(s["lr"]),
        lr_scheduler_type="constant",
        warmup_steps=0,
        weight_decay=0.0,
        max_grad_norm=1.0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
    )
    clock = StepClock(s, tokenizer, val_rows)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward_exact,
        args=config,
        train_dataset=train,
        processing_class=tokenizer,
        callbacks=[clock],
    )
    startup = time.perf_counter() - T_START
    if s.get("eval_every"):
        clock.evaluate(trainer.model, 0)
    trainer.train()
    out = {
        "side": "trl",
        "step_seconds": clock.step_seconds,
        "completion_mean_length": clock.lengths,
        "startup_seconds": startup,
        "first_step_end_unix": clock.first_step_end_unix,
        "process_seconds": time.perf_counter() - T_START,
        "evals": clock.evals,
        "threads": torch.get_num_threads(),
        "params": sum(p.numel() for p in model.parameters()),
    }
    Path(out_path).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
