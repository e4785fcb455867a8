"""A GRPO loop written against the Tinker SDK, served by `quartet serve tinker`, vs the same GRPO as
`quartet train`: step time ratio, one run (issue 51, "Cost").

    .venv/bin/python benchmarks/tinker_grpo_vs_train.py [--steps 4] [--prompts 8] [--n 4] [--max-new 16]

Both sides: the benchmarks' tiny model (grpo_runs.prepare), the 2-digit addition prompts (the same parquet
file, in order), `--prompts` prompts x `--n` samples per step, temperature 1, LoRA rank 8 (scale 1) on the
attention and MLP linears, AdamW lr 1e-4, one optimizer step per step, no KL term, torch 1 thread.
- SDK: the service runs as `quartet serve tinker` in its own process; this process runs the loop as a
  Tinker user writes it: save_weights_and_get_sampling_client, sample every prompt (all submitted, then
  awaited), score with the task's reward, group-normalised advantages, forward_backward with
  `importance_sampling` (sampling logprobs as the old policy), optim_step.
- quartet: `quartet train` with the same settings (actor LoRA, Ray on this machine), per-step
  `timing_s/step` from its metrics.
The first step of each side is a warm-up and is left out of the median. A JSON result goes to
benchmarks/results/tinker_grpo_vs_train.json.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from common import spread, table, write_result  # noqa: E402
from grpo_runs import QUARTET, GrpoSettings, prepare, run_quartet  # noqa: E402

KEY = "tml-grpo-bench"


def _prompts(parquet: Path, tokenizer: Any, count: int) -> list[tuple[list[int], str]]:
    import pyarrow.parquet as pq

    rows = pq.read_table(parquet).to_pylist()[:count]
    out = []
    for row in rows:
        text = tokenizer.apply_chat_template(list(row["prompt"]), add_generation_prompt=True, tokenize=False)
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        out.append((list(ids), str(row["reward_model"]["ground_truth"])))
    return out


def run_sdk(model_dir: Path, parquet: Path, s: GrpoSettings, work: Path) -> list[float]:
    """The loop against a `quartet serve tinker` subprocess; per-step wall seconds."""
    import tinker
    from tinker import types
    from transformers import AutoTokenizer

    from quartet.tasks.arithmetic import compute_score

    env = {**os.environ, "QUARTET_TINKER_API_KEY": KEY, "OMP_NUM_THREADS": "1"}
    cmd = [str(QUARTET), "serve", "tinker", "--model", f"tiny={model_dir}", "--port", "0"]
    cmd += ["--torch-threads", "1", "--state-dir", str(work / "tinker_state")]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().split()[3]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            service = tinker.ServiceClient(base_url=url, api_key=KEY)
        trainer = service.create_lora_training_client(
            base_model="tiny", rank=8, seed=s.seed, train_unembed=False
        ).result()
        tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
        prompts = _prompts(parquet, tokenizer, s.steps * s.prompts_per_step)
        params = types.SamplingParams(max_tokens=s.max_new_tokens, temperature=s.temperature)
        adam = types.AdamParams(learning_rate=s.lr)
        seconds = []
        for step in range(s.steps):
            start = time.perf_counter()
            sampler = trainer.save_weights_and_get_sampling_client().result()
            batch = prompts[step * s.prompts_per_step : (step + 1) * s.prompts_per_step]
            futures = [
                sampler.sample(types.ModelInput.from_ints(ids), num_samples=s.n, sampling_params=params)
                for ids, _ in batch
            ]
            data = []
            for (ids, truth), future in zip(batch, futures, strict=True):
                sequences = future.result().sequences
                rewards = [compute_score(tokenizer.decode(seq.tokens), truth) for seq in sequences]
                mean = statistics.fmean(rewards)
                std = statistics.pstdev(rewards)
                for seq, reward in zip(sequences, rewards, strict=True):
                    advantage = (reward - mean) / (std + 1e-6)
                    full = ids + list(seq.tokens)
                    prompt_zeros = [0.0] * (len(ids) - 1)
                    data.append(
                        types.Datum(
                            model_input=types.ModelInput.from_ints(full[:-1]),
                            loss_fn_inputs={
                                "target_tokens": full[1:],
                                "logprobs": prompt_zeros + list(seq.logprobs or []),
                                "advantages": prompt_zeros + [advantage] * len(seq.tokens),
                            },
                        )
                    )
            sampled = time.perf_counter()
            trainer.forward_backward(data, "importance_sampling").result()
            trainer.optim_step(adam).result()
            seconds.append(time.perf_counter() - start)
            print(f"sdk step {step}: {seconds[-1]:.2f} s (sampling {sampled - start:.2f} s)", flush=True)
        return seconds
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(60)


def main() -> None:
    raw_help = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=raw_help)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--n", type=int, default=4)
    parser.add_argument("--max-new", type=int, default=16)
    args = parser.parse_args()
    settings = GrpoSettings(
        steps=args.steps, prompts_per_step=args.prompts, n=args.n, max_new_tokens=args.max_new, lr=1e-4,
        quartet_overrides=(
            "model.lora.rank=8", "model.lora.alpha=8",
            "model.lora.target_modules=[q_proj,k_proj,v_proj,o_proj,gate_proj,up_proj,down_proj]",
        ),
    )  # fmt: skip
    work = Path(tempfile.mkdtemp(prefix="tinker-grpo-"))
    w = prepare(work, "tiny")
    sdk = run_sdk(w.model_dir, w.train_parquet, settings, work)
    quartet = run_quartet(w, settings, work / "quartet", "grpo").step_seconds
    sdk_median, quartet_median = statistics.median(sdk[1:]), statistics.median(quartet[1:])
    summary = {
        "sdk_step_s": sdk_median,
        "quartet_train_step_s": quartet_median,
        "ratio_sdk_over_train": sdk_median / quartet_median,
    }
    print(table(["GRPO step (median, first left out)", "value"], [[k, v] for k, v in summary.items()]))
    raw = {"sdk": spread(sdk) | {"values": sdk}, "quartet": spread(quartet) | {"values": quartet}}
    write_result("tinker_grpo_vs_train", dataclasses.asdict(settings), raw, summary)


if __name__ == "__main__":
    main()
