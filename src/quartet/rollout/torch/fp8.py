"""FP8 weights for the built-in rollout engine (`rollout.quantization=fp8`): half the bytes decode reads.

Decode at batch sizes below a few hundred rows reads every weight once per step and does little arithmetic
with it, so its time is the weights' bytes over the memory bandwidth. Storing the decoder layers' linear
weights (q/k/v/o_proj, gate/up/down_proj) as float8 e4m3 halves those bytes against bfloat16.

Format: each output channel (row of the [out, in] weight) has one float32 scale, amax(|row|) / 448 (448 is
e4m3's largest finite value), and the row divided by it is rounded to e4m3 with torch's cast (round to
nearest even). A row of zeros gets scale 1 and stays zeros; a row holding inf or nan is refused
(`Fp8QuantizationError`), since no scale represents it. After scaling, each element is off by at most
2^-4 of itself (3 mantissa bits, round to nearest) where it lands in e4m3's normal range (>= 2^-6), and by
at most 2^-10 x scale below it (the subnormal step is 2^-9).

Not quantized: the embeddings (a lookup of A rows per step, not a matmul over the whole table), the norms
(vectors), the routers and experts of MoE layers (not `nn.Linear` projections here), biases, and the output
head: its product is the logits themselves, so its rounding error lands on every sampled token's log-prob
unfiltered, and it is the part vLLM's and other frameworks' fp8 modes keep in 16 bits too.

Forward (`Fp8Linear`):
- CUDA with `torch._scaled_mm` and row-wise scaling (compute capability 9.0+, bfloat16 activations, both
  feature counts multiples of 16): the activations are quantized per token (one scale per row of x,
  amax / 448, so one outlier token does not crush the others' resolution; once per input tensor, shared by
  q/k/v_proj and by gate/up_proj: `TokenQuantizer`) and the product runs in fp8 with float32
  accumulation, scaled by (token scale x channel scale), written in bfloat16.
- Elsewhere (CPU, older GPUs, odd shapes): emulation, the weight dequantized to the compute dtype then
  `F.linear`; the activations stay in the compute dtype. This is what the CPU tests prove; the device run
  checks the scaled product against `scaled_reference`, its exact float32 twin.

Memory: the fp8 weight and its scales replace the 16/32-bit weight (the `nn.Linear` is dropped), so a
module holds out x in bytes + 4 x out. A weight sync (`load_weight`) quantizes the sent tensor and copies it
into the same two buffers: the runner calls the model's modules by attribute, and CUDA graphs captured
over these buffers see the new values, so the runner's "weights seen at once" contract holds.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from quartet.config.rollout import FP8_PROJECTIONS

__all__ = [
    "FP8_DTYPE",
    "FP8_MAX",
    "QUANTIZED_PROJECTIONS",
    "Fp8Linear",
    "Fp8QuantizationError",
    "TokenQuantizer",
    "dequantize_rows",
    "quantize_for_engine",
    "quantize_layers",
    "quantize_rows",
    "quantize_tokens",
    "scaled_mm_supported",
    "scaled_reference",
]

log = logging.getLogger(__name__)

FP8_DTYPE = torch.float8_e4m3fn
FP8_MAX = 448.0
"""Largest finite float8 e4m3fn value: a row's amax maps onto it."""
QUANTIZED_PROJECTIONS = FP8_PROJECTIONS
"""Names of the decoder layers' `nn.Linear` modules stored in fp8 (`config.rollout.FP8_PROJECTIONS`)."""
_MIN_TOKEN_SCALE = 1e-12  # an all-zero activation row: any positive scale gives zeros


class Fp8QuantizationError(ValueError):
    """A weight that cannot be stored in fp8 (inf or nan in a row, or not a matrix)."""


def quantize_rows(weight: torch.Tensor, name: str = "weight") -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [out, in], float32 scales [out]) of a 2-D weight, one scale per output channel (row).

    scale = amax(|row|) / 448 (1 for a row of zeros); q = e4m3(row / scale), clamped to +-448 first (the
    float32 division may land a hair above 448; older torch casts that to nan). `name` goes into the error
    of a row holding inf or nan, with the rows that do.
    """
    if weight.dim() != 2:
        raise Fp8QuantizationError(f"'{name}' has shape {tuple(weight.shape)}; fp8 rows need a 2-D weight")
    w = weight.detach().to(torch.float32)
    finite = torch.isfinite(w).all(dim=1)
    if not bool(finite.all()):
        bad = (~finite).nonzero().flatten().tolist()
        raise Fp8QuantizationError(
            f"'{name}' holds inf or nan in {len(bad)} of its {w.shape[0]} rows (first: {bad[:5]}); fp8 "
            "cannot scale such a row: find where the trainer's weights diverged, or set "
            "rollout.quantization=none"
        )
    amax = w.abs().amax(dim=1)
    scale = torch.where(amax > 0, amax / FP8_MAX, torch.ones_like(amax))
    q = (w / scale.unsqueeze(1)).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The weight fp8 rows `q` [out, in] with scales [out] stand for: q x scale in float32, as `dtype`."""
    return (q.to(torch.float32) * scale.unsqueeze(1)).to(dtype)


