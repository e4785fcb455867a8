"""Two models that must read the same token ids (a student and its teacher) have one tokenizer: the same
vocabulary (every token string with the same id) and the same special tokens. Checked on the driver before
any worker starts, so a teacher with another tokenizer is refused naming both folders, instead of scoring
the student's ids as other words."""

from __future__ import annotations

from typing import Any

from quartet.models.loading import load_tokenizer

__all__ = ["TokenizerMismatch", "check_same_tokenizer", "tokenizer_differences"]


class TokenizerMismatch(ValueError):
    """Two models that must share token ids do not."""


def tokenizer_differences(a: Any, b: Any, limit: int = 3) -> list[str]:
    """What differs between tokenizers `a` and `b` (empty: the same ids mean the same tokens), at most
    `limit` examples of differing tokens."""
    out: list[str] = []
    va, vb = dict(a.get_vocab()), dict(b.get_vocab())
    if len(va) != len(vb):
        out.append(f"vocabulary sizes {len(va)} and {len(vb)}")
    moved = [tok for tok, i in va.items() if vb.get(tok) != i]
    if moved:
        shown = ", ".join(f"{t!r}: {va[t]} vs {vb.get(t)}" for t in sorted(moved, key=va.__getitem__)[:limit])
        out.append(f"{len(moved)} tokens with other ids ({shown})")
    for name in ("eos_token", "bos_token", "pad_token"):
        if getattr(a, name, None) != getattr(b, name, None):
            out.append(f"{name} {getattr(a, name, None)!r} vs {getattr(b, name, None)!r}")
    return out


def check_same_tokenizer(first: str, second: str, first_role: str, second_role: str) -> None:
    """`TokenizerMismatch` naming both folders and what differs, unless the tokenizers of the two local
    folders are the same."""
    differences = tokenizer_differences(load_tokenizer(first), load_tokenizer(second))
    if differences:
        raise TokenizerMismatch(
            f"the {second_role} ({second}) and the {first_role} ({first}) have different tokenizers: "
            f"{'; '.join(differences)}. The {second_role} scores the {first_role}'s token ids, so they must "
            f"mean the same text: pick a {second_role} of the same family (same tokenizer)"
        )
