"""A remote teacher of on-policy distillation: an OpenAI-compatible server that scores given tokens.

The local teacher role (`quartet.roles.teacher`) runs a model in the trainer's processes; this one asks a
server (`teacher.url`) instead, on the driver. For each row it sends the real tokens of the prompt and of
the response (no padding) as one token-id prompt to `/v1/completions` with `prompt_logprobs: 0` and
`max_tokens: 1`, and reads the response tokens' log-probs back from vLLM's `prompt_logprobs` layout (per
prompt token None for the first, else `{"<token id>": {"logprob", ...}}`). vLLM's server and quartet's
(`quartet.serving`) both answer it. The one token the server samples is thrown away.

With GKD (`algorithm.gkd_coef` > 0) it asks `prompt_logprobs: k` (`algorithm.gkd_top_k`) and also reads
each response position's k most likely tokens (ranks 1..k) into `teacher_topk_ids` and
`teacher_topk_logprobs`; a server that returns fewer (vLLM caps k at its `--max-logprobs`, 20 by default;
quartet's server at 20) fails the row naming the key.

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
from quartet.core.gkd import TEACHER_TOPK_IDS, TEACHER_TOPK_LOGPROBS

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

    def __init__(self, cfg: TeacherConfig, top_k: int = 0) -> None:
        """`top_k` > 0 (GKD): also each response position's k most likely tokens."""
        if not cfg.url:
            raise ValueError("a remote teacher needs teacher.url")
        self.cfg = cfg
        self.top_k = top_k
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
        top_values = torch.zeros(*out.shape, self.top_k, dtype=torch.float32)  # [B, R, 0] without GKD
        top_ids = torch.zeros(*out.shape, self.top_k, dtype=torch.long)
        ranked = True  # every answer gave each token's rank (vLLM's and quartet's servers do)
        todo = [i for i, (_, response) in enumerate(rows) if response]
        pool = ThreadPoolExecutor(max_workers=self.cfg.max_concurrency, thread_name_prefix="teacher")
        try:
            futures = {i: pool.submit(self._row, i, *rows[i]) for i in todo}
            for i, future in futures.items():
                values, firsts, tops = future.result()
                out[i, : len(values)] = torch.tensor(values, dtype=torch.float32)
                for t, top in enumerate(tops):
                    top_ids[i, t] = torch.tensor([token for token, _ in top], dtype=torch.long)
                    top_values[i, t] = torch.tensor([value for _, value in top], dtype=torch.float32)
                ranked = ranked and None not in firsts
                agrees[i, : len(firsts)] = torch.tensor([bool(f) for f in firsts], dtype=torch.float32)
        finally:  # a failed row fails the batch: rows not yet sent are not sent
            pool.shutdown(wait=True, cancel_futures=True)
        columns = {"teacher_logprobs": out}
        if ranked:  # `teacher_agrees`: the teacher's most likely token is the sampled one (rank 1)
            columns["teacher_agrees"] = agrees * (batch["response_mask"] > 0)
        if self.top_k:
            columns[TEACHER_TOPK_IDS] = top_ids
            columns[TEACHER_TOPK_LOGPROBS] = top_values
        return Batch(columns, meta=batch.meta)

    def _row(
        self, row: int, prompt: Sequence[int], response: Sequence[int]
    ) -> tuple[list[float], list[bool | None], list[list[tuple[int, float]]]]:
        """The log-probs of `response` after `prompt` (one request), per token whether it is the teacher's
        most likely one (None where the answer gave no rank), and with `top_k` its k most likely tokens."""
        ids = [*prompt, *response]
        body = {
            "model": self.cfg.model_name,
            "prompt": ids,
            "max_tokens": 1,
            "prompt_logprobs": self.top_k,
        }
        answer = self._post(row, body)
        try:
            [choice, *_] = answer["choices"]
            scores = choice["prompt_logprobs"]
            if not isinstance(scores, list) or len(scores) != len(ids):
                raise ValueError(f"{len(ids)} prompt_logprobs entries expected")
            positions = range(len(prompt), len(ids))
            pairs = [_token_score(scores[t], ids[t]) for t in positions]
            tops = [_top_tokens(scores[t], self.top_k, t) for t in positions] if self.top_k else []
        except (KeyError, TypeError, ValueError) as exc:
            raise RemoteTeacherError(
                self.cfg.url, row, f"malformed answer: {type(exc).__name__}: {exc}"
            ) from None
        return [p[0] for p in pairs], [p[1] for p in pairs], tops

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


def _top_tokens(entry: dict[str, Any], k: int, position: int) -> list[tuple[int, float]]:
    """The k most likely tokens (id, log-prob) of one `prompt_logprobs` entry, by rank."""
    ranked = sorted(
        (
            (int(v["rank"]), -float(v["logprob"]), int(token))
            for token, v in entry.items()
            if int(v["rank"]) <= k
        )
    )
    if len(ranked) < k:
        raise ValueError(
            f"position {position} has {len(ranked)} of the {k} alternatives algorithm.gkd_top_k asks for "
            "(vLLM caps them at --max-logprobs, 20 by default): lower algorithm.gkd_top_k"
        )
    return [(token, -neg) for _, neg, token in ranked[:k]]
