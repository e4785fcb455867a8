"""GKD's generalised JSD against independent computations on recorded logits: torch.distributions' KL of
categoricals (beta 0.5, the Jensen-Shannon divergence), KL divergences written out in numpy (beta 0, 1 and
in between), the full-vocabulary divergence when the support is the whole vocabulary, finite differences
for the gradient, and the loss term's aggregation over model-written tokens only."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.distributions import Categorical, kl_divergence

from quartet.core.choices import LossAggMode
from quartet.core.gkd import GKD_JSD, generalized_jsd, gkd_loss_term


def recorded(k: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Student and teacher log-probs [3, 5, k] at the teacher's top-k ids of random logits over 13 tokens,
    and their full log-softmax is what the support is cut from."""
    g = torch.Generator().manual_seed(seed)
    student = torch.log_softmax(torch.randn(3, 5, 13, generator=g, dtype=torch.float64), -1)
    teacher = torch.log_softmax(2.0 * torch.randn(3, 5, 13, generator=g, dtype=torch.float64), -1)
    top = teacher.topk(k, dim=-1)
    return student.gather(-1, top.indices), top.values, torch.stack([student, teacher])


def renormalised(logp: np.ndarray) -> np.ndarray:
    p = np.exp(logp - logp.max())
    return p / p.sum()


def kl(p: np.ndarray, q: np.ndarray) -> float:
    return float(np.sum(p * np.log(p / q)))


def by_hand(s: torch.Tensor, t: torch.Tensor, beta: float) -> np.ndarray:
    out = np.zeros(s.shape[:-1])
    for idx in np.ndindex(*s.shape[:-1]):
        q, p = renormalised(s[idx].numpy()), renormalised(t[idx].numpy())
        if beta == 0.0:
            out[idx] = kl(p, q)
        elif beta == 1.0:
            out[idx] = kl(q, p)
        else:
            m = beta * p + (1 - beta) * q
            out[idx] = beta * kl(p, m) + (1 - beta) * kl(q, m)
    return out


@pytest.mark.parametrize("beta", [0.0, 0.25, 0.5, 1.0])
def test_the_divergence_equals_the_sums_by_hand(beta: float) -> None:
    s, t, _ = recorded(k=5)
    got = generalized_jsd(s, t, beta)
    np.testing.assert_allclose(got.numpy(), by_hand(s, t, beta), rtol=1e-5, atol=1e-7)  # float32
    assert (got >= 0).all()


def test_beta_one_half_is_the_jensen_shannon_divergence_of_categoricals() -> None:
    s, t, _ = recorded(k=6, seed=1)
    p = Categorical(logits=t)  # torch renormalises the support's log-probs itself
    q = Categorical(logits=s)
    m = Categorical(probs=(p.probs + q.probs) / 2)
    expected = 0.5 * kl_divergence(p, m) + 0.5 * kl_divergence(q, m)
    torch.testing.assert_close(generalized_jsd(s, t, 0.5), expected.float(), rtol=1e-5, atol=1e-8)


def test_the_whole_vocabulary_as_support_gives_the_full_divergence() -> None:
    s, t, full = recorded(k=13, seed=2)  # the top-13 of 13 tokens: everything, in the teacher's order
    student, teacher = full
    p, q = teacher.exp(), student.exp()
    forward_kl = (p * (teacher - student)).sum(-1)
    torch.testing.assert_close(generalized_jsd(s, t, 0.0), forward_kl.float(), rtol=1e-5, atol=1e-7)
    assert float(generalized_jsd(s, t, 0.5).max()) < float(np.log(2))  # the JS divergence's bound
    assert float(q.sum(-1).min()) == pytest.approx(1.0)


def test_a_student_equal_to_the_teacher_has_zero_divergence() -> None:
    _, t, _ = recorded(k=4, seed=3)
    for beta in (0.0, 0.5, 1.0):
        assert float(generalized_jsd(t.clone(), t, beta).abs().max()) < 1e-6  # float32 rounding of M


def test_the_gradient_matches_finite_differences() -> None:
    s, t, _ = recorded(k=4, seed=4)
    for beta in (0.0, 0.3, 1.0):

        def f(student: torch.Tensor, beta: float = beta) -> torch.Tensor:
            return generalized_jsd(student, t, beta).double()

        # generalized_jsd computes in float32: compare autograd's float32 gradient to float64 differences
        x = s.clone().requires_grad_(True)
        f(x).sum().backward()
        eps, numeric = 1e-4, torch.zeros_like(s)
        for idx in np.ndindex(*s.shape):
            up, down = s.clone(), s.clone()
            up[idx] += eps
            down[idx] -= eps
            numeric[idx] = (f(up).sum() - f(down).sum()) / (2 * eps)
        assert x.grad is not None
        torch.testing.assert_close(x.grad, numeric, atol=2e-3, rtol=1e-2)


def test_the_loss_term_is_the_weighted_mean_over_model_tokens() -> None:
    s, t, _ = recorded(k=5, seed=5)
    mask = torch.tensor([[1, 1, 1, 1, 1], [1, 0, 0, 1, 1], [1, 1, 0, 0, 0]])
    per_token = by_hand(s, t, 0.5)
    expected = sum(per_token[i, j] for i in range(3) for j in range(5) if mask[i, j]) / int(mask.sum())
    out = gkd_loss_term(s, t, mask, 0.5, 2.0, agg_mode=LossAggMode.TOKEN_MEAN)
    assert float(out.loss) == pytest.approx(2.0 * expected, rel=1e-6)
    assert float(out.metrics[GKD_JSD]) == pytest.approx(expected, rel=1e-6)
    s_bad = s.clone()
    s_bad[mask == 0] = 50.0  # masked positions (tool tokens, padding) must not move the loss
    assert float(gkd_loss_term(s_bad, t, mask, 0.5, 2.0).loss) == pytest.approx(float(out.loss), rel=1e-6)


def test_bad_shapes_and_betas_are_refused() -> None:
    s, t, _ = recorded(k=4)
    with pytest.raises(ValueError, match="must have one shape"):
        generalized_jsd(s[..., :3], t, 0.5)
    with pytest.raises(ValueError, match=r"beta must lie in \[0, 1\]"):
        generalized_jsd(s, t, 1.5)
