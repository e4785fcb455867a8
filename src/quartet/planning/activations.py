"""Working memory of one micro-batch: what the training engine and the rollout engine allocate while they run.

Notation: a micro-batch of N tokens (rows x T positions, T = prompt + response), N_r of which produce
logits (rows x (R + 1): the engine asks for `logits_to_keep = R' + 1`); D hidden, I intermediate, q = heads
x head_dim, V vocabulary, H query heads; f = 4 bytes (float32), c = bytes of the compute dtype (2 under
bfloat16 autocast, 4 without autocast). Weights are float32 (the engine's master weights).

Training forward/backward (autograd keeps, per token and per decoder layer; counted with
`torch.autograd.graph.saved_tensors_hooks` on Qwen2 in tests/planning, within a few percent):

    RMSNorm x 2          4 f D   each keeps its float32 input and normalised output (the residual is float32)
    q/k/v inputs         3 c D   autocast casts the input once per projection (f D, shared, without autocast)
    attention            4 c q   SDPA keeps q, k, v (GQA-repeated to q: batches are padded, so a mask is
                                 passed and transformers repeats K/V) and its output (= o_proj's input)
    attention lse        f H
    attention mask       c T     SDPA converts the boolean [b, 1, T, T] mask to a float one per layer
    MLP inputs           2 c D   (f D, shared, without autocast)
    MLP                  4 c I   gate (SiLU input), SiLU output, up, and their product (down's input)
                                 (a sparse MoE layer: I = k Im (+ a shared expert's), `mlp_width`, and
                                 `moe_router_bytes`: router logits and probabilities, each chosen
                                 expert's gathered input and weighted output; docs/moe.md)
    (qwen3 q/k norms     2 f (q + kv);  LoRA under autocast: one more input cast per adapted module)

so about 16 D + 6 D + 8 q + 4 D + 8 I bytes under bfloat16 autocast (70 D for a Qwen2 with I = 3 D).
Outside the layers: the final norm (2 f D per token), and under autocast the half-precision copies of
every trainable linear weight, which autocast caches for the whole forward and autograd keeps until
backward (c bytes per weight). With gradient checkpointing a layer keeps only its float32 input (f D per
token) and one layer at a time is recomputed in backward. During backward, gradient temporaries of about
one layer's activations exist on top of what is still saved.

Logits, which dominate small models (V >> D): `response_logprobs` computes z = logits.float() / T per
chunk of 1024 positions and log p = z[target] - logsumexp(z); autograd keeps each chunk's z (f V N_r).
While the forward returns, the half-precision logits [b, R'+1, V] and the contiguous copy that the
reshape of their [:, :-1] slice makes (2 c V N_r) also exist, and in backward their gradients take the
same room. An entropy bonus keeps one more float32 copy (f V N_r).

No-grad passes (old/reference log-probs, values) free each layer's tensors before the next layer: their
working set is the float32 residual and norm output plus the larger of attention (inputs, q, repeated
k/v, output) and MLP (input, gate, up, product), for all N tokens, plus the logits: half-precision logits
and the reshape copy, then for the entropy (always computed with old log-probs) a float32 copy divided by
the temperature (two float32 copies at once when the logits are half precision). Autocast caches weight
casts only for parameters that require grad: the actor and critic hold c bytes per linear weight during
the pass; a frozen model casts one weight at a time.

Rollout (built-in engine, inference mode, weights in `rollout.dtype` r): the KV cache holds, per slot,
its longest sequence rounded up to 64 positions (`SlotKVCache`), for every slot of `max_num_seqs`. A
prefill of up to 8192 prompt tokens (the engine's default `max_prefill_tokens`) needs the residual, norm
and MLP temporaries of those tokens plus a [G, 1, P, P] mask; decoding needs [S, V] logits and the
sampler's float32 copies (scaled logits, probabilities, and a sort with int64 indices).

Packed micro-batches (`model.remove_padding`): no attention mask exists (attention runs within each row's
span) and the logits are those of the kept positions only: [1, K, V] needs no slice, so neither the
reshape copy of a no-grad pass nor, in backward, the slice's zero-padded gradient exists (c V N_r less;
measured on CPU with a 32k vocabulary: 1.18x the measured peak with it left out, 1.47x with it counted).

Tensor parallelism (tp ranks, `planning.parallel`): attention by heads and the MLP by intermediate columns,
so their saved tensors (q/k/v, attention output, lse, gate/up/product, qwen3's q/k norms) and the logits
(vocabulary-parallel head) are divided by tp; the residual stream, the norms and the projections' input
casts are whole on every rank (the input of a column-split projection is replicated).

Expert parallelism (`model.expert_parallel_size` > 1, `planning.experts`): each MoE layer's (token, k) pairs
travel to their experts' ranks and back by all-to-all; one layer's buffers at a time are `ep_dispatch`
(`experts.dispatch_bytes`), and the combine saves the returned pairs in the compute dtype (not a float32
weighted output).

The fused LM head (`model.fused_head`, `engines.fused_head`) never builds the logits: it computes them one
block of `FUSED_TOKEN_CHUNK` tokens x `FUSED_VOCAB_BLOCK` entries at a time. Its peak (`fused_head_bytes`)
is the kept hidden states cast to the compute dtype, the block's temporaries (the matmul output and about
four float32 copies: scaled logits, exponentials, probabilities, gradient; one more for the entropy) and
the weight block's cast, plus in backward the float32 gradient of the hidden states (pieces and their
concatenation).
"""

