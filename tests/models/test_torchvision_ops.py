"""`quartet.models.torchvision_ops`: a torchvision whose compiled ops do not load imports after `import
quartet`, and nothing is declared (or imported) where torchvision is absent or its ops load.

The stand-in package fails exactly as the CUDA torchvision 0.28.0 does beside the CPU torch: its `_C.so`
does not load, and its `__init__` registers a fake kernel for `torchvision::nms` unconditionally. Each case
runs in its own interpreter: declared operators are process-wide.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

_STAND_IN = """
import torch
@torch.library.register_fake("torchvision::nms")
def _fake_nms(dets, scores, iou_threshold):
    return dets.new_empty(0, dtype=torch.long)
"""


def _run(code: str, site: Path) -> subprocess.CompletedProcess[str]:
    """Run `code` in a fresh interpreter with `site` (the stand-in torchvision) first on the path."""
    src = str(Path(__file__).resolve().parents[2] / "src")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), src])}
    return subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120, check=False
    )


@pytest.fixture
def site(tmp_path: Path) -> Path:
    package = tmp_path / "torchvision"
    package.mkdir()
    (package / "__init__.py").write_text(_STAND_IN)
    (package / "_C.so").write_bytes(b"not a shared library")  # dlopen fails: OSError, as a CUDA-linked one
    return tmp_path


def test_the_stand_in_fails_without_the_guard(site: Path) -> None:
    result = _run("import torchvision", site)
    assert result.returncode != 0
    assert "torchvision::nms does not exist" in result.stderr


def test_import_quartet_lets_it_import(site: Path) -> None:
    code = (
        "import sys, quartet\n"
        "assert 'torch' not in sys.modules, 'import quartet imported torch'\n"
        "import torchvision, torch\n"
        "from quartet.models.torchvision_ops import declare_missing_torchvision_ops\n"
        "assert declare_missing_torchvision_ops()\n"
        "assert torch._C._dispatch_has_kernel_for_dispatch_key('torchvision::nms', 'Meta')\n"
        "assert torch.ops.torchvision.qnms.default._schema.arguments[2].name == 'iou_threshold'\n"
    )
    result = _run(code, site)
    assert result.returncode == 0, result.stderr


@pytest.mark.skipif(importlib.util.find_spec("torchvision") is not None, reason="torchvision is installed")
def test_nothing_declared_without_torchvision(tmp_path: Path) -> None:
    code = (
        "import sys, quartet\n"
        "from quartet.models.torchvision_ops import declare_missing_torchvision_ops\n"
        "assert not declare_missing_torchvision_ops()\n"
        "assert 'torch' not in sys.modules and 'torchvision' not in sys.modules\n"
    )
    result = _run(code, tmp_path)  # an empty folder: no torchvision on the path (none in quartet's venv)
    assert result.returncode == 0, result.stderr
