"""RL batches for the role tests: left-padded prompts, right-padded responses, random advantages."""

from __future__ import annotations

import torch

from quartet.cluster.colocate import HostSet, RoleSpec
from quartet.cluster.naming import RunNames
from quartet.cluster.runtime import launch
from quartet.config import Backend, ClusterConfig
from quartet.core.batch import Batch, BatchMeta


def rl_batch(rows: int, prompt_len: int = 6, response_len: int = 5, seed: int = 0, vocab: int = 500) -> Batch:
    """`rows` samples with prompt and response lengths varying by row (padding on both sides)."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(10, vocab, (rows, prompt_len), generator=g)
    responses = torch.randint(10, vocab, (rows, response_len), generator=g)
    prompt_mask = torch.ones(rows, prompt_len, dtype=torch.long)
    response_mask = torch.ones(rows, response_len, dtype=torch.long)
    for i in range(rows):
        p_pad, r_len = i % 3, response_len - (i % 2) * 2
        prompt_mask[i, :p_pad] = 0
        prompts[i, :p_pad] = 0
        response_mask[i, r_len:] = 0
        responses[i, r_len:] = 0
    return Batch(
        {
            "prompts": prompts,
            "responses": responses,
            "attention_mask": torch.cat([prompt_mask, response_mask], dim=1),
            "response_mask": response_mask,
            "advantages": torch.randn(rows, response_len, generator=g) * response_mask,
        },
        {"uid": [f"p{i // 4}" for i in range(rows)]},
        meta=BatchMeta(temperature=1.0),
    )


def local(**roles: RoleSpec) -> HostSet:
    """The roles on the local backend (one rank, in this process)."""
    return launch(ClusterConfig(backend=Backend.LOCAL), RunNames("roles", "local"), **roles)
