"""tinker-cookbook's own train entry points against `quartet serve tinker` (issue 51, "the real cookbook").

A real `TinkerServer` on a local port serves the tiny model; the scripts of `examples/tinker_cookbook/` run
in a subprocess and call the cookbook's `supervised.train`, `rl.train` and `distillation.train_on_policy`
`main(config)` unchanged, on local data, offline. What is checked comes from the recipe's own
`metrics.jsonl`: SL's first loss equals the base model's computed here from its logits and the tokenizer's
own chat template (so the renderer the scripts pick writes the model's format), and it falls; RL's reward
rises; distillation's reverse KL to its teacher falls (both on a sharpened tiny model, `_sharpen`).

A recipe that needs a call the service does not serve yet is skipped, naming the call: the tests make the
recipes' first calls through the SDK and read the service's "... is not served yet", so they turn on by
themselves when the calls land. Skipped as a whole where the cookbook is not installed (`make install`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

tinker = pytest.importorskip("tinker", reason="the tinker extra is not installed: make install-tinker")
pytest.importorskip("tinker_cookbook", reason="tinker-cookbook is not installed: make install-tinker")
from tinker import types  # noqa: E402

from quartet.serving.tinker.server import TinkerServer  # noqa: E402

KEY = "tml-quartet-cookbook-key"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "tinker_cookbook"
RECIPE_TIMEOUT_S = 240


def _sharpen(model_dir: Path, folder: Path, factor: float = 5.0) -> None:
    """Save to `folder` (once) the tiny model with its (tied) embedding `factor` times larger.

    The tiny model's output head is its input embedding (std 0.02), which LoRA never changes; with the
    final norm fixed, no adapter can give the digits more than 3% of a token's probability there, so an RL
    reward on them could hardly rise. Five times larger, it can (examples/tinker_cookbook/rl_local.py)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if (folder / "config.json").exists():
        return
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True)
    with torch.no_grad():
        model.get_input_embeddings().weight.mul_(factor)
    model.save_pretrained(folder)
    AutoTokenizer.from_pretrained(model_dir, local_files_only=True).save_pretrained(folder)


