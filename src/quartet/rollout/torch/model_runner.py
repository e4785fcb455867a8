"""Forward passes of a transformers decoder-only LM over a `SlotKVCache`: batched prefill and decode.

The runner calls the model's own modules (embeddings, projections, norms, MLPs, rotary embedding, output
head) with their own weights, so a weight update to the model is seen at once and nothing is duplicated.
It replaces only the glue that transformers' `forward` adds around them: mask building, the cache object
and the attention call, which cannot express sequences of different lengths joining and leaving a batch.

Supported: Llama-style decoders (Llama, Qwen2, Qwen3, Mistral): per layer `input_layernorm`,
`self_attn.{q,k,v,o}_proj` (optional `q_norm`/`k_norm`), `post_attention_layernorm`, `mlp`; rotary position
embeddings in `model.model.rotary_emb`. Other families raise `UnsupportedModelError` instead of computing
something subtly different (Gemma scales embeddings, Phi fuses projections, gpt-oss's attention sinks,
DeepSeek-V3's latent attention: `config.moe_shapes.rollout_gap` names the missing piece).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quartet.config.moe_shapes import rollout_gap
from quartet.models.vision import vision_model
from quartet.rollout.torch.kernels import DecodeKernels
from quartet.rollout.torch.kernels.rope_cache import apply_rope, signed_sin
from quartet.rollout.torch.kv_cache import SlotKVCache
from quartet.rollout.torch.routing_record import RoutingRecorder

__all__ = ["SUPPORTED_MODEL_TYPES", "DecoderRunner", "UnsupportedModelError"]

SUPPORTED_MODEL_TYPES = frozenset(
    {"llama", "qwen2", "qwen3", "qwen3_moe", "mistral", "qwen2_vl", "qwen2_5_vl"}
)
_LAYER_PARTS = ("input_layernorm", "post_attention_layernorm", "mlp", "self_attn")
_ATTN_PARTS = ("q_proj", "k_proj", "v_proj", "o_proj")
# transformers' RMSNorm of these families: weight * (x in float32 * rsqrt(mean(x^2) + eps)).to(x.dtype)
_RMS_NORMS = frozenset({"LlamaRMSNorm", "Qwen2RMSNorm", "Qwen3RMSNorm", "Qwen3MoeRMSNorm", "MistralRMSNorm"})


class UnsupportedModelError(ValueError):
    """A model whose architecture the built-in engine's forward pass does not reproduce."""


def _norm(norm: Any, x: torch.Tensor) -> torch.Tensor:
    """The model's RMSNorm through `F.rms_norm` (one fused kernel on CUDA where transformers' forward launches
    seven; the same values: it normalises in float32 and casts back before the weight); other norms as is."""
    if type(norm).__name__ in _RMS_NORMS:
        out: torch.Tensor = norm.weight * F.rms_norm(x, (x.shape[-1],), eps=norm.variance_epsilon)
        return out
    result: torch.Tensor = norm(x)
    return result