from __future__ import annotations

from dataclasses import dataclass

from quartet.planning.experts import dispatch_bytes
from quartet.planning.model_shape import HeadKind, ModelShape
from quartet.planning.parallel import tp_linear_params

__all__ = [
    "F32",
    "FUSED_TOKEN_CHUNK",
    "FUSED_VOCAB_BLOCK",
    "LOGPROB_CHUNK",
    "MicroBatch",
    "forward_working_bytes",
    "fused_head_bytes",
    "gkd_support_bytes",
    "kv_cache_bytes",
    "layer_saved_bytes_per_token",
    "prefill_tokens",
    "rollout_working_bytes",
    "train_working_bytes",
]

F32 = 4
LOGPROB_CHUNK = 1024
"""Positions per chunk of the log-softmax and of the entropy (`engines.heads`, `core.entropy`)."""
FUSED_TOKEN_CHUNK = 4096
"""Tokens per chunk of the fused head (`engines.fused_head.TOKEN_CHUNK`; a test keeps them equal)."""
FUSED_VOCAB_BLOCK = 8192
"""Vocabulary entries per block of the fused head (`engines.fused_head.VOCAB_BLOCK`)."""
_KV_QUANTUM = 64  # SlotKVCache grows in whole blocks of positions
_PREFILL_TOKENS = 8192  # TorchRolloutEngine's default max_prefill_tokens


@dataclass(frozen=True)
class MicroBatch:
    """One forward pass on one device."""

    tokens: int
    """N: positions through the trunk (rows x seq_len, padding included)."""

    seq_len: int
    """T: positions per row (prompt + response)."""

    logit_positions: int
    """N_r: positions whose output-head logits are computed (rows x (response + 1))."""

    packed: bool = False
    """Rows packed end to end (`model.remove_padding`): no attention mask, no logits reshape copy."""


def layer_saved_bytes_per_token(
    shape: ModelShape,
    compute_bytes: int,
    seq_len: int,
    lora_inputs: int = 0,
    *,
    tp: int = 1,
    packed: bool = False,
    ep: int = 1,
) -> int:
    """Bytes autograd keeps per token in one decoder layer on one rank (see the module doc's table).

    `lora_inputs`: summed input widths of the LoRA-adapted linear modules of a layer (each adapter casts its
    input once more under autocast). `tp`: ranks of the tensor group (the head-split attention and the
    column-split MLP divide by it). `packed`: no attention mask. `ep`: expert parallelism (the combine's
    saved pairs).
    """
    d, c = shape.hidden_size, compute_bytes
    autocast = c < F32
    norms = 4 * F32 * d
    inputs = (3 * c * d + 2 * c * d) if autocast else 2 * F32 * d
    attention = (4 * c * shape.q_dim + F32 * shape.num_heads) // tp + (0 if packed else c * seq_len)
    mlp = 4 * c * shape.mlp_width // tp + moe_router_bytes(shape, c, ep)
    qk_norm = 2 * F32 * (shape.q_dim + shape.kv_dim) // tp if shape.qk_norm else 0
    lora = c * lora_inputs if autocast else 0
    return norms + inputs + attention + mlp + qk_norm + lora


def moe_router_bytes(shape: ModelShape, compute_bytes: int, ep: int = 1) -> int:
    """Bytes a sparse (MoE) layer keeps per token besides its experts' gate/up/product (`mlp_width`): the
    router's logits (c E) and float32 probabilities (f E), and per chosen expert the gathered input (c D)
    and the weighted output (f D) that is summed into the layer's output; under expert parallelism
    (`ep` > 1) the combine keeps the returned pair in the compute dtype instead (c D). 0 for a dense model."""
    if not shape.is_moe:
        return 0
    k, c = shape.experts_per_token, compute_bytes
    weighted = c if ep > 1 else F32
    return (c + F32) * shape.num_experts + k * (c + weighted) * shape.hidden_size


