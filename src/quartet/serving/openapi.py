"""The OpenAPI 3.0 document the server serves at `GET /openapi.json` (`openapi_schema`).

It describes the request bodies this server accepts, with the limits of the running server (`max_n`,
vocabulary, the response limit), and `additionalProperties: false` wherever the server refuses unknown
fields, so a schema-driven fuzzer (the tests use schemathesis) generates both valid bodies and bodies that
break one rule at a time. Responses are described loosely (status and an OpenAI error object): the
response shapes are OpenAI's, which its own published schema documents.
"""

from __future__ import annotations

from typing import Any

from quartet.serving.limits import MAX_SEED, MAX_STOP, MAX_TEMPERATURE, MAX_TOP_LOGPROBS, RequestLimits

__all__ = ["openapi_schema"]

_ERROR = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["message", "type"],
            "properties": {
                "message": {"type": "string"},
                "type": {"type": "string"},
                "param": {"type": "string", "nullable": True},
                "code": {"type": "string", "nullable": True},
            },
        }
    },
}


def _responses(ok: str) -> dict[str, Any]:
    error = {"content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}}}
    answers: dict[str, Any] = {"200": {"description": ok}}
    for status, why in [
        ("400", "malformed body or unsupported field (the message names it)"),
        ("401", "missing or wrong API key"),
        ("404", "unknown model"),
        ("413", "body larger than max_body_bytes"),
        ("503", "the engine is asleep"),
        ("504", "the engine did not finish within request_timeout_s"),
    ]:
        answers[status] = {"description": why, **error}
    return answers


def _sampling(limits: RequestLimits) -> dict[str, Any]:
    token = {"type": "integer", "minimum": 0, "maximum": limits.vocab_size - 1}
    return {
        "temperature": {"type": "number", "minimum": 0, "maximum": MAX_TEMPERATURE, "nullable": True},
        "top_p": {"type": "number", "minimum": 1e-6, "maximum": 1, "nullable": True},
        "top_k": {"type": "integer", "minimum": -1, "nullable": True},
        "n": {"type": "integer", "minimum": 1, "maximum": limits.max_n, "nullable": True},
        "seed": {"type": "integer", "minimum": -MAX_SEED - 1, "maximum": MAX_SEED, "nullable": True},
        "stop": {
            "nullable": True,
            "oneOf": [
                {"type": "string", "minLength": 1},
                {"type": "array", "maxItems": MAX_STOP, "items": {"type": "string", "minLength": 1}},
            ],
        },
        "stop_token_ids": {"type": "array", "maxItems": MAX_STOP, "items": token, "nullable": True},
        "ignore_eos": {"type": "boolean", "nullable": True},
        "max_tokens": {
            "type": "integer",
            "minimum": 1,
            "maximum": limits.max_request_tokens,
            "nullable": True,
        },
        "presence_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": True},
        "frequency_penalty": {"type": "number", "minimum": -2, "maximum": 2, "nullable": True},
        "repetition_penalty": {"type": "number", "minimum": 0.01, "maximum": 100, "nullable": True},
        "min_tokens": {"type": "integer", "minimum": 0, "nullable": True},
        "stream": {"type": "boolean", "nullable": True},
        "stream_options": {
            "type": "object",
            "nullable": True,
            "additionalProperties": False,
            "properties": {"include_usage": {"type": "boolean"}},
        },
        "user": {"type": "string"},
        "model": {"type": "string"},
    }


def _message() -> dict[str, Any]:
    """One chat message: a role, text (or text parts), and the tool calls or the tool answer it carries."""
    text_part = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {"type": {"type": "string", "enum": ["text"]}, "text": {"type": "string"}},
    }
    tool_call = {
        "type": "object",
        "required": ["id", "type", "function"],
        "properties": {
            "id": {"type": "string"},
            "type": {"type": "string", "enum": ["function"]},
            "function": {
                "type": "object",
                "required": ["name", "arguments"],
                "properties": {"name": {"type": "string"}, "arguments": {"type": "string"}},
            },
        },
    }
    return {
        "type": "object",
        "required": ["role"],
        "properties": {
            "role": {"type": "string", "enum": ["system", "user", "assistant", "tool"]},
            "content": {
                "nullable": True,
                "oneOf": [{"type": "string"}, {"type": "array", "items": text_part}],
            },
            "tool_calls": {"type": "array", "items": tool_call},
            "tool_call_id": {"type": "string"},
            "name": {"type": "string"},
        },
    }


def _tool() -> dict[str, Any]:
    """One tool the model may call: a function with a name and JSON-schema parameters."""
    return {
        "type": "object",
        "required": ["type", "function"],
        "properties": {
            "type": {"type": "string", "enum": ["function"]},
            "function": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": {"type": "string", "minLength": 1},
                    "description": {"type": "string"},
                    "parameters": {"type": "object"},
                },
            },
        },
    }


