"""On-policy distillation's advantage against an independent computation: log-probs of sampled tokens
taken from recorded logits of two models (a student and a teacher), the reverse KL per token and its
discounted sum written out as plain Python loops over model-written tokens only."""

from __future__ import annotations

import math

import pytest
import torch

from quartet.core.distill import distill_metrics, reverse_kl_advantages


def recorded(seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Student and teacher log-probs [3, 7] of sampled tokens from random logits over 11 tokens, and a mask
    with environment tokens between two model turns (row 1), padding (row 2)."""
    g = torch.Generator().manual_seed(seed)
    student_logits = torch.randn(3, 7, 11, generator=g)
    teacher_logits = 2.0 * torch.randn(3, 7, 11, generator=g)
    tokens = torch.randint(0, 11, (3, 7), generator=g)
    s = torch.log_softmax(student_logits, -1).gather(-1, tokens[..., None])[..., 0]
    t = torch.log_softmax(teacher_logits, -1).gather(-1, tokens[..., None])[..., 0]
    mask = torch.tensor(
        [[1, 1, 1, 1, 1, 1, 1], [1, 1, 0, 0, 1, 1, 0], [1, 1, 1, 0, 0, 0, 0]], dtype=torch.int64
    )
    return s, t, mask


def by_hand(s: torch.Tensor, t: torch.Tensor, mask: torch.Tensor, gamma: float) -> list[list[float]]:
    out = []
    for i in range(s.shape[0]):
        positions = [k for k in range(s.shape[1]) if mask[i, k]]
        row = [0.0] * s.shape[1]
        for n, k in enumerate(positions):
            later = positions[n:]
            row[k] = -sum(gamma**j * (float(s[i, p]) - float(t[i, p])) for j, p in enumerate(later))
        out.append(row)
    return out


@pytest.mark.parametrize("gamma", [0.0, 0.5, 1.0])
def test_reverse_kl_advantage_equals_the_sum_by_hand(gamma: float) -> None:
    s, t, mask = recorded()
    got = reverse_kl_advantages(s, t, mask, gamma)
    torch.testing.assert_close(got, torch.tensor(by_hand(s, t, mask, gamma)), atol=1e-6, rtol=0)
    assert (got[mask == 0] == 0).all()  # tool/user tokens and padding get no teacher signal


def test_a_teacher_equal_to_the_student_gives_no_signal() -> None:
    s, _, mask = recorded()
    assert (reverse_kl_advantages(s, s.clone(), mask, 0.7) == 0).all()
    assert distill_metrics(s, s.clone(), mask)["distill/reverse_kl"] == 0.0


def test_the_metrics_are_means_over_model_tokens() -> None:
    s, t, mask = recorded(1)
    m = distill_metrics(s, t, mask)
    pairs = [(float(s[i, k]), float(t[i, k])) for i in range(3) for k in range(7) if mask[i, k]]
    assert m["distill/reverse_kl"] == pytest.approx(sum(a - b for a, b in pairs) / len(pairs), abs=1e-6)
    assert m["distill/teacher_logprob"] == pytest.approx(sum(b for _, b in pairs) / len(pairs), abs=1e-6)
    rows = [sum(float(s[i, k] - t[i, k]) for k in range(7) if mask[i, k]) for i in range(3)]
    assert m["distill/seq_reverse_kl"] == pytest.approx(sum(rows) / 3, abs=1e-5)
    assert all(math.isfinite(v) for v in m.values())


def test_bad_shapes_and_discounts_are_refused() -> None:
    s, t, mask = recorded()
    with pytest.raises(ValueError, match="must have one shape"):
        reverse_kl_advantages(s, t[:, :5], mask)
    with pytest.raises(ValueError, match=r"discount must lie in \[0, 1\]"):
        reverse_kl_advantages(s, t, mask, 1.5)
