"""Sequence parallelism beyond the packed policy, on gloo, against one process holding every row (float32):

- the policy configured with `remove_padding: false` (the engine packs under SP), compared with the padded
  path of one process: log-probs, entropy, and the gradients and loss of its PPO + entropy loss under EVERY
  `LossAggMode` (the per-sequence modes need whole rows: the gather gives every rank of a group the rows'
  full outputs);
- the critic: values, and the gradients and loss of the clipped value loss under every mode, then one real
  optimizer step (parameters, gradient norm);
- at sp = 2 (world 2) and dp 2 x sp 2 (world 4, two of the modes), within 1e-5;
- mutants (sp = 2): an all-to-all that exchanges nothing, one that puts the received chunks in reverse rank
  order, a gather whose backward sums the group's gradients instead of keeping its slice, and counts summed
  over the whole world instead of "dp": each makes the same comparison fail.

One spawned run per layout holds every case (`sp_cases_worker.run_cases`).
"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.multiprocessing as mp
from sp_cases_worker import (
    MICRO,
    MODES,
    MUTANTS,
    critic_engine,
    forward,
    full_batch,
    policy_engine,
    run_cases,
    step_gradients,
    value_loss,
)
from sp_cases_worker import policy_loss as policy_loss_fn

from quartet.engines.hf_modules import hf_model


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


# The four-rank run (the slowest) covers a per-token and a per-sequence mode; the two-rank run every mode.
DP2_MODES = ["token-mean", "seq-mean-token-mean"]


def _spawn(
    world: int, dirs: dict[str, str], out: Path, mutants: bool, modes: list[str]
) -> list[dict[str, Any]]:
    args = (world, 2, _free_port(), dirs, str(out), mutants, modes)
    mp.spawn(run_cases, args=args, nprocs=world, join=True)
    return [torch.load(out / f"rank{r}.pt") for r in range(world)]


@pytest.fixture(scope="module")
def dirs(tiny_model_dir: Path, value_model_dir: Path) -> dict[str, str]:
    return {"policy": str(tiny_model_dir), "value": str(value_model_dir)}


@pytest.fixture(scope="module")
def sp2(dirs: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _spawn(2, dirs, tmp_path_factory.mktemp("sp2cases"), mutants=True, modes=MODES)


@pytest.fixture(scope="module")
def dp2_sp2(dirs: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return _spawn(4, dirs, tmp_path_factory.mktemp("dp2sp2cases"), mutants=False, modes=DP2_MODES)


@pytest.fixture(scope="module")
def reference(dirs: dict[str, str]) -> dict[str, Any]:
    """The same cases on one process: the policy on the padded path, the critic padded."""
    batch = full_batch()
    policy, critic = policy_engine(dirs["policy"], 1), critic_engine(dirs["value"], 1)
    assert not policy.spec.packs and not critic.spec.packs
    want: dict[str, Any] = {"policy-fwd": forward(policy, batch), "critic-fwd": forward(critic, batch)}
    for mode in MODES:
        grads, loss = step_gradients(policy, batch, policy_loss_fn(mode))
        want[f"policy-{mode}"] = {"grads": grads, "loss": loss}
        grads, loss = step_gradients(critic, batch, value_loss(mode))
        want[f"critic-{mode}"] = {"grads": grads, "loss": loss}
    metrics = critic.train_step(batch, value_loss(MODES[0]), MICRO)
    params = {k: v.detach().clone() for k, v in hf_model(critic.module).state_dict().items()}
    want["critic-step"] = {"params": params, "grad_norm": metrics["grad_norm"], "loss": metrics["loss"]}
    return want


def _check_forward(ranks: list[dict[str, Any]], key: str, want: dict[str, torch.Tensor]) -> None:
    for name, value in want.items():
        got = torch.cat([r[key][name] for r in ranks])  # each rank: its own rows, in rank order
        torch.testing.assert_close(got, value, atol=1e-5, rtol=0, msg=f"{key} {name}")


def _check_gradients(got: dict[str, Any], want: dict[str, Any], case: str) -> None:
    assert set(got["grads"]) == set(want["grads"]), case
    assert max(float(g.abs().max()) for g in want["grads"].values()) > 1e-3  # gradients worth comparing
    for name, grad in want["grads"].items():
        torch.testing.assert_close(got["grads"][name], grad, atol=1e-5, rtol=1e-5, msg=f"{case} {name}")
    assert got["loss"] == pytest.approx(want["loss"], rel=1e-5, abs=1e-7), case


def _check_all(ranks: list[dict[str, Any]], want: dict[str, Any], modes: list[str]) -> None:
    _check_forward(ranks, "policy-fwd", want["policy-fwd"])
    _check_forward(ranks, "critic-fwd", want["critic-fwd"])
    for mode in modes:
        for role in ("policy", "critic"):
            _check_gradients(ranks[0][f"{role}-{mode}"], want[f"{role}-{mode}"], f"{role} {mode}")
    got, step = ranks[0]["critic-step"], want["critic-step"]
    assert got["grad_norm"] == pytest.approx(step["grad_norm"], rel=1e-5)
    assert got["loss"] == pytest.approx(step["loss"], rel=1e-5)
    for name, value in step["params"].items():
        torch.testing.assert_close(got["params"][name], value, atol=1e-6, rtol=1e-5, msg=name)


# one two-rank run of every case (~1 min under load); not `slow`: issue 36 asks for it in CI
def test_sp2_cases_equal_one_process(sp2: list[dict[str, Any]], reference: dict[str, Any]) -> None:
    _check_all(sp2, reference, MODES)


@pytest.mark.slow  # one four-rank run (~25 s): CI has dp2 x sp2 in test_ulysses_dist.py
def test_dp2_sp2_cases_equal_one_process(dp2_sp2: list[dict[str, Any]], reference: dict[str, Any]) -> None:
    _check_all(dp2_sp2, reference, DP2_MODES)


@pytest.mark.parametrize("name", MUTANTS)
def test_a_defect_fails_the_comparison(
    sp2: list[dict[str, Any]], reference: dict[str, Any], name: str
) -> None:
    key = f"mutant-{name}"
    forwards = [{"policy-fwd": r[key]["fwd"]} for r in sp2]
    with pytest.raises(AssertionError):
        _check_forward(forwards, "policy-fwd", reference["policy-fwd"])
        _check_gradients(sp2[0][key], reference["policy-token-mean"], name)