def _named_choice() -> dict[str, Any]:
    """`tool_choice` naming the one function the model must call."""
    name = {
        "type": "object",
        "required": ["name"],
        "properties": {"name": {"type": "string", "minLength": 1}},
    }
    return {
        "type": "object",
        "required": ["type", "function"],
        "properties": {"type": {"type": "string", "enum": ["function"]}, "function": name},
    }


def _response_format() -> dict[str, Any]:
    """`response_format`: free text, any JSON object, or JSON valid against a schema (constrained)."""
    plain = {
        "type": "object",
        "additionalProperties": False,
        "required": ["type"],
        "properties": {"type": {"type": "string", "enum": ["text", "json_object"]}},
    }
    spec = {
        "type": "object",
        "additionalProperties": False,
        "required": ["name"],
        "properties": {
            "name": {"type": "string", "minLength": 1},
            "description": {"type": "string"},
            "schema": {"type": "object"},
            "strict": {"type": "boolean", "nullable": True},
        },
    }
    schema = {
        "type": "object",
        "additionalProperties": False,
        "required": ["type", "json_schema"],
        "properties": {"type": {"type": "string", "enum": ["json_schema"]}, "json_schema": spec},
    }
    return {"oneOf": [plain, schema], "nullable": True}


def _chat(limits: RequestLimits) -> dict[str, Any]:
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["messages"],
        "properties": {
            **_sampling(limits),
            "messages": {"type": "array", "minItems": 1, "items": _message()},
            "tools": {"type": "array", "items": _tool(), "nullable": True},
            "tool_choice": {
                "oneOf": [{"type": "string", "enum": ["auto", "none", "required"]}, _named_choice()],
                "nullable": True,
            },
            "parallel_tool_calls": {"type": "boolean", "nullable": True},
            "response_format": _response_format(),
            "max_completion_tokens": {"type": "integer", "minimum": 1, "nullable": True},
            "logprobs": {"type": "boolean", "nullable": True},
            "top_logprobs": {"type": "integer", "minimum": 0, "maximum": MAX_TOP_LOGPROBS, "nullable": True},
        },
    }


def _input_item() -> dict[str, Any]:
    """One `input` item of a Responses body: a message, a function call, or a function call's output."""
    part = {
        "type": "object",
        "required": ["type", "text"],
        "properties": {
            "type": {"type": "string", "enum": ["input_text", "output_text"]},
            "text": {"type": "string"},
        },
    }
    item = {
        "type": "object",
        "properties": {
            "type": {"type": "string", "enum": ["message", "function_call", "function_call_output"]},
            "role": {"type": "string", "enum": ["user", "assistant", "system", "developer"]},
            "content": {"oneOf": [{"type": "string"}, {"type": "array", "items": part}]},
            "call_id": {"type": "string"},
            "name": {"type": "string"},
            "arguments": {"type": "string"},
            "output": {"type": "string"},
        },
    }
    return item


def _responses_request(limits: RequestLimits) -> dict[str, Any]:
    """A `/v1/responses` body: the text and function-tool subset (`responses_api`)."""
    item = _input_item()
    tool = {
        "type": "object",
        "required": ["type", "name"],
        "properties": {
            "type": {"type": "string", "enum": ["function"]},
            "name": {"type": "string", "minLength": 1},
            "description": {"type": "string"},
            "parameters": {"type": "object"},
            "strict": {"type": "boolean"},
        },
    }
    choice = {
        "type": "object",
        "required": ["type", "name"],
        "properties": {"type": {"type": "string", "enum": ["function"]}, "name": {"type": "string"}},
    }
    sampling = _sampling(limits)
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["input"],
        "properties": {
            "model": sampling["model"],
            "input": {"oneOf": [{"type": "string"}, {"type": "array", "minItems": 1, "items": item}]},
            "instructions": {"type": "string", "nullable": True},
            "tools": {"type": "array", "items": tool, "nullable": True},
            "tool_choice": {
                "oneOf": [{"type": "string", "enum": ["auto", "none", "required"]}, choice],
                "nullable": True,
            },
            "parallel_tool_calls": {"type": "boolean", "nullable": True},
            "max_output_tokens": {"type": "integer", "minimum": 1, "nullable": True},
            "temperature": sampling["temperature"],
            "top_p": sampling["top_p"],
            "stream": {"type": "boolean", "nullable": True},
            "metadata": {"type": "object", "nullable": True},
            "truncation": {"type": "string", "enum": ["disabled"], "nullable": True},
        },
    }


