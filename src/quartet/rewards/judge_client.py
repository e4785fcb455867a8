"""Chat-completion requests to a judge at an OpenAI-compatible URL: concurrent, bounded, retried, cached.

    client = JudgeClient("http://host:8000/v1", "judge-model", api_key=None)
    replies, stats = client.complete_all(["prompt 1", "prompt 2"])    # one JudgeReply per prompt, in order

One call sends every prompt not in the cache at once, at most `max_concurrency` in flight (a semaphore and
the connection pool's limit). Each attempt is bounded by `timeout_s`; a connection error, a timeout, a 429 or
a 5xx answer is retried after `retry_backoff_s`, doubled each time (capped at 30 s), at most `max_retries`
times; any other non-200 answer (400, 401, 404: a wrong model name or key) fails at once, since asking again
cannot help. A request never raises: it ends as a reply text or a failure reason, so one bad request costs
its response the fallback score, not the step. The whole call is bounded by
(max_retries + 1) x timeout_s plus the back-offs per request.

The cache maps a hash of (model, messages, max_tokens, temperature) to the reply text, so the same judge
prompt is answered once per run (GRPO groups often hold identical responses). Only replies are cached, not
failures. With a path, entries are also appended to a JSONL file and read back at start (a resumed run keeps
them). aiohttp (already quartet's HTTP library, for its server) is the client; the request body is the
chat-completions API's, so vLLM, SGLang, TGI, quartet's own server and hosted APIs all answer it.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
from collections import OrderedDict
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp

__all__ = ["JudgeCallStats", "JudgeClient", "JudgeReply", "ReplyCache", "cache_key"]

logger = logging.getLogger(__name__)

_MAX_BACKOFF_S = 30.0


@dataclass(frozen=True)
class JudgeReply:
    """One prompt's outcome: the judge's reply text, or why there is none."""

    text: str | None
    """The reply (`choices[0].message.content`); None when the request failed."""
    error: str = ""
    """Why the request failed (empty when it did not)."""
    cached: bool = False


@dataclass
class JudgeCallStats:
    """What one `complete_all` call did."""

    requests: int = 0
    """HTTP attempts sent (retries included)."""
    retries: int = 0
    cache_hits: int = 0
    failures: int = 0
    """Prompts that got no reply after their attempts."""


class _Retryable(Exception):
    """An attempt failed in a way another attempt may not (connection, timeout, 429, 5xx)."""


class _Fatal(Exception):
    """An attempt failed in a way no retry changes (4xx, a malformed answer)."""


def cache_key(model: str, messages: Sequence[dict[str, str]], max_tokens: int, temperature: float) -> str:
    """sha256 of everything that decides the reply: the model, the prompt, the sampling settings."""
    body = json.dumps([model, list(messages), max_tokens, temperature], sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(body.encode("utf-8")).hexdigest()


class ReplyCache:
    """Reply texts by cache key: in memory (the `max_entries` most recent), optionally in a JSONL file too."""

    def __init__(self, path: Path | None = None, max_entries: int = 200_000) -> None:
        self.path = path
        self.max_entries = max_entries
        self._entries: OrderedDict[str, str] = OrderedDict()
        if path is not None and path.is_file():
            self._load(path)

    def _load(self, path: Path) -> None:
        skipped = 0
        with path.open(encoding="utf-8") as f:
            for line in f:
                try:
                    entry = json.loads(line)
                    self._remember(str(entry["key"]), str(entry["reply"]))
                except (ValueError, KeyError, TypeError):
                    skipped += 1  # a line cut short by a killed run
        if skipped:
            logger.warning("judge cache %s: %d unreadable lines skipped", path, skipped)

    def __len__(self) -> int:
        return len(self._entries)

    def get(self, key: str) -> str | None:
        text = self._entries.get(key)
        if text is not None:
            self._entries.move_to_end(key)
        return text

    def put(self, key: str, text: str) -> None:
        self._remember(key, text)
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            with self.path.open("a", encoding="utf-8") as f:
                f.write(json.dumps({"key": key, "reply": text}, ensure_ascii=False) + "\n")

    def _remember(self, key: str, text: str) -> None:
        self._entries[key] = text
        self._entries.move_to_end(key)
        while len(self._entries) > self.max_entries:
            self._entries.popitem(last=False)


class JudgeClient:
    """Sends judge prompts as chat completions; see the module docstring."""

    def __init__(
        self,
        url: str,
        model: str,
        api_key: str | None = None,
        *,
        max_concurrency: int = 8,
        timeout_s: float = 60.0,
        max_retries: int = 3,
        retry_backoff_s: float = 0.5,
        max_tokens: int = 512,
        temperature: float = 0.0,
        cache: ReplyCache | None = None,
    ) -> None:
        if max_concurrency < 1 or timeout_s <= 0 or max_retries < 0 or retry_backoff_s < 0:
            raise ValueError(
                "need max_concurrency >= 1, timeout_s > 0, max_retries >= 0 and retry_backoff_s >= 0, got "
                f"{max_concurrency}, {timeout_s}, {max_retries}, {retry_backoff_s}"
            )
        self.endpoint = url.rstrip("/") + "/chat/completions"
        self.model = model
        self.api_key = api_key
        self.max_concurrency = max_concurrency
        self.timeout_s = timeout_s
        self.max_retries = max_retries
        self.retry_backoff_s = retry_backoff_s
        self.max_tokens = max_tokens
        self.temperature = temperature
        self.cache = cache

    def messages(self, prompt: str) -> list[dict[str, str]]:
        """The chat of one judge prompt: one user message."""
        return [{"role": "user", "content": prompt}]

    def complete_all(self, prompts: Sequence[str]) -> tuple[list[JudgeReply], JudgeCallStats]:
        """One reply per prompt, in order (blocking; safe to call from a thread with a running loop)."""
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return asyncio.run(self._complete_all(prompts))
        with ThreadPoolExecutor(1, thread_name_prefix="quartet-judge") as pool:  # never block a running loop
            return pool.submit(asyncio.run, self._complete_all(prompts)).result()

    async def _complete_all(self, prompts: Sequence[str]) -> tuple[list[JudgeReply], JudgeCallStats]:
        stats = JudgeCallStats()
        keys = [cache_key(self.model, self.messages(p), self.max_tokens, self.temperature) for p in prompts]
        replies: list[JudgeReply | None] = [None] * len(prompts)
        todo: dict[str, list[int]] = {}  # identical prompts of one batch are sent once
        for i, key in enumerate(keys):
            text = self.cache.get(key) if self.cache is not None else None
            if text is not None:
                replies[i] = JudgeReply(text, cached=True)
                stats.cache_hits += 1
            else:
                todo.setdefault(key, []).append(i)
        if todo:
            gate = asyncio.Semaphore(self.max_concurrency)
            connector = aiohttp.TCPConnector(limit=self.max_concurrency)
            async with aiohttp.ClientSession(connector=connector) as session:
                firsts = [positions[0] for positions in todo.values()]
                done = await asyncio.gather(
                    *(self._complete(session, gate, prompts[i], stats) for i in firsts)
                )
            for (key, positions), reply in zip(todo.items(), done, strict=True):
                if reply.text is not None and self.cache is not None:
                    self.cache.put(key, reply.text)
                stats.failures += len(positions) if reply.text is None else 0
                for j, i in enumerate(positions):
                    replies[i] = reply if j == 0 else JudgeReply(reply.text, reply.error, cached=True)
                stats.cache_hits += len(positions) - 1
        return [r if r is not None else JudgeReply(None, "not sent") for r in replies], stats

    async def _complete(
        self, session: aiohttp.ClientSession, gate: asyncio.Semaphore, prompt: str, stats: JudgeCallStats
    ) -> JudgeReply:
        body = {
            "model": self.model,
            "messages": self.messages(prompt),
            "max_tokens": self.max_tokens,
            "temperature": self.temperature,
        }
        last = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                stats.retries += 1
                await asyncio.sleep(min(_MAX_BACKOFF_S, self.retry_backoff_s * 2 ** (attempt - 1)))
            try:
                async with gate:
                    stats.requests += 1
                    return JudgeReply(await self._attempt(session, body))
            except _Retryable as err:
                last = str(err)
            except _Fatal as err:
                return JudgeReply(None, str(err))
        return JudgeReply(None, f"no reply after {self.max_retries + 1} attempts; last: {last}")

    async def _attempt(self, session: aiohttp.ClientSession, body: dict[str, Any]) -> str:
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        timeout = aiohttp.ClientTimeout(total=self.timeout_s)
        try:
            async with session.post(self.endpoint, json=body, headers=headers, timeout=timeout) as response:
                status, raw = response.status, await response.text()
        except TimeoutError as err:
            raise _Retryable(f"no answer within timeout_s={self.timeout_s:g} from {self.endpoint}") from err
        except aiohttp.ClientError as err:
            raise _Retryable(f"{type(err).__name__} from {self.endpoint}: {err}") from err
        if status == 429 or status >= 500:
            raise _Retryable(f"HTTP {status} from {self.endpoint}: {raw[:300]}")
        if status != 200:
            raise _Fatal(f"HTTP {status} from {self.endpoint}: {raw[:300]}")
        try:
            content = json.loads(raw)["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise _Fatal(f"{self.endpoint} answered without choices[0].message.content: {raw[:300]}") from err
        return "" if content is None else str(content)
