"""A remote teacher of on-policy distillation: an OpenAI-compatible server that scores given tokens.

The local teacher role (`quartet.roles.teacher`) runs a model in the trainer's processes; this one asks a
server (`teacher.url`) instead, on the driver. For each row it sends the real tokens of the prompt and of
the response (no padding) as one token-id prompt to `/v1/completions` with `prompt_logprobs: 0` and
`max_tokens: 1`, and reads the response tokens' log-probs back from vLLM's `prompt_logprobs` layout (per
prompt token None for the first, else `{"<token id>": {"logprob", ...}}`). vLLM's server and quartet's
(`quartet.serving`) both answer it. The one token the server samples is thrown away.

The log-probs are the raw model's (temperature 1): that is what `prompt_logprobs` means on both servers,
so `quartet.config.validate` refuses a remote teacher with a rollout temperature other than 1 (or greedy).
Rows go out concurrently (`teacher.max_concurrency` in flight), each with its own timeout
(`teacher.timeout_s`); any failure (the server unreachable, a non-200 answer, a malformed one) raises
`RemoteTeacherError` naming the URL and the row, and the step fails: a missing score is never filled in.
"""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import torch

from quartet.config.roles import TeacherConfig
from quartet.core.batch import Batch

__all__ = ["RemoteTeacher", "RemoteTeacherError", "row_tokens"]


class RemoteTeacherError(RuntimeError):
    """The remote teacher did not score a row: `url` and `row` say which request, the message why."""

    def __init__(self, url: str, row: int, reason: str) -> None:
        self.url = url
        self.row = row
        super().__init__(f"remote teacher {url}, row {row}: {reason}")


def row_tokens(batch: Batch) -> list[tuple[list[int], list[int]]]:
    """Per row, the real prompt ids and the real response ids (the attention mask's 1s; prompts are
    left-padded and responses right-padded, `quartet.core.batch`)."""
    prompts, responses = batch["prompts"], batch["responses"]
    mask = batch["attention_mask"].bool()
    width = prompts.shape[1]
    out = []
    for i in range(prompts.shape[0]):
        prompt = prompts[i][mask[i, :width]].tolist()
        response = responses[i][mask[i, width:]].tolist()
        out.append((prompt, response))
    return out


class RemoteTeacher:
    """`teacher_logprobs` [B, R] of a batch's responses from the server at `teacher.url`."""

    def __init__(self, cfg: TeacherConfig) -> None:
        if not cfg.url:
            raise ValueError("a remote teacher needs teacher.url")
        self.cfg = cfg
        self.endpoint = cfg.url.rstrip("/") + "/completions"

    def score(self, batch: Batch) -> Batch:
        """`teacher_logprobs` [B, R] float32: each response token's log-prob under the teacher given all
        tokens before it, 0 past the response's end. Raises `RemoteTeacherError` on the first row that
        fails (naming the URL and the row)."""
        if "multi_modal_inputs" in batch.non_tensors:
            raise RemoteTeacherError(
                self.cfg.url, 0, "a remote teacher scores text only; this batch has images"
            )
        rows = row_tokens(batch)
        out = torch.zeros(batch["responses"].shape, dtype=torch.float32)
        agrees = torch.zeros_like(out)
        ranked = True  # every answer gave each token's rank (vLLM's and quartet's servers do)
        todo = [i for i, (_, response) in enumerate(rows) if response]
        pool = ThreadPoolExecutor(max_workers=self.cfg.max_concurrency, thread_name_prefix="teacher")
        try:
            futures = {i: pool.submit(self._row, i, *rows[i]) for i in todo}
            for i, future in futures.items():
                values, firsts = future.result()
                out[i, : len(values)] = torch.tensor(values, dtype=torch.float32)
                ranked = ranked and None not in firsts
                agrees[i, : len(firsts)] = torch.tensor([bool(f) for f in firsts], dtype=torch.float32)
        finally:  # a failed row fails the batch: rows not yet sent are not sent
            pool.shutdown(wait=True, cancel_futures=True)
        columns = {"teacher_logprobs": out}
        if ranked:  # `teacher_agrees`: the teacher's most likely token is the sampled one (rank 1)
            columns["teacher_agrees"] = agrees * (batch["response_mask"] > 0)
        return Batch(columns, meta=batch.meta)

    def _row(
        self, row: int, prompt: Sequence[int], response: Sequence[int]
    ) -> tuple[list[float], list[bool | None]]:
        """The log-probs of `response` after `prompt` (one request), and per token whether it is the
        teacher's most likely one (None where the answer gave no rank)."""
        ids = [*prompt, *response]
        body = {
            "model": self.cfg.model_name,
            "prompt": ids,
            "max_tokens": 1,
            "prompt_logprobs": 0,
        }
        answer = self._post(row, body)
        try:
            [choice, *_] = answer["choices"]
            scores = choice["prompt_logprobs"]
            if not isinstance(scores, list) or len(scores) != len(ids):
                raise ValueError(f"{len(ids)} prompt_logprobs entries expected")
            pairs = [_token_score(scores[t], ids[t]) for t in range(len(prompt), len(ids))]
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteTeacherError(
                self.cfg.url, row, f"malformed answer: {type(exc).__name__}: {exc}"
            ) from None
        return [p[0] for p in pairs], [p[1] for p in pairs]

    def _post(self, row: int, body: dict[str, Any]) -> dict[str, Any]:
        """POST `body`; the answer's JSON object, or `RemoteTeacherError` with the server's message."""
        headers = {"Content-Type": "application/json"}
        if self.cfg.api_key:
            headers["Authorization"] = f"Bearer {self.cfg.api_key}"
        request = urllib.request.Request(self.endpoint, json.dumps(body).encode(), headers, method="POST")
        try:
            with urllib.request.urlopen(request, timeout=self.cfg.timeout_s) as response:
                text = response.read().decode()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            raise RemoteTeacherError(self.cfg.url, row, f"HTTP {exc.code}: {detail}") from None
        except (urllib.error.URLError, OSError) as exc:  # refused, unreachable, timed out
            reason = getattr(exc, "reason", exc)
            raise RemoteTeacherError(
                self.cfg.url,
                row,
                f"no answer (unreachable, or over teacher.timeout_s={self.cfg.timeout_s:g}): {reason}",
            ) from None
        try:
            answer = json.loads(text)
        except ValueError:
            answer = None
        if not isinstance(answer, dict):
            raise RemoteTeacherError(self.cfg.url, row, f"not a JSON object: {text[:200]}")
        return answer


def _token_score(entry: Any, token: int) -> tuple[float, bool | None]:
    """The log-prob of `token` in one `prompt_logprobs` entry ({"<id>": {"logprob": ..., "rank": ...}}), and
    whether its rank is 1 (None without a rank)."""
    if not isinstance(entry, dict) or str(token) not in entry:
        raise ValueError(f"no log-prob of token {token} in {str(entry)[:120]}")
    scored = entry[str(token)]
    value = float(scored["logprob"])
    if math.isnan(value):
        raise ValueError(f"the log-prob of token {token} is NaN")
    rank = scored.get("rank") if isinstance(scored, dict) else None
    return value, None if rank is None else int(rank) == 1
