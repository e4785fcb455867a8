"""quartet: reinforcement-learning post-training of language models on Ray.

Importing the package is cheap and side-effect free: it neither imports Ray nor starts a cluster.
"""

import time as _time

IMPORTED_AT = _time.time()
"""When this process first imported quartet (the start-up record's clock: `quartet.trainer.startup`)."""

__version__ = "0.1.0"
__all__ = ["IMPORTED_AT", "__version__"]