def _completion(limits: RequestLimits) -> dict[str, Any]:
    token = {"type": "integer", "minimum": 0, "maximum": limits.vocab_size - 1}
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["prompt"],
        "properties": {
            **_sampling(limits),
            "prompt": {
                "oneOf": [
                    {"type": "string", "minLength": 1},
                    {"type": "array", "minItems": 1, "items": token},
                ]
            },
            "logprobs": {"type": "integer", "minimum": 0, "maximum": 5, "nullable": True},
            "prompt_logprobs": {
                "type": "integer",
                "minimum": 0,
                "maximum": MAX_TOP_LOGPROBS,
                "nullable": True,
            },
            "echo": {"type": "boolean", "enum": [False], "nullable": True},
        },
    }


def _token_request(limits: RequestLimits) -> dict[str, Any]:
    token = {"type": "integer", "minimum": 0, "maximum": limits.vocab_size - 1}
    sampling = {
        "type": "object",
        "additionalProperties": False,
        "properties": {
            "temperature": {"type": "number", "minimum": 0, "maximum": MAX_TEMPERATURE},
            "top_p": {"type": "number", "minimum": 1e-6, "maximum": 1},
            "top_k": {"type": "integer", "minimum": 0},
            "max_new_tokens": {"type": "integer", "minimum": 1, "maximum": limits.max_request_tokens},
            "n": {"type": "integer", "minimum": 1, "maximum": limits.max_n},
            "seed": {"type": "integer", "nullable": True},
            "stop_token_ids": {"type": "array", "maxItems": MAX_STOP, "items": token},
            "stop": {"type": "array", "maxItems": MAX_STOP, "items": {"type": "string", "minLength": 1}},
            "ignore_eos": {"type": "boolean"},
            "return_logprobs": {"type": "boolean"},
            "grammar": {"type": "string", "minLength": 1, "nullable": True},
        },
    }
    return {
        "type": "object",
        "additionalProperties": False,
        "required": ["prompt_token_ids"],
        "properties": {
            "prompt_token_ids": {"type": "array", "minItems": 1, "items": token},
            "sampling": sampling,
            "multi_modal": _MULTI_MODAL,
            "return_routed_experts": {"type": "boolean"},
        },
    }


_MULTI_MODAL: dict[str, Any] = {
    "type": "object",
    "description": "the prompt's images for a vision-language model (quartet.serving.images)",
    "additionalProperties": False,
    "required": ["pixel_values", "image_grid_thw"],
    "properties": {
        "pixel_values": {
            "type": "object",
            "additionalProperties": False,
            "required": ["dtype", "shape", "data"],
            "properties": {
                "dtype": {"type": "string", "enum": ["float32"]},
                "shape": {
                    "type": "array",
                    "minItems": 2,
                    "maxItems": 2,
                    "items": {"type": "integer", "minimum": 1},
                },
                "data": {"type": "string", "format": "byte"},
            },
        },
        "image_grid_thw": {
            "type": "array",
            "minItems": 1,
            "items": {
                "type": "array",
                "minItems": 3,
                "maxItems": 3,
                "items": {"type": "integer", "minimum": 1},
            },
        },
        "image_mask": {"type": "array", "items": {"type": "integer", "enum": [0, 1]}},
    },
}


def _post(summary: str, schema: str) -> dict[str, Any]:
    body = {
        "required": True,
        "content": {"application/json": {"schema": {"$ref": f"#/components/schemas/{schema}"}}},
    }
    return {"post": {"summary": summary, "requestBody": body, "responses": _responses("the response")}}


def openapi_schema(limits: RequestLimits, model_name: str) -> dict[str, Any]:
    """The OpenAPI document of a server with these limits (paths relative to the server root)."""
    return {
        "openapi": "3.0.3",
        "info": {"title": f"quartet OpenAI-compatible server ({model_name})", "version": "1"},
        "paths": {
            "/v1/models": {"get": {"summary": "the served model", "responses": _responses("the model list")}},
            "/v1/models/{model_id}": {
                "get": {
                    "summary": "the served model by id (404 for another)",
                    "parameters": [
                        {"name": "model_id", "in": "path", "required": True, "schema": {"type": "string"}}
                    ],
                    "responses": _responses("the model"),
                }
            },
            "/v1/chat/completions": _post("a chat completion (stream: server-sent events)", "ChatRequest"),
            "/v1/completions": _post("a text completion (stream: server-sent events)", "CompletionRequest"),
            "/v1/quartet/generate": _post("token ids in, token ids and log-probs out", "TokenRequest"),
            "/v1/responses": _post(
                "the Responses API, text and function tools (stream: events)", "ResponsesRequest"
            ),
        },
        "components": {
            "schemas": {
                "Error": _ERROR,
                "ChatRequest": _chat(limits),
                "CompletionRequest": _completion(limits),
                "TokenRequest": _token_request(limits),
                "ResponsesRequest": _responses_request(limits),
            },
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
        "security": [{"bearer": []}],
    }
