"""The driver imports no training engine: the role classes it reads for their `@dispatch` declarations
import `TrainingEngine` where a role is built, in its host. On the device the driver's imports took 17 s of
the 40.6 s to the first step, so what it does not import is time saved on every run."""

from __future__ import annotations

import json
import subprocess
import sys

HOST_ONLY = (
    "quartet.engines.engine",  # TrainingEngine: FSDP2, the model build, the heads
    "quartet.engines.checkpoint",  # torch.distributed.checkpoint and transformers' model classes
    "torch.distributed.checkpoint",
    "peft",
)

PROBE = """
import json, sys
import quartet.cli.train_cmd, quartet.trainer
from quartet.trainer.workers.start import role_specs
from quartet.roles.actor import Actor
import quartet.engines
assert quartet.engines.EngineSpec is not None
print(json.dumps(sorted(m for m in {modules} if m in sys.modules)))
"""


def test_the_trainer_and_the_role_classes_import_no_engine() -> None:
    code = PROBE.format(modules=repr(HOST_ONLY))
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == []


def test_the_engine_is_still_there_when_asked_for() -> None:
    code = (
        "import quartet.engines as e, sys; e.TrainingEngine; print('quartet.engines.engine' in sys.modules)"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "True", done.stderr[-2000:]


def test_a_host_builds_its_engines_without_peft_or_transformers_trainer() -> None:
    """What every RL host imports (`early_hosts.HOST_MODULES` and the role classes) pulls in neither peft
    (only LoRA needs it) nor `transformers.trainer_utils` (transformers' LR schedules import both)."""
    code = (
        "import json, sys\n"
        "from quartet.cluster.early_hosts import HOST_MODULES, ROLE_MODULES\n"
        "import importlib\n"
        "for m in (*HOST_MODULES, *ROLE_MODULES.values()): importlib.import_module(m)\n"
        "print(json.dumps(sorted(m for m in ('peft', 'transformers.trainer_utils') if m in sys.modules)))"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout) == []
