"""The TRL virtual environment of the peer benchmarks: `.venv-trl`, made on first use, quartet's untouched.

It is layered over quartet's `.venv`: a `.pth` file puts `.venv`'s site-packages behind its own, so TRL
runs on the very same torch and transformers builds as quartet (a fair comparison, and no second 200 MB
torch), while `trl` and what it adds (`datasets`, `pandas`, ...) go into `.venv-trl` alone, held to the same
torch by `constraints.txt`. Nothing is installed into `.venv`.

    .venv/bin/python benchmarks/peers/trl_env.py      # make it (about 20 s); prints its python
"""

from __future__ import annotations

import subprocess
import sys
import sysconfig
import venv
from pathlib import Path

__all__ = ["TRL_VERSION", "TRL_VENV", "ensure_trl_venv"]

ROOT = Path(__file__).resolve().parents[2]
TRL_VENV = ROOT / ".venv-trl"
TRL_VERSION = "1.16.0"


def _site_packages(prefix: Path) -> Path:
    rel = Path(sysconfig.get_path("purelib")).relative_to(sysconfig.get_path("data"))
    return prefix / rel


def ensure_trl_venv(folder: Path = TRL_VENV, timeout_s: float = 900.0) -> Path:
    """Make (once) the TRL venv in `folder`; return its python. The stamp names the TRL version."""
    python = folder / "bin" / "python"
    stamp = folder / f".installed-trl-{TRL_VERSION}"
    if stamp.exists() and python.exists():
        return python
    host_site = _site_packages(Path(sys.prefix))
    if not (host_site / "torch").is_dir():
        raise RuntimeError(
            f"no torch in {host_site}: run the benchmark with quartet's venv (.venv/bin/python)"
        )
    venv.create(folder, with_pip=True, clear=True)
    (_site_packages(folder) / "zz_quartet_venv.pth").write_text(f"{host_site}\n")
    cmd = [str(python), "-m", "pip", "install", "--quiet", "-c", str(ROOT / "constraints.txt")]
    subprocess.run([*cmd, f"trl=={TRL_VERSION}"], check=True, timeout=timeout_s)
    check = f"import torch, trl; assert torch.__file__.startswith({str(host_site)!r}), torch.__file__"
    subprocess.run([str(python), "-c", check], check=True, timeout=120)
    stamp.touch()
    return python


if __name__ == "__main__":
    print(ensure_trl_venv())