def _teach(student_dir: Path, folder: Path, steps: int = 4, lr: float = 1e-2) -> None:
    """Save to `folder` a teacher: the student's base model, all weights trained `steps` Adam steps on
    "What is a + b?" -> "The answer is a+b." (every token in the loss).

    A teacher this close leaves a reverse KL of ~1.7-1.9 nats per token at the start that a LoRA student
    closes to ~0.25-0.3 in 10 steps (3 seeds, measured with torch directly); one trained 40 steps starts at
    ~8.7 and moves little in 15."""
    import random

    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(student_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(student_dir, local_files_only=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    rng = random.Random(0)
    for _ in range(steps):
        a, b = rng.randint(0, 9), rng.randint(0, 9)
        chat = [{"role": "user", "content": f"What is {a} + {b}?"}]
        chat.append({"role": "assistant", "content": f"The answer is {a + b}."})
        ids = tokenizer.apply_chat_template(chat, return_tensors="pt", return_dict=False)
        loss = model(ids, labels=ids).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)


@pytest.fixture(scope="module")
def sharp_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder served as "tiny-sharp": empty until a test that uses it fills it (`_sharpen`)."""
    return tmp_path_factory.mktemp("sharp")


@pytest.fixture(scope="module")
def teacher_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The folder served as "tiny-teacher": empty until the distillation test fills it (`_teach`)."""
    return tmp_path_factory.mktemp("teacher")


@pytest.fixture(scope="module")
def service(tiny_model_dir: Path, sharp_dir: Path, teacher_dir: Path) -> Iterator[str]:
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # the service shares 2 cores with the recipe's process
    models = {"tiny": tiny_model_dir, "tiny-sharp": sharp_dir, "tiny-teacher": teacher_dir}
    server = TinkerServer(models, api_key=KEY)
    try:
        yield server.start_in_thread()
    finally:
        server.stop_thread()
        torch.set_num_threads(threads)


def _not_served(url: str, calls: list[str]) -> list[str]:
    """Those of `calls` the service answers with its 404 "... is not served yet"."""
    missing = []
    for call in calls:
        answer = httpx.post(f"{url}/api/v1/{call}", json={}, headers={"X-API-Key": KEY}, timeout=30)
        if answer.status_code == 404 and "is not served yet" in answer.text:
            missing.append(call)
    return missing


def _what_sampling_lacks(url: str, teacher: bool) -> str | None:
    """Make through the SDK, on one tiny model, the calls rl.train and train_on_policy make before their
    first step: a sampler of the training model's current weights (`save_weights_and_get_sampling_client`,
    then `sample` and `compute_logprobs`), `forward_backward` with `importance_sampling`, and for
    distillation a sampler of a base model (`create_sampling_client(base_model=...)`). The service's message
    for the first it refuses as not served yet (it names the call); None when all are served. Any other
    failure fails the test."""
    prompt = types.ModelInput.from_ints([4, 5, 6])
    inputs = {"target_tokens": [5, 6], "logprobs": [-1.0, -1.0], "advantages": [1.0, -1.0]}
    datum = types.Datum(model_input=types.ModelInput.from_ints([4, 5]), loss_fn_inputs=inputs)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        client = tinker.ServiceClient(base_url=url, api_key=KEY)
        try:
            trainer = client.create_lora_training_client(base_model="tiny", rank=2).result()
            samplers = [trainer.save_weights_and_get_sampling_client().result()]
            if teacher:
                samplers.append(client.create_sampling_client(base_model="tiny").result())
            for sampler in samplers:
                params = types.SamplingParams(max_tokens=2)
                sampler.sample(prompt, num_samples=1, sampling_params=params).result()
                sampler.compute_logprobs(prompt).result()
            trainer.forward_backward([datum], "importance_sampling").result()
        except Exception as err:
            if "not served yet" in str(err):
                return str(err)
            raise
    return None


def _run_recipe(
    script: str, url: str, model_dir: Path, log_path: Path, *extra: str, model: str = "tiny"
) -> Any:
    """Run `examples/tinker_cookbook/<script>` against the service; its stdout and stderr in one text."""
    env = {**os.environ, "TINKER_API_KEY": KEY, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    args = ["--base-url", url, "--model-name", model, "--tokenizer", str(model_dir)]
    args += ["--log-path", str(log_path)]
    return subprocess.run(
        [sys.executable, str(EXAMPLES / script), *args, *extra],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=RECIPE_TIMEOUT_S,
        check=False,
    )


def _metrics(log_path: Path) -> list[dict[str, Any]]:
    """The recipe's per-step rows of `metrics.jsonl`, in step order."""
    rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line]
    return sorted((r for r in rows if "step" in r), key=lambda r: r["step"])


def _template_reference(model_dir: Path, conversations: Path) -> tuple[int, float]:
    """What the recipe's first step must report, computed here from the tokenizer's own chat template and
    the base model's logits (a LoRA adapter starts as the identity): the input tokens of all the
    conversations, and the mean over conversations of the mean NLL of their assistant tokens.

    The template ends every message with `<|im_end|>\\n`; a supervised datum stops at the last `<|im_end|>`,
    its input is one token shorter (the next-token shift), and its loss tokens are the assistant's text
    and its `<|im_end|>` (the cookbook's default `ALL_ASSISTANT_MESSAGES`, weights averaged per example)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(model_dir, local_files_only=True).float().eval()
    newline = tokenizer.encode("\n", add_special_tokens=False)
    tokens, nlls = 0, []
    for line in conversations.read_text().splitlines():
        chat = json.loads(line)["messages"]
        ids = tokenizer.apply_chat_template(chat, tokenize=True, return_dict=False)
        prompt = tokenizer.apply_chat_template(chat[:1], add_generation_prompt=True, return_dict=False)
        assert ids[-len(newline) :] == newline and ids[: len(prompt)] == prompt
        ids = torch.tensor(ids[: -len(newline)])
        tokens += len(ids) - 1
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids[None, :-1]).logits[0].float(), -1)
        picked = logprobs.gather(1, ids[1:, None])[:, 0]
        nlls.append(-float(picked[len(prompt) - 1 :].mean()))
    return tokens, sum(nlls) / len(nlls)


def _assert_ended_well(run: Any, url: str) -> None:
    """The recipes always end with a checkpoint (`save_state` and `save_weights_for_sampler`): where the
    service serves both, the run must exit 0; else its one failure must be the 404 of one of them."""
    missing = _not_served(url, ["save_weights", "save_weights_for_sampler"])
    if not missing:
        assert run.returncode == 0, run.stdout[-3000:]
        return
    errors = [line for line in run.stdout.splitlines() if re.match(r"[\w.]+(Error|Exception): ", line)]
    assert run.returncode != 0 and errors, run.stdout[-3000:]
    assert errors[-1].startswith("tinker.NotFoundError") and "is not served yet" in errors[-1], errors
    assert any(f"/api/v1/{call} " in errors[-1] for call in missing), errors


def test_sl_recipe_learns_on_the_service(service: str, tiny_model_dir: Path, tmp_path: Path) -> None:
    """~11-20 s: supervised.train, 8 conversations in one batch, 12 epochs (12 steps, each over the whole
    set, so the curve has no sampling noise): the first loss is the base model's, computed here; it falls."""
    log_path = tmp_path / "sl"
    shape = ("--conversations", "8", "--batch-size", "8", "--epochs", "12")
    run = _run_recipe("sl_local.py", service, tiny_model_dir, log_path, *shape)
    rows = [r for r in _metrics(log_path) if "train_mean_nll" in r]
    nll = [r["train_mean_nll"] for r in rows]
    assert [r["step"] for r in rows] == list(range(12)), run.stdout[-3000:]
    tokens, base_nll = _template_reference(tiny_model_dir, log_path.with_name("sl.conversations.jsonl"))
    assert all(r["num_tokens"] == tokens for r in rows)
    assert nll[0] == pytest.approx(base_nll, rel=1e-4)
    # measured: 6.20 -> 5.44, falling at every step; with lr 0 every step scores the same
    assert nll[-1] < nll[0] - 0.3, nll
    _assert_ended_well(run, service)


@pytest.mark.slow
def test_rl_recipe_reward_rises_on_the_service(
    service: str, tiny_model_dir: Path, sharp_dir: Path, tmp_path: Path
) -> None:
    """rl.train on the "digits" task (reward 1 when the answer holds a digit), 10 steps of 4 groups of 8
    on the sharpened tiny model: the mean reward rises. Slow: 19 s in a trial merge with the checkpoint,
    sampling and loss branches (reward 0.03 -> 0.94; docs/tinker.md)."""
    lacking = _what_sampling_lacks(service, teacher=False)
    if lacking:
        pytest.skip(f"rl.train needs {lacking}")
    _sharpen(tiny_model_dir, sharp_dir)
    log_path = tmp_path / "rl"
    run = _run_recipe("rl_local.py", service, sharp_dir, log_path, "--steps", "10", model="tiny-sharp")
    _assert_ended_well(run, service)
    rewards = [r["env/all/reward/total"] for r in _metrics(log_path) if "env/all/reward/total" in r]
    assert len(rewards) == 10, run.stdout[-3000:]
    # measured with torch directly (4 seeds): ~0.05 over the first 3 steps, 0.5-0.95 over the last 3
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3 + 0.2, rewards


@pytest.mark.slow
def test_on_policy_distillation_closes_the_gap_to_the_teacher(
    service: str, tiny_model_dir: Path, sharp_dir: Path, teacher_dir: Path, tmp_path: Path
) -> None:
    """distillation.train_on_policy: the student (LoRA on "tiny-sharp") samples, the teacher (its base
    model briefly trained on sums) scores the samples, and the reverse KL per token falls. Slow: 16 s in
    the same trial (teacher_kl 2.32 -> 0.23-0.31)."""
    lacking = _what_sampling_lacks(service, teacher=True)
    if lacking:
        pytest.skip(f"train_on_policy needs {lacking}")
    _sharpen(tiny_model_dir, sharp_dir)
    _teach(sharp_dir, teacher_dir)
    log_path = tmp_path / "distill"
    extra = ("--teacher", "tiny-teacher", "--steps", "10")
    run = _run_recipe("distill_local.py", service, sharp_dir, log_path, *extra, model="tiny-sharp")
    _assert_ended_well(run, service)
    kl = [r["teacher_kl"] for r in _metrics(log_path) if "teacher_kl" in r]
    assert len(kl) == 10, run.stdout[-3000:]
    # measured with torch directly (3 seeds): ~1.7-1.9 at the start, ~0.25-0.35 over the last 3 steps
    assert sum(kl[-3:]) / 3 < 0.6 * sum(kl[:3]) / 3, kl
