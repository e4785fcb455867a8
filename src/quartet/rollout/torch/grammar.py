"""Constrained decoding: a per-sequence token mask from an llguidance grammar (`SamplingParams.grammar`).

Each sample of a constrained request owns an `llguidance.LLMatcher`, the grammar's parser state. Before
sampling, the rows of constrained sequences get their forbidden tokens set to -inf (the matcher computes a
bitmask of the allowed ones on the CPU; it is unpacked on the logits' device); after sampling, the matcher
consumes the token. When the grammar is complete (nothing but the end may follow) the sequence ends with
finish reason "stop" and no stop reason, without an end-of-sequence token. The sequence's stop ids
(end-of-sequence ids, `stop_token_ids`) are allowed exactly where the grammar may end, so a grammar with
optional tails (`[0-9]+`) can still stop early. Other rows of the batch are untouched, and a batch without a
constrained sequence does no work here (one `any()` over the rows per step).

The mask is applied to the logits the engine samples from, after penalties and outside any CUDA graph (graphs
only run the forward), so compiled decode paths need no eager fallback. Log-probs and `top_logprobs` are
those of the masked distribution (see `quartet.rollout.types`).

llguidance was chosen over hand-written masks and other libraries: it compiles JSON schemas and Lark
grammars, builds its token trie from a Hugging Face fast tokenizer, needs no GPU kernels and is small.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import torch

from quartet.rollout.invalid_request import InvalidRequestError
from quartet.rollout.torch.sequence import SequenceState

if TYPE_CHECKING:
    from llguidance import LLMatcher, LLTokenizer

__all__ = ["GrammarCompiler", "advance_grammar", "apply_grammar_masks", "any_constrained"]

_CACHE = 64
"""Compiled grammars kept per engine (agents repeat the same schema): a fresh matcher is a deep copy."""


class GrammarCompiler:
    """Matchers of grammars for one tokenizer (its llguidance token trie is built on first use)."""

    def __init__(self, tokenizer: Any, vocab_size: int) -> None:
        """tokenizer: a Hugging Face fast tokenizer; vocab_size: the width of the model's logits."""
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self._ll: LLTokenizer | None = None
        self._compiled: OrderedDict[str, LLMatcher] = OrderedDict()
        self._lock = threading.Lock()

    def _lltokenizer(self) -> LLTokenizer:
        if self._ll is None:
            import llguidance.hf

            try:
                n_vocab = max(self.vocab_size, len(self.tokenizer))
                self._ll = llguidance.hf.from_tokenizer(self.tokenizer, n_vocab=n_vocab)
            except Exception as exc:
                raise InvalidRequestError(
                    "grammar", f"constrained decoding needs a Hugging Face fast tokenizer: {exc}"
                ) from None
        return self._ll

    def matcher(self, grammar: str) -> LLMatcher:
        """A fresh matcher of `grammar`; InvalidRequestError (field "grammar") when it does not compile."""
        from llguidance import LLMatcher

        with self._lock:
            compiled = self._compiled.get(grammar)
            if compiled is None:
                compiled = LLMatcher(self._lltokenizer(), grammar, log_level=0)
                if compiled.is_error():
                    error = compiled.get_error()
                    raise InvalidRequestError("grammar", f"the grammar does not compile: {error}")
                self._compiled[grammar] = compiled
                if len(self._compiled) > _CACHE:
                    self._compiled.popitem(last=False)
            else:
                self._compiled.move_to_end(grammar)
            return compiled.deep_copy()


def any_constrained(seqs: Sequence[SequenceState]) -> bool:
    """True when at least one of `seqs` decodes under a grammar."""
    return any(s.matcher is not None for s in seqs)


def _allowed(words: torch.Tensor, vocab: int) -> torch.Tensor:
    """Bool [R, vocab] of the bitmask words [R, W] int32 (token t is bit t % 32 of word t // 32)."""
    shifts = torch.arange(32, device=words.device, dtype=torch.int32)
    bits = (words.unsqueeze(-1) >> shifts) & 1
    return bits.reshape(words.shape[0], -1)[:, :vocab].bool()


def apply_grammar_masks(logits: torch.Tensor, seqs: Sequence[SequenceState]) -> torch.Tensor:
    """Logits [A, V] with each constrained row's forbidden tokens at -inf (a new tensor; row i = seqs[i]).

    A row's stop ids are allowed exactly when its grammar may end here.
    """
    rows = [i for i, s in enumerate(seqs) if s.matcher is not None]
    vocab = logits.shape[-1]
    words = []
    for i in rows:
        raw = seqs[i].matcher.compute_bitmask()
        words.append(torch.frombuffer(bytearray(raw), dtype=torch.int32))
    allowed = _allowed(torch.stack(words).to(logits.device), vocab)
    for r, i in enumerate(rows):
        seq = seqs[i]
        stops = [t for t in seq.stop_ids if 0 <= t < vocab]
        if stops:
            allowed[r, torch.tensor(stops, device=logits.device)] = bool(seq.matcher.is_accepting())
    index = torch.tensor(rows, device=logits.device)
    out = logits.clone()
    out[index] = out[index].masked_fill(~allowed, float("-inf"))
    return out


def advance_grammar(seq: SequenceState) -> bool:
    """Feed `seq`'s newest token to its matcher; True when the grammar is now complete.

    Raises RuntimeError when the matcher refuses the token (the mask allowed it: a bug or a parser limit).
    """
    matcher = seq.matcher
    assert matcher is not None
    token = seq.token_ids[-1]
    if token in seq.stop_ids and matcher.is_accepting():  # a stop id where the grammar may end
        return True
    if not matcher.consume_token(token):
        raise RuntimeError(f"the grammar refused token {token}: {matcher.get_error()[:500]}")
    return bool(matcher.is_stopped())