def quantize_tokens(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(fp8 [M, K], float32 scales [M, 1]) of activations x [M, K], one scale per token (row): amax / 448.

    The amax is taken in x's dtype (exact) and only the [M, 1] scales are made float32, so x is read
    twice and never copied to float32 whole (a decode step runs this per projection input)."""
    amax = x.abs().amax(dim=-1, keepdim=True).to(torch.float32)
    scale = amax.div_(FP8_MAX).clamp_(min=_MIN_TOKEN_SCALE)
    return (x / scale).clamp_(-FP8_MAX, FP8_MAX).to(FP8_DTYPE), scale


class TokenQuantizer:
    """`quantize_tokens` of the last input it saw, reused while the same tensor comes again.

    q/k/v_proj take one tensor, gate/up_proj another: `quantize_layers` gives every projection of a model
    one quantizer, so each input is quantized once (4 times a layer instead of 7). It holds the last input
    (by identity, so never a freed tensor's address reused) and its fp8 copy: one activation's memory. The
    runner and transformers' forward pass never change a projection's input in place between the calls
    that share it, which is what reuse by identity relies on.
    """

    def __init__(self) -> None:
        self._last: tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None = None

    def __call__(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(fp8 [M, K], scales [M, 1]) of x [..., K] flattened to M rows."""
        if self._last is not None and self._last[0] is x:
            return self._last[1], self._last[2]
        xq, xs = quantize_tokens(x.reshape(-1, x.shape[-1]))
        self._last = (x, xq, xs)
        return xq, xs


def scaled_reference(
    x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, bias: torch.Tensor | None = None
) -> torch.Tensor:
    """The device path's product in float32 on any device: per-token fp8 activations times the fp8 weight,
    each dequantized exactly, summed in float32; [..., out] in x's dtype. What `_scaled_mm` computes up to
    its accumulation order (the device check compares the two)."""
    flat = x.reshape(-1, x.shape[-1])
    xq, xs = quantize_tokens(flat)
    out = (xq.to(torch.float32) * xs) @ (q.to(torch.float32) * scale.unsqueeze(1)).t()
    if bias is not None:
        out = out + bias.to(torch.float32)
    return out.to(x.dtype).reshape(*x.shape[:-1], q.shape[0])


def scaled_mm_supported(device: torch.device) -> bool:
    """Whether `device` runs `torch._scaled_mm` with row-wise scales: CUDA at compute capability 9.0+."""
    if device.type != "cuda" or not hasattr(torch, "_scaled_mm"):
        return False
    return torch.cuda.get_device_capability(device) >= (9, 0)


class Fp8Linear(nn.Module):
    """A linear layer whose weight is fp8 rows with float32 scales (module docstring); bias as it was.

    Buffers: `weight` (float8_e4m3fn [out, in]; the trainer's parameter name, so weight syncs find it)
    and `weight_scale` (float32 [out]). `compute_dtype`: the dtype activations and outputs are in.
    """

    weight: torch.Tensor
    weight_scale: torch.Tensor

    def __init__(
        self,
        in_features: int,
        out_features: int,
        *,
        bias: nn.Parameter | None,
        compute_dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.compute_dtype = compute_dtype
        self.register_buffer("weight", torch.zeros(out_features, in_features, dtype=FP8_DTYPE, device=device))
        self.register_buffer("weight_scale", torch.ones(out_features, dtype=torch.float32, device=device))
        self.bias = bias
        self.scaled = scaled_mm_supported(torch.device(device)) and self._shapes_fit()
        """Whether a bfloat16 input takes `torch._scaled_mm` (set where the device supports it; tests set it
        on the CPU, whose torch runs the same kernel interface, to run the device path's code)."""
        self.tokens = TokenQuantizer()
        """The activations' quantizer (`quantize_layers` shares one among a model's projections)."""

    def _shapes_fit(self) -> bool:
        """`_scaled_mm` takes K and N multiples of 16, and row-wise scales with bfloat16 output only."""
        return (
            self.in_features % 16 == 0
            and self.out_features % 16 == 0
            and self.compute_dtype == torch.bfloat16
        )

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, name: str = "weight", device: torch.device | str | None = None
    ) -> Fp8Linear:
        """An fp8 copy of `linear` on `device` (default: linear's), quantized there; its bias object kept
        where it is, so a sync of `<name>.bias` still reaches it (moving the model moves it)."""
        out_features, in_features = linear.weight.shape
        module = cls(
            in_features,
            out_features,
            bias=linear.bias,
            compute_dtype=linear.weight.dtype,
            device=linear.weight.device if device is None else device,
        )
        module.load_weight(linear.weight, name)
        return module

    def load_weight(self, weight: torch.Tensor, name: str = "weight") -> None:
        """Quantize `weight` [out, in] (any float dtype and device) into this module's buffers, in place."""
        if tuple(weight.shape) != (self.out_features, self.in_features):
            raise ValueError(
                f"'{name}' has shape {tuple(weight.shape)}, the fp8 module's is "
                f"{(self.out_features, self.in_features)}"
            )
        q, scale = quantize_rows(weight.to(self.weight.device), name)
        with torch.no_grad():
            self.weight.copy_(q)
            self.weight_scale.copy_(scale)

    def dequantized(self, dtype: torch.dtype | None = None) -> torch.Tensor:
        """The weight this module computes with, in `dtype` (default: the compute dtype)."""
        return dequantize_rows(self.weight, self.weight_scale, dtype or self.compute_dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x [..., in] -> [..., out]: the scaled fp8 product on a capable GPU, else dequantize-then-linear."""
        if self.scaled and x.dtype == torch.bfloat16:
            return self.scaled_forward(x)
        return F.linear(x, self.dequantized(x.dtype), self.bias)

    def scaled_forward(self, x: torch.Tensor) -> torch.Tensor:
        """The device path: per-token fp8 activations (`tokens`) times the fp8 weight by `_scaled_mm`."""
        xq, xs = self.tokens(x)
        out = torch._scaled_mm(
            xq,
            self.weight.t(),  # [in, out] column-major, as the kernel takes its second operand
            scale_a=xs,
            scale_b=self.weight_scale.unsqueeze(0),
            out_dtype=x.dtype,
        )
        if self.bias is not None:
            out = out + self.bias
        return out.reshape(*x.shape[:-1], self.out_features)

    def _apply(self, fn: Any, recurse: bool = True) -> Fp8Linear:
        """`.to(device)` moves the buffers; a cast of the model (`.to(dtype)`, `.half()`) must not turn the
        fp8 codes or their float32 scales into another float type: those keep their dtypes (moved only)."""
        weight, scale = self.weight, self.weight_scale
        super()._apply(fn, recurse)  # type: ignore[no-untyped-call]
        if self.weight.dtype != FP8_DTYPE:
            self.weight = weight.to(self.weight.device)
        if self.weight_scale.dtype != torch.float32:
            self.weight_scale = scale.to(self.weight_scale.device)
        self.scaled = scaled_mm_supported(self.weight.device) and self._shapes_fit()
        return self

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, "
            f"bias={self.bias is not None}, fp8=e4m3 per-channel, compute_dtype={self.compute_dtype}"
        )


def quantize_layers(layers: Iterable[nn.Module], device: torch.device | str | None = None) -> int:
    """Replace the projections (`QUANTIZED_PROJECTIONS`) inside each decoder layer with `Fp8Linear`, in
    place; returns how many were replaced (projections already in fp8 are left as they are). Each bf16/fp32
    weight is dropped as its fp8 copy takes its place, so the peak is one projection beyond the model. All of
    them share one `TokenQuantizer`. `device`: where the fp8 copies go (default: where each weight is), so a
    model loaded on the CPU is quantized onto the GPU one matrix at a time and its 16-bit projections never
    all sit on the GPU."""
    count = 0
    tokens = TokenQuantizer()
    for i, layer in enumerate(layers):
        for parent_name, parent in list(layer.named_modules()):
            for child_name, child in list(parent.named_children()):
                if child_name in QUANTIZED_PROJECTIONS and type(child) is nn.Linear:
                    path = ".".join(p for p in (f"layers.{i}", parent_name, child_name) if p)
                    module = Fp8Linear.from_linear(child, f"{path}.weight", device)
                    module.tokens = tokens
                    setattr(parent, child_name, module)
                    count += 1
    return count


def quantize_for_engine(layers: Sequence[nn.Module], device: torch.device) -> list[Fp8Linear]:
    """`quantize_layers` for an engine on `device`, then its fp8 modules; logs how many run emulated, and
    warns on a GPU where some do (they save memory there, but decode slower than 16-bit weights)."""
    quantize_layers(layers)
    fp8 = [m for layer in layers for m in layer.modules() if isinstance(m, Fp8Linear)]
    emulated = sum(not m.scaled for m in fp8)
    log.info("rollout weights in fp8: %d projections, %d emulated", len(fp8), emulated)
    if emulated and device.type == "cuda":
        log.warning(
            "rollout.quantization=fp8: %d of %d projections run emulated on this GPU (scaled fp8 matmuls "
            "need compute capability 9.0+, rollout.dtype=bfloat16 and feature counts that are multiples of "
            "16): they save memory, but decode slower than without fp8",
            emulated,
            len(fp8),
        )
    return fp8
