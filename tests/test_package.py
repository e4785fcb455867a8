"""The package imports cheaply: no Ray import, no cluster started, no model library loaded."""

import subprocess
import sys


def test_import_does_not_touch_ray_or_transformers() -> None:
    code = (
        "import sys, quartet, quartet.config, quartet.core.batch, quartet.core.choices\n"
        "assert 'ray' not in sys.modules, 'importing quartet imported ray'\n"
        "assert 'transformers' not in sys.modules, 'importing quartet imported transformers'\n"
        "print(quartet.__version__)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "0.1.0"


def test_import_leaves_ray_uninitialised() -> None:
    code = "import quartet, quartet.config, quartet.core.batch, ray\nassert not ray.is_initialized()\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
