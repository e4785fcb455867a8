"""Response bodies: the OpenAI shapes for chat and text completions, and our token-level shape.

Chat and text completions follow the OpenAI API reference (`chat.completion` and `text_completion`
objects). Usage counts every generated token of every choice, stop tokens included. Finish reasons are the
engine's: "stop", "length", or "abort" (aborted by the engine, as vLLM reports it), and "tool_calls" when
a chat response's Hermes blocks became `message.tool_calls` (`tool_calls`). Log-probs, when asked for,
cover every generated token (the end-of-turn token too) with its text decoded alone; alternatives
(`top_logprobs`) are those the engine returns in `GenerationOutput.top_logprobs` (per token, (token id,
log-prob) pairs, most likely first) and empty where it returns none. An entry's `bytes` are the UTF-8 bytes
of its text: a byte-level token holding part of a character reads as U+FFFD (its raw bytes are
tokenizer-specific).

The token body `{"request_id", "outputs": [{"sample_index", "token_ids", "logprobs", "finish_reason",
"stop_reason", "first_step", "finish_step", "top_logprobs", "versions"}]}` (`top_logprobs`: per token,
[id, log-prob] pairs, or null; `versions`: per token, the weight version that computed it, or null) maps one
to one onto `GenerationOutput` (`output_from_json` reads it back). A request with
`"return_routed_experts": true` also gets each output's MoE routing record, `routed_experts`
(`routing_wire`: base64 of the record with its shape and dtype; null when the engine recorded none).
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from quartet.rollout.types import FinishReason, GenerationOutput, PromptLogprob
from quartet.serving.routing_wire import routing_from_json, routing_to_json
from quartet.serving.text import TokenizerLike, decode_response, token_texts
from quartet.serving.tool_calls import parse_assistant_turn

__all__ = [
    "chat_response",
    "completion_response",
    "models_response",
    "output_from_json",
    "output_to_json",
    "token_response",
]


def _usage(prompt_tokens: int, outputs: Sequence[GenerationOutput]) -> dict[str, int]:
    completion = sum(len(o.token_ids) for o in outputs)
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion,
        "total_tokens": prompt_tokens + completion,
    }


def _envelope(kind: str, prefix: str, model: str) -> dict[str, Any]:
    return {"id": f"{prefix}-{uuid.uuid4().hex}", "object": kind, "created": int(time.time()), "model": model}


def _alternatives(output: GenerationOutput) -> list[list[tuple[int, float]]]:
    """Per generated token, the engine's (token id, log-prob) alternatives ([] where it returns none)."""
    top = output.top_logprobs
    if not top:
        return [[] for _ in output.token_ids]
    return [[(int(t), float(lp)) for t, lp in entry] for entry in top]


def _chat_logprobs(tokenizer: TokenizerLike, output: GenerationOutput) -> dict[str, Any]:
    values = output.logprobs or ()
    texts = token_texts(tokenizer, output.token_ids)
    alternatives = _alternatives(output)
    content = []
    for text, lp, alts in zip(texts, values, alternatives, strict=True):
        alt_texts = token_texts(tokenizer, [t for t, _ in alts])
        top = [
            {"token": at, "logprob": alp, "bytes": list(at.encode())}
            for at, (_, alp) in zip(alt_texts, alts, strict=True)
        ]
        content.append({"token": text, "logprob": lp, "bytes": list(text.encode()), "top_logprobs": top})
    return {"content": content, "refusal": None}


def _chat_choice(
    index: int,
    output: GenerationOutput,
    tokenizer: TokenizerLike,
    logprobs: bool,
    tool_tags: Mapping[int, str] | None,
    single_call: bool = False,
) -> dict[str, Any]:
    finish = output.finish_reason.value
    message: dict[str, Any] = {"role": "assistant"}
    if tool_tags is None:
        message["content"] = decode_response(tokenizer, output)
    else:
        turn = parse_assistant_turn(decode_response(tokenizer, output, tool_tags))
        message["content"] = turn.content
        if turn.tool_calls:
            message["tool_calls"] = turn.tool_calls[:1] if single_call else turn.tool_calls
            finish = "tool_calls" if output.finish_reason is FinishReason.STOP else finish
    return {
        "index": index,
        "message": message,
        "finish_reason": finish,
        "logprobs": _chat_logprobs(tokenizer, output) if logprobs else None,
    }


def chat_response(
    model: str,
    prompt_tokens: int,
    outputs: Sequence[GenerationOutput],
    tokenizer: TokenizerLike,
    logprobs: bool,
    tool_tags: Mapping[int, str] | None = None,
    single_call: bool = False,
) -> dict[str, Any]:
    """A `chat.completion` object with one choice per output.

    tool_tags: when set (the request had tools), the response is decoded keeping these tag tokens and its
    Hermes blocks become `message.tool_calls` (`tool_calls` module); None: plain text.
    single_call: keep only the first tool call (`parallel_tool_calls: false` without a forced call).
    """
    choices = [_chat_choice(i, o, tokenizer, logprobs, tool_tags, single_call) for i, o in enumerate(outputs)]
    return {
        **_envelope("chat.completion", "chatcmpl", model),
        "choices": choices,
        "usage": _usage(prompt_tokens, outputs),
    }


def _completion_logprobs(tokenizer: TokenizerLike, output: GenerationOutput, top: int) -> dict[str, Any]:
    texts = token_texts(tokenizer, output.token_ids)
    offsets = [sum(len(t) for t in texts[:i]) for i in range(len(texts))]
    alternatives = None
    if top:
        alternatives = [
            dict(zip(token_texts(tokenizer, [t for t, _ in alts]), (lp for _, lp in alts), strict=True))
            for alts in _alternatives(output)
        ]
    return {
        "tokens": texts,
        "token_logprobs": list(output.logprobs or ()),
        "top_logprobs": alternatives,
        "text_offset": offsets,
    }


