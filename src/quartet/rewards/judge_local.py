"""A judge model that quartet serves itself: the built-in engine behind quartet's OpenAI-compatible server.

`reward.judge.model_path` names a local folder; `LocalJudge` loads it into a `TorchRolloutEngine` on
`reward.judge.device` and serves it with `serving.OpenAIServer` on a `ServerThread` at 127.0.0.1 (any free
port, a random bearer key), in the process that scores rewards (the driver). The judge client then talks
to it over HTTP exactly as to a remote judge, so both ways share one path: prompts, retries, cache and
verdict parsing.

Why the driver, not a role of the pool: rewards are scored on the driver (`RewardComputer`), a judge is a
frozen model that is never trained or synced, and a small judge (or a CPU one, in tests) fits next to it.
A judge too large for the driver's device is served elsewhere (vLLM, SGLang, another quartet run) and
reached through `reward.judge.url`.
"""

from __future__ import annotations

import contextlib
import secrets

import torch

from quartet.config.reward import JudgeConfig

__all__ = ["LOCAL_JUDGE_NAME", "LocalJudge"]

LOCAL_JUDGE_NAME = "judge"
"""The model name the local judge answers to when `reward.judge.model` is empty."""


class LocalJudge:
    """The judge of `cfg.model_path` served on an ephemeral local port; `url`, `model`, `api_key`."""

    def __init__(self, cfg: JudgeConfig, request_timeout_s: float | None = None) -> None:
        """Load the model (float32 on CPU, bfloat16 on CUDA) and start serving; `close()` stops both."""
        from quartet.models.loading import load_causal_lm, load_tokenizer
        from quartet.rollout.torch.engine import TorchRolloutEngine
        from quartet.serving import OpenAIServer, ServerThread

        device = torch.device(cfg.device)
        if device.type == "cuda" and not torch.cuda.is_available():
            raise ValueError(
                f"reward.judge.device={cfg.device}: this process sees no CUDA device; use cpu, or serve the "
                "judge elsewhere and set reward.judge.url"
            )
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
        tokenizer = load_tokenizer(cfg.model_path)
        model = load_causal_lm(cfg.model_path, dtype=dtype)
        torch.nn.Module.to(model, device)
        model.train(False)
        self.engine = TorchRolloutEngine(model, tokenizer, max_num_seqs=cfg.max_concurrency)
        self.model = cfg.model or LOCAL_JUDGE_NAME
        self.api_key = secrets.token_urlsafe(16)
        server = OpenAIServer(
            self.engine,
            tokenizer,
            self.model,
            api_key=self.api_key,
            max_new_tokens_default=cfg.max_tokens,
            request_timeout_s=request_timeout_s or cfg.timeout_s,
        )
        self._thread = ServerThread(server)
        self._closed = False
        try:
            self.url = self._thread.start()
        except BaseException:
            self.engine.shutdown()
            raise

    def close(self) -> None:
        """Stop serving and shut the engine down; idempotent."""
        if self._closed:
            return
        self._closed = True
        with contextlib.suppress(Exception):
            self._thread.stop()
        self.engine.shutdown()
