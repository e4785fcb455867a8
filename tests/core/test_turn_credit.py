"""Turn-level credit (quartet.core.turn_credit) against a plain-Python computation written from the
formula in its docstring, and the trainer step that adds it to the outcome advantage."""

from __future__ import annotations

import random
import statistics
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from quartet.config import load_config
from quartet.core.advantages import compute_grpo
from quartet.core.batch import Batch
from quartet.core.turn_credit import turn_index, turn_level_advantages, turn_returns
from quartet.trainer.loop.step import StepRunner


def _hand_turns(mask: list[int]) -> list[tuple[int, int]]:
    """(start, stop) of each run of 1s."""
    out, t = [], 0
    while t < len(mask):
        if mask[t]:
            start = t
            while t < len(mask) and mask[t]:
                t += 1
            out.append((start, t))
        else:
            t += 1
    return out


def _hand_advantages(
    rewards: list[list[float]], masks: list[list[int]], uids: list[str], gamma: float, norm: bool
) -> list[list[float]]:
    returns: list[list[float]] = []
    for r, m in zip(rewards, masks, strict=True):
        per_turn = [sum(r[a:b]) for a, b in _hand_turns(m)]
        g, acc = [0.0] * len(per_turn), 0.0
        for k in reversed(range(len(per_turn))):
            acc = per_turn[k] + gamma * acc
            g[k] = acc
        returns.append(g)
    out = [[0.0] * len(m) for m in masks]
    for uid in set(uids):
        rows = [i for i, u in enumerate(uids) if u == uid]
        values = [x for i in rows for x in returns[i]]
        if len(values) < 2:
            continue
        mean, std = statistics.fmean(values), statistics.stdev(values)
        for i in rows:
            for k, (a, b) in enumerate(_hand_turns(masks[i])):
                adv = (returns[i][k] - mean) / (std + 1e-6) if norm else returns[i][k] - mean
                for t in range(a, b):
                    out[i][t] = adv
    return out


def _random_case(seed: int, rows: int = 9, width: int = 14) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    rng = random.Random(seed)
    masks, rewards = [], []
    for _ in range(rows):
        m = [int(rng.random() < 0.6) for _ in range(width)]
        if rng.random() < 0.3:  # right padding
            cut = rng.randrange(width)
            m[cut:] = [0] * (width - cut)
        masks.append(m)
        rewards.append([rng.choice([0.0, 0.0, 0.5, 1.0, -0.25]) for _ in range(width)])  # env tokens too
    uids = [rng.choice("abc") for _ in range(rows)] + ["lone"]
    masks.append([0, 1, 1, 0] + [0] * (width - 4))  # a group with a single turn: no baseline, 0
    rewards.append([0.0, 0.0, 3.0, 0.0] + [0.0] * (width - 4))
    return torch.tensor(rewards), torch.tensor(masks), uids


def test_turn_index_numbers_the_runs_of_model_tokens() -> None:
    mask = torch.tensor([[1, 1, 0, 0, 1, 0, 1, 1, 0], [0, 0, 1, 0, 0, 0, 0, 0, 0]])
    assert turn_index(mask).tolist() == [[0, 0, -1, -1, 1, -1, 2, 2, -1], [-1, -1, 0, -1, -1, -1, -1, -1, -1]]


def test_turn_returns_discount_later_turns() -> None:
    mask = torch.tensor([[1, 1, 0, 1, 0, 1, 0]])
    rewards = torch.tensor([[0.0, 1.0, 9.0, 0.5, 9.0, 2.0, 9.0]])  # 9s on environment tokens: ignored
    returns, valid = turn_returns(rewards, mask, gamma=0.5)
    assert returns.tolist() == [[1.0 + 0.5 * (0.5 + 0.5 * 2.0), 0.5 + 0.5 * 2.0, 2.0]]
    assert valid.tolist() == [[True, True, True]]


@pytest.mark.parametrize("gamma", [1.0, 0.9])
@pytest.mark.parametrize("norm", [True, False])
@pytest.mark.parametrize("seed", range(4))
def test_turn_level_advantages_match_the_hand_computation(seed: int, gamma: float, norm: bool) -> None:
    rewards, masks, uids = _random_case(seed)
    got = turn_level_advantages(rewards, masks, np.array(uids, dtype=object), gamma=gamma, norm_by_std=norm)
    want = _hand_advantages(rewards.tolist(), masks.tolist(), uids, gamma, norm)
    assert torch.allclose(got, torch.tensor(want, dtype=torch.float32), atol=1e-5)
    assert got[-1].abs().sum() == 0  # the lone turn


def test_the_step_adds_the_turn_term_to_grpo_and_leaves_it_alone_at_coefficient_zero() -> None:
    rewards, masks, uids = _random_case(11)
    scores = torch.zeros_like(rewards)
    last = masks.shape[1] - 1 - torch.flip(masks, dims=[1]).argmax(dim=1)
    scores[torch.arange(len(masks)), last] = torch.tensor([float(i % 3 == 0) for i in range(len(masks))])
    batch = Batch(
        {"token_level_scores": scores * masks, "response_mask": masks, "turn_rewards": rewards},
        {"uid": np.array(uids, dtype=object)},
    )
    outcome = compute_grpo(scores * masks, masks, np.array(uids, dtype=object)).advantages
    turn = turn_level_advantages(rewards, masks, np.array(uids, dtype=object), gamma=0.9)
    for coef in (0.0, 0.5):
        cfg = load_config(
            None,
            [
                "rollout.multi_turn.enable=true",
                f"algorithm.turn_reward_coef={coef}",
                "algorithm.turn_gamma=0.9",
            ],
        )
        workers = SimpleNamespace(plan=SimpleNamespace(kl_in_reward=False))  # no roles: advantages only
        runner = StepRunner(cfg, workers, None, None)  # type: ignore[arg-type]
        out, metrics = runner._advantages(batch)
        assert torch.allclose(out["advantages"], outcome + coef * turn, atol=1e-6)
        assert torch.equal(out["returns"], out["advantages"])
        assert ("critic/turn_advantages/abs_mean" in metrics) == (coef > 0)