def _trunk_extra_bytes(shape: ModelShape, mb: MicroBatch, compute_bytes: int) -> int:
    """Saved outside the layers: final norm, ids, rotary tables, the boolean mask, the head's input casts."""
    per_token = 2 * F32 * shape.hidden_size + 2 * F32 * shape.head_dim + 16 + (0 if mb.packed else mb.seq_len)
    head_inputs = compute_bytes * shape.hidden_size * mb.logit_positions if compute_bytes < F32 else 0
    return per_token * mb.tokens + head_inputs


def _logits_chunk(shape: ModelShape, mb: MicroBatch, tp: int = 1) -> int:
    return F32 * (shape.vocab_size // tp) * min(mb.logit_positions, LOGPROB_CHUNK)


def fused_head_bytes(
    shape: ModelShape, logit_positions: int, compute_bytes: int, *, tp: int = 1, backward: bool, entropy: bool
) -> int:
    """Peak of the fused LM head on one rank (module doc): the hidden states of the kept positions cast to
    the compute dtype, one [chunk, block] block's temporaries and weight cast, and in backward the float32
    gradient of the hidden states twice (its pieces, then their concatenation). Under tensor parallelism the
    block is one of this rank's V / tp entries."""
    d = shape.hidden_size
    c = compute_bytes
    n = logit_positions
    chunk = min(n, FUSED_TOKEN_CHUNK)
    block = min(-(-shape.vocab_size // tp), FUSED_VOCAB_BLOCK)
    temporaries = chunk * block * (c + F32 * (4 + (1 if entropy else 0)))
    hidden = c * d * n if c < F32 else 0
    weight = c * block * d if c < F32 else 0
    grad_hidden = 2 * F32 * d * n if backward else 0
    return hidden + temporaries + weight + grad_hidden


def train_working_bytes(
    shape: ModelShape,
    mb: MicroBatch,
    compute_bytes: int,
    *,
    head: HeadKind,
    gradient_checkpointing: bool,
    trainable_linear_params: int,
    lora_inputs: int = 0,
    entropy: bool = False,
    tp: int = 1,
    fused_head: bool = False,
    ep: int = 1,
    gkd_top_k: int = 0,
) -> dict[str, int]:
    """Peak working memory of one micro-batch's forward + backward on one rank, by component.

    `trainable_linear_params`: linear weights that require grad (autocast keeps a half-precision copy of
    each until backward; 0 without autocast), as this rank holds them (its tensor-parallel shard). `ep`:
    expert parallelism (adds one MoE layer's all-to-all buffers, `ep_dispatch`). `gkd_top_k` > 0: the
    student's log-probs at the teacher's top k per position (`gkd_support_bytes`).
    """
    per_token = layer_saved_bytes_per_token(
        shape, compute_bytes, mb.seq_len, lora_inputs, tp=tp, packed=mb.packed, ep=ep
    )
    per_layer = per_token * mb.tokens
    if gradient_checkpointing:
        # Each layer keeps its float32 input; backward recomputes one layer and makes its gradients.
        layers = shape.num_layers * F32 * shape.hidden_size * mb.tokens + 2 * per_layer
    else:
        layers = shape.num_layers * per_layer + per_layer  # saved + one layer of gradient temporaries
    out = {"activations": layers + _trunk_extra_bytes(shape, mb, compute_bytes)}
    if ep > 1 and shape.is_moe:
        out["ep_dispatch"] = dispatch_bytes(shape, mb.tokens, compute_bytes)
    if compute_bytes < F32 and trainable_linear_params:
        if gradient_checkpointing:  # only the head's cast outlives the forward; one layer's during recompute
            layer = shape.layer_linear_params // tp
            top = shape.linear_params(head) - shape.layers_linear_params
            kept = min(trainable_linear_params, top // (tp if head is HeadKind.CAUSAL_LM else 1) + layer)
        else:
            kept = trainable_linear_params
        out["autocast_weights"] = compute_bytes * kept
    if head is HeadKind.CAUSAL_LM and fused_head:
        out["fused_head"] = fused_head_bytes(
            shape, mb.logit_positions, compute_bytes, tp=tp, backward=True, entropy=entropy
        )
    elif head is HeadKind.CAUSAL_LM:
        v_nr = shape.vocab_size // tp * mb.logit_positions
        copies = 1 if mb.packed else 2  # backward: the logits' gradient (and, padded, the slice's padded one)
        logits = F32 * v_nr + copies * compute_bytes * v_nr + 2 * _logits_chunk(shape, mb, tp)
        out["logits"] = logits + (F32 * v_nr if entropy else 0)
    if head is HeadKind.CAUSAL_LM and gkd_top_k:
        out["gkd_support"] = gkd_support_bytes(
            shape, mb.logit_positions, compute_bytes, gkd_top_k, fused_head
        )
    return out


def gkd_support_bytes(shape: ModelShape, positions: int, compute_bytes: int, k: int, fused_head: bool) -> int:
    """GKD's student side (`engines.support_head`): with the fused head, the k gathered weight rows per
    position [N, k, D] in the compute dtype, saved for the backward, and their gradient's twin; with the
    plain logits, one more float32 log-softmax [N, V] that the gather's backward keeps."""
    if fused_head:
        return 2 * compute_bytes * k * shape.hidden_size * positions
    return F32 * shape.vocab_size * positions


def forward_working_bytes(
    shape: ModelShape,
    mb: MicroBatch,
    compute_bytes: int,
    *,
    head: HeadKind,
    with_entropy: bool,
    caches_weights: bool,
    tp: int = 1,
    fused_head: bool = False,
    ep: int = 1,
) -> dict[str, int]:
    """Peak working memory of one no-grad forward (log-probs, values, scores) on one rank, by component.

    `caches_weights`: the parameters require grad (actor, critic), so autocast keeps a half-precision copy
    of every linear weight (this rank's tensor-parallel shard) for the whole pass; a frozen model casts one
    weight at a time. `ep`: expert parallelism (one MoE layer's all-to-all buffers, `ep_dispatch`).
    """
    d = shape.hidden_size
    i = shape.mlp_width
    c = compute_bytes
    attention = c * d + c * 4 * shape.q_dim // tp
    mlp = c * d + c * 3 * i // tp
    per_token = 2 * F32 * d + max(attention, mlp) + F32 * d  # residual, norm output, widest block; final norm
    mask = 0 if mb.packed else mb.tokens * mb.seq_len * (1 + F32)  # boolean mask and its float form
    out = {"activations": per_token * mb.tokens + mask}
    if ep > 1 and shape.is_moe:
        out["ep_dispatch"] = dispatch_bytes(shape, mb.tokens, c)
    if c < F32:
        causal = head is HeadKind.CAUSAL_LM
        if caches_weights:
            out["autocast_weights"] = c * tp_linear_params(shape, head, tp)
        else:
            widest = shape.vocab_size * d // tp if causal else max(d * i, d * shape.q_dim) // tp
            out["autocast_weights"] = c * widest
    if head is HeadKind.CAUSAL_LM and fused_head:
        out["fused_head"] = fused_head_bytes(
            shape, mb.logit_positions, c, tp=tp, backward=False, entropy=with_entropy
        )
    elif head is HeadKind.CAUSAL_LM:
        v_nr = shape.vocab_size // tp * mb.logit_positions
        chunk = _logits_chunk(shape, mb, tp)
        logprobs = (0 if mb.packed else c * v_nr) + 2 * chunk  # packed: no reshape copy
        entropy = (F32 * v_nr * (2 if c < F32 else 1) + 3 * chunk) if with_entropy else 0
        out["logits"] = c * v_nr + max(logprobs, entropy)
    return out


def kv_cache_bytes(shape: ModelShape, slots: int, tokens_per_slot: int, dtype_bytes: int) -> int:
    """KV cache of `slots` sequences of up to `tokens_per_slot` positions (rounded up to whole blocks)."""
    capacity = -(-tokens_per_slot // _KV_QUANTUM) * _KV_QUANTUM
    return slots * capacity * shape.kv_bytes_per_token(dtype_bytes)


def prefill_tokens(prompts: int, prompt_len: int) -> int:
    """Prompt tokens the built-in engine prefills together: whole groups up to `max_prefill_tokens`."""
    return max(1, min(prompts, _PREFILL_TOKENS // max(prompt_len, 1))) * prompt_len


def rollout_working_bytes(
    shape: ModelShape, prompts: int, prompt_len: int, samples: int, dtype_bytes: int
) -> dict[str, int]:
    """Peak working memory of generation besides weights and KV cache, by component.

    prompts: prompt groups prefilled together (each sampled `samples / prompts` times); samples: sequences
    decoded together.
    """
    r, d = dtype_bytes, shape.hidden_size
    tokens = prefill_tokens(prompts, prompt_len)
    groups = tokens // max(prompt_len, 1)
    prefill = tokens * (4 * r * d + 2 * F32 * d + 3 * r * shape.mlp_width)
    prefill += groups * prompt_len * prompt_len  # boolean attention mask
    prefill += samples * prompt_len * 2 * shape.kv_dim * r  # one layer's keys/values repeated per sample
    sampling = samples * shape.vocab_size * (r + 3 * F32 + 8)  # logits, scaled, probs, sort indices
    return {"activations": max(prefill, sampling)}