class DecoderRunner:
    """Prefill and decode forwards of one transformers causal LM over a slot KV cache."""

    def __init__(self, model: nn.Module) -> None:
        wrapped: Any = model  # a transformers PreTrainedModel; its attributes are checked below
        config: Any = wrapped.config
        model_type = str(getattr(config, "model_type", "?"))
        if gap := rollout_gap(model_type):
            raise UnsupportedModelError(
                f"the built-in rollout engine does not compute {gap} of a '{model_type}' model; set "
                "rollout.engine=vllm, or train a model it decodes (docs/moe.md)"
            )
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise UnsupportedModelError(
                f"the built-in rollout engine supports {sorted(SUPPORTED_MODEL_TYPES)}, not '{model_type}'; "
                "use the vLLM engine for other architectures"
            )
        self.model = model
        self.vision: Any | None = vision_model(model)
        """Qwen2-VL style models: the trunk with the vision tower and `get_rope_index` (`models.vision`)."""
        self.base: Any = wrapped.model if self.vision is None else self.vision.language_model
        config = getattr(config, "text_config", config)
        self.lm_head: nn.Module = wrapped.lm_head
        self.layers: list[Any] = list(self.base.layers)
        for part in ("embed_tokens", "norm", "rotary_emb"):
            if not hasattr(self.base, part):
                raise UnsupportedModelError(f"{type(model).__name__}.model has no '{part}'")
        for i, layer in enumerate(self.layers):
            missing = [p for p in _LAYER_PARTS if not hasattr(layer, p)]
            missing += [f"self_attn.{p}" for p in _ATTN_PARTS if not hasattr(layer.self_attn, p)]
            if missing:
                raise UnsupportedModelError(f"layer {i} of {type(model).__name__} lacks {missing}")
        attn = self.layers[0].self_attn
        self.head_dim = int(attn.head_dim)
        self.num_heads = int(config.num_attention_heads)
        self.num_kv_heads = int(config.num_key_value_heads)
        self.scaling = float(attn.scaling)
        self.has_qk_norm = hasattr(attn, "q_norm")
        max_len = int(config.max_position_embeddings)
        # Full attention equals windowed attention while sequences fit in the window; cap them there.
        windows = [int(w) for layer in self.layers if (w := getattr(layer.self_attn, "sliding_window", None))]
        self.max_model_len = min([max_len, *windows])
        self.recorder: RoutingRecorder | None = None
        """Records each MoE layer's top-k experts per token (`record_routing`); None: nothing recorded."""
        self.last_routing: torch.Tensor | None = None
        """The last forward's routing [tokens, L, k] (prefill: G * P padded positions, row-major; decode: A
        rows) while a recorder is on; None otherwise."""
        norms = [self.base.norm, *(getattr(x, n) for x in self.layers for n in _LAYER_PARTS[:2])]
        self.fusable = all(type(n).__name__ in _RMS_NORMS for n in norms)
        """Every norm of the trunk is an RMSNorm, so `kernels` may fuse the residual adds into them."""
        self.kernels: DecodeKernels | None = None
        """The decode step's fused operations (`kernels.select_kernels`); None: the torch path as written
        here. Set by the engine from `rollout.fused_kernels`; the prefill never uses them."""
        self.last_hidden: torch.Tensor | None = None
        """The last prefill's final hidden states [G, P, D] (before the final norm) when it was asked to keep
        them (`prefill(keep_hidden=True)`, for prompt log-probs through `head`); None otherwise."""

    def record_routing(self, on: bool) -> None:
        """Record (or stop recording) the MoE routing of this runner's forwards (`routing_record`)."""
        if on and self.recorder is None:
            self.recorder = RoutingRecorder(self.model)
        elif not on and self.recorder is not None:
            self.recorder.remove()
            self.recorder = None
            self.last_routing = None

    @property
    def device(self) -> torch.device:
        """Device of the model's weights."""
        return next(self.model.parameters()).device

    @property
    def vocab_size(self) -> int:
        """Rows of the input embedding: the token ids a prompt may hold are 0..vocab_size-1."""
        return int(self.base.embed_tokens.num_embeddings)

    @property
    def dtype(self) -> torch.dtype:
        """Compute dtype (that of the weights)."""
        return next(self.model.parameters()).dtype

    def new_cache(self, num_slots: int) -> SlotKVCache:
        """An empty (unallocated) cache shaped for this model."""
        return SlotKVCache(
            len(self.layers), num_slots, self.num_kv_heads, self.head_dim, self.dtype, self.device
        )

    # ---- pieces of a layer ------------------------------------------------------------------------------

    def _qkv(
        self, attn: Any, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Rotated queries [B, H, S, hd], keys and values [B, kvH, S, hd] of normed hidden [B, S, D]."""
        q, k, v = self._projections(attn, h)
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def _projections(self, attn: Any, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries [B, H, S, hd], keys and values [B, kvH, S, hd] of normed hidden [B, S, D], not rotated."""
        batch, seq, _ = h.shape
        q = attn.q_proj(h).view(batch, seq, -1, self.head_dim)
        k = attn.k_proj(h).view(batch, seq, -1, self.head_dim)
        v = attn.v_proj(h).view(batch, seq, -1, self.head_dim)
        if self.has_qk_norm:  # Qwen3: RMSNorm per head before the rotation
            q, k = _norm(attn.q_norm, q), _norm(attn.k_norm, k)
        return q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)

    def _decode_attention(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, bias: torch.Tensor
    ) -> torch.Tensor:
        """One query per row against its cached keys, grouped-query aware, without copying the cache.

        q [A, H, 1, hd]; k [A, kvH, hd, L] (keys transposed), v [A, kvH, L, hd] (strided views of the cache);
        bias [A * kvH, 1, L] additive mask (each row's, repeated per key/value head).
        Returns [A, 1, H * hd]. Query heads are grouped per key/value head as a batched matmul over
        A * kvH, instead of repeating K/V to H heads (transformers' SDPA path copies the whole cache
        per layer and step when a mask is given).
        """
        rows, length = q.shape[0], v.shape[2]
        group = self.num_heads // self.num_kv_heads
        qg = q.reshape(rows * self.num_kv_heads, group, self.head_dim)
        kg = k.reshape(rows * self.num_kv_heads, self.head_dim, length)
        vg = v.reshape(rows * self.num_kv_heads, length, self.head_dim)
        scores = torch.baddbmm(bias, qg, kg, alpha=self.scaling)  # bias + scaling * q @ k: one kernel
        probs = torch.softmax(scores, dim=-1, dtype=torch.float32).to(q.dtype)
        out = torch.bmm(probs, vg)
        return out.view(rows, 1, self.num_heads * self.head_dim)

    def _mlp_block(self, layer: Any, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = x + layer.mlp(_norm(layer.post_attention_layernorm, x))
        return out

    def _logits(self, last_hidden: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.lm_head(_norm(self.base.norm, last_hidden))
        return out

    def head(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits [..., V] of final hidden states [..., D] (as `last_hidden` keeps them): norm, then head."""
        return self._logits(hidden)

    # ---- forwards ---------------------------------------------------------------------------------------

    def prefill(
        self,
        input_ids: torch.Tensor,
        lengths: torch.Tensor,
        cache: SlotKVCache,
        start: int,
        expand: torch.Tensor | None,
        vision: tuple[torch.Tensor, torch.Tensor] | None = None,
        keep_hidden: bool = False,
    ) -> torch.Tensor:
        """Run G right-padded prompts, store their keys/values in slots start.., return next-token logits.

        input_ids [G, P] int64 (right-padded), lengths [G] int64 (real lengths), expand [S] int64 or None
        (see `SlotKVCache.write_prefill`). Returns logits [G, V] at each prompt's last real token.
        vision: a VLM's input embeddings [G, P, D] (image features in place) and M-RoPE positions [3, G, P]
        (`rollout.torch.vision_prefill`). keep_hidden: keep every position's final hidden state in
        `last_hidden` (prompt log-probs).
        """
        groups, seq = input_ids.shape
        self.last_hidden = None
        if self.recorder is not None:
            self.recorder.begin()
        positions = torch.arange(seq, device=input_ids.device)
        causal = positions.unsqueeze(0) <= positions.unsqueeze(1)  # [P(query), P(key)]
        valid_key = positions.unsqueeze(0) < lengths.unsqueeze(1)  # [G, P(key)]
        mask = (causal.unsqueeze(0) & valid_key.unsqueeze(1)).unsqueeze(1)  # [G, 1, P, P]
        h = self.base.embed_tokens(input_ids) if vision is None else vision[0]
        rope_positions = positions.unsqueeze(0).expand(groups, seq) if vision is None else vision[1]
        cos, sin = self.base.rotary_emb(h, rope_positions)
        cos, sin = cos.unsqueeze(1), signed_sin(sin.unsqueeze(1))
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, _norm(layer.input_layernorm, h), cos, sin)
            cache.write_prefill(i, k, v, start, expand)
            out = F.scaled_dot_product_attention(
                q, k, v, attn_mask=mask, scale=self.scaling, enable_gqa=self.num_heads != self.num_kv_heads
            )
            h = h + attn.o_proj(out.transpose(1, 2).reshape(groups, seq, -1))
            h = self._mlp_block(layer, h)
        last = h[torch.arange(groups, device=h.device), lengths - 1]
        if keep_hidden:
            self.last_hidden = h
        if self.recorder is not None:
            self.last_routing = self.recorder.finish()
        return self._logits(last)

    def decode(
        self,
        tokens: torch.Tensor,
        lengths: torch.Tensor,
        max_length: int,
        cache: SlotKVCache,
        rope_deltas: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """One decoding step for slots 0..A-1: feed `tokens`, append to the cache, return next logits.

        tokens [A] int64 (each sequence's newest token, not yet in the cache); lengths [A] int64 (cached
        tokens per sequence = the new token's position); max_length = max(lengths) + 1 (host int).
        Returns logits [A, V]. The caller increments `lengths`. rope_deltas [A] (M-RoPE models): each row's
        position is its length plus its delta.
        """
        rows = tokens.shape[0]
        if self.recorder is not None:
            self.recorder.begin()
        h = self.base.embed_tokens(tokens.unsqueeze(1))  # [A, 1, D]
        positions = lengths if rope_deltas is None else lengths + rope_deltas
        cos, sin = self.base.rotary_emb(h, positions.unsqueeze(1))
        cos, sin = cos.unsqueeze(1), signed_sin(sin.unsqueeze(1))
        row_index = torch.arange(rows, device=tokens.device)
        keys = torch.arange(max_length, device=tokens.device)
        hidden = (keys.unsqueeze(0) > lengths.unsqueeze(1)).unsqueeze(1)  # [A, 1, L] True = not yet written
        bias = torch.zeros(hidden.shape, dtype=h.dtype, device=h.device)
        bias.masked_fill_(hidden, torch.finfo(h.dtype).min)
        bias = bias.repeat_interleave(self.num_kv_heads, dim=0)  # [A * kvH, 1, L], once for every layer
        if self.kernels is not None and self.fusable:
            return self._fused_decode(self.kernels, h, cos, sin, bias, lengths, max_length, cache)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._qkv(attn, _norm(layer.input_layernorm, h), cos, sin)
            k_all, v_all = cache.write_decode(i, k, v, row_index, lengths, max_length)
            h = h + attn.o_proj(self._decode_attention(q, k_all, v_all, bias))
            h = self._mlp_block(layer, h)
        if self.recorder is not None:
            self.last_routing = self.recorder.finish()
        return self._logits(h[:, 0])

    def _fused_decode(
        self,
        kernels: DecodeKernels,
        h: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        bias: torch.Tensor,
        lengths: torch.Tensor,
        max_length: int,
        cache: SlotKVCache,
    ) -> torch.Tensor:
        """`decode`'s layers through `kernels`: each residual add fused with the norm after it, and RoPE
        with the cache write. h [A, 1, D] embeddings; cos, sin [A, 1, 1, hd] (sin signed). Returns logits
        [A, V]."""
        rows = h.shape[0]
        first = self.layers[0].input_layernorm
        normed, residual = kernels.add_rms_norm(h, torch.zeros_like(h), first.weight, first.variance_epsilon)
        for i, layer in enumerate(self.layers):
            attn = layer.self_attn
            q, k, v = self._projections(attn, normed)
            q = kernels.rope_cache(q, k, v, cos, sin, cache.keys[i], cache.values[i], lengths)
            k_all, v_all = cache.keys[i][:rows, ..., :max_length], cache.values[i][:rows, :, :max_length]
            attn_out = attn.o_proj(self._decode_attention(q, k_all, v_all, bias))
            post = layer.post_attention_layernorm
            normed, residual = kernels.add_rms_norm(attn_out, residual, post.weight, post.variance_epsilon)
            after = self.layers[i + 1].input_layernorm if i + 1 < len(self.layers) else self.base.norm
            normed, residual = kernels.add_rms_norm(
                layer.mlp(normed), residual, after.weight, after.variance_epsilon
            )
        if self.recorder is not None:
            self.last_routing = self.recorder.finish()
        out: torch.Tensor = self.lm_head(normed[:, 0])
        return out