def prompt_logprobs_json(
    tokenizer: TokenizerLike, scores: Sequence[PromptLogprob | None]
) -> list[dict[str, dict[str, Any]] | None]:
    """vLLM's `prompt_logprobs` layout: per prompt token None (the first) or {token id (a string, as JSON
    keys are): {"logprob", "rank", "decoded_token"}} holding the prompt's token and its top alternatives."""
    out: list[dict[str, dict[str, Any]] | None] = []
    for score in scores:
        if score is None:
            out.append(None)
            continue
        entries = [(score.token_id, score.logprob, score.rank)]
        entries += [(t, lp, rank) for rank, (t, lp) in enumerate(score.top, 1) if t != score.token_id]
        texts = token_texts(tokenizer, [t for t, _, _ in entries])
        out.append(
            {
                str(t): {"logprob": lp, "rank": rank, "decoded_token": text}
                for (t, lp, rank), text in zip(entries, texts, strict=True)
            }
        )
    return out


def completion_response(
    model: str,
    prompt_tokens: int,
    outputs: Sequence[GenerationOutput],
    tokenizer: TokenizerLike,
    logprobs: bool,
    top_logprobs: int = 0,
    prompt_logprobs: bool = False,
) -> dict[str, Any]:
    """A `text_completion` object with one choice per output (`top_logprobs` alternatives per token; with
    `prompt_logprobs`, each choice's `prompt_logprobs` in vLLM's layout, `prompt_logprobs_json`)."""
    choices: list[dict[str, Any]] = [
        {
            "index": i,
            "text": decode_response(tokenizer, o),
            "finish_reason": o.finish_reason.value,
            "logprobs": _completion_logprobs(tokenizer, o, top_logprobs) if logprobs else None,
        }
        for i, o in enumerate(outputs)
    ]
    if prompt_logprobs:
        shared = prompt_logprobs_json(tokenizer, outputs[0].prompt_logprobs or ()) if outputs else []
        for choice in choices:
            choice["prompt_logprobs"] = shared
    return {
        **_envelope("text_completion", "cmpl", model),
        "choices": choices,
        "usage": _usage(prompt_tokens, outputs),
    }


def models_response(model: str, created: int) -> dict[str, Any]:
    """The `/v1/models` list: the one served model."""
    return {
        "object": "list",
        "data": [{"id": model, "object": "model", "created": created, "owned_by": "quartet"}],
    }


def output_to_json(output: GenerationOutput, routed_experts: bool = False) -> dict[str, Any]:
    """One `GenerationOutput` as a JSON object of the token endpoint (with its routing record when asked)."""
    body = {
        "sample_index": output.sample_index,
        "token_ids": list(output.token_ids),
        "logprobs": None if output.logprobs is None else list(output.logprobs),
        "finish_reason": output.finish_reason.value,
        "stop_reason": output.stop_reason,
        "first_step": output.first_step,
        "finish_step": output.finish_step,
        "top_logprobs": None
        if not output.top_logprobs
        else [[list(p) for p in e] for e in output.top_logprobs],
        "versions": None if output.versions is None else list(output.versions),
    }
    if routed_experts:
        record = output.routed_experts
        body["routed_experts"] = None if record is None else routing_to_json(record)
    return body


def token_response(
    request_id: str, outputs: Sequence[GenerationOutput], routed_experts: bool = False
) -> dict[str, Any]:
    """The `/v1/quartet/generate` body (each output's routing record too with `routed_experts`)."""
    return {"request_id": request_id, "outputs": [output_to_json(o, routed_experts) for o in outputs]}


def output_from_json(
    obj: Mapping[str, Any], request_id: str, prompt_tokens: int = 0, routed_experts: bool = False
) -> GenerationOutput:
    """`output_to_json` read back (KeyError / ValueError on a malformed object).

    routed_experts: read the output's routing record too, [prompt_tokens + tokens - 1, L, k]; it must be
    there unless the output has no token (aborted before it was admitted). Without it, any record the
    body holds is ignored: routing is only read when this client asked for it.
    """
    logprobs = obj["logprobs"]
    top = obj.get("top_logprobs")
    token_ids = tuple(int(t) for t in obj["token_ids"])
    versions = obj.get("versions")
    if versions is not None:
        versions = tuple(int(v) for v in versions)
        if len(versions) != len(token_ids):
            raise ValueError(f"{len(versions)} versions for {len(token_ids)} tokens")
    record = None
    if routed_experts:
        raw = obj.get("routed_experts")
        if raw is not None:
            record = routing_from_json(raw, prompt_tokens + len(token_ids) - 1)
        elif token_ids:
            raise ValueError(
                "the replica sent no routed_experts for a response: its engine records no routing "
                "(rollout.record_routing, built-in engine, an MoE model)"
            )
    return GenerationOutput(
        request_id=request_id,
        sample_index=int(obj["sample_index"]),
        token_ids=token_ids,
        logprobs=None if logprobs is None else tuple(float(x) for x in logprobs),
        finish_reason=FinishReason(obj["finish_reason"]),
        stop_reason=obj.get("stop_reason"),
        first_step=int(obj.get("first_step", 0)),
        finish_step=int(obj.get("finish_step", 0)),
        top_logprobs=None if top is None else tuple(tuple((int(t), float(lp)) for t, lp in e) for e in top),
        versions=versions,
        routed_experts=record,
    )
