"""Per-token quantities at response positions, from the model's outputs.

Alignment. For a sequence x_0 .. x_{T-1} whose last R' positions are response tokens (so response token t
sits at position T - R' + t), the causal LM's logits at position i predict x_{i+1}; hence

    logprob[t] = log softmax(logits[T - R' - 1 + t] / temperature)[x_{T - R' + t}],   t = 0 .. R'-1

i.e. logits at positions P-1 .. P+R'-2 in untrimmed coordinates. Values use the same positions: value[t]
is the critic's estimate of the state BEFORE response token t is written (the hidden state at the
position whose logits choose token t), as in verl (`values[:, P-1 : P+R-1]`) and OpenRLHF.

Precision. Log-probs are computed in float32 whatever the autocast dtype: half-precision logits are
upcast before the temperature division, and the log-softmax is log p = z - logsumexp(z), evaluated over
chunks of positions so the float32 copies of [b, R', V] logits never all exist at once (only without
gradients; with gradients autograd keeps each chunk's inputs anyway).
"""

from __future__ import annotations

import torch

from quartet.core.entropy import entropy_from_logits

__all__ = ["last_valid_index", "response_entropy", "response_logprobs", "response_values"]

_CHUNK = 1024  # positions per chunk of the log-softmax


def response_logprobs(
    logits: torch.Tensor, targets: torch.Tensor, temperature: float, chunk: int = _CHUNK
) -> torch.Tensor:
    """Log-probs of `targets` under softmax(logits / temperature), in float32.

    Args:
        logits: [b, R', V] logits that predict the R' response tokens (already shifted: see module doc).
        targets: [b, R'] token ids.
        temperature: > 0.

    Returns:
        [b, R'] float32.
    """
    if temperature <= 0:
        raise ValueError(f"temperature must be > 0, got {temperature}")
    b, r, v = logits.shape
    flat, flat_targets = logits.reshape(b * r, v), targets.reshape(b * r, 1)
    out = []
    for rows, tgt in zip(torch.split(flat, chunk), torch.split(flat_targets, chunk), strict=True):
        z = rows.float() / temperature
        out.append(z.gather(-1, tgt).squeeze(-1) - torch.logsumexp(z, dim=-1))
    return torch.cat(out).reshape(b, r) if out else logits.new_zeros(b, r, dtype=torch.float32)


def response_entropy(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    """[b, R'] float32 entropy of softmax(logits / temperature) (chunked and stable: `core.entropy`)."""
    return entropy_from_logits(logits.float() / temperature).float()


def response_values(token_values: torch.Tensor, response_width: int) -> torch.Tensor:
    """[b, T] per-position values -> [b, R'] values of the states before each response token (float32)."""
    t = token_values.shape[1]
    return token_values[:, t - response_width - 1 : t - 1].float()


def last_valid_index(attention_mask: torch.Tensor) -> torch.Tensor:
    """[b] index of the last attended position of each row of a [b, T] mask (0 for an empty row)."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (positions * (attention_mask != 0)).argmax(dim=-1)
