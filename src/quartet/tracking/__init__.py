"""Metric sinks of a run: JSONL (always), console, TensorBoard, W&B, MLflow; and `quartet plot`.

    from quartet.tracking import Tracking, TrackerUnavailableError

See `tracking.py` for the object the trainer holds, one `*_sink.py` module per destination, and `plot.py`
for the PNG of a run's curves. Importing this package imports none of the optional trackers.
"""

from quartet.tracking.errors import TrackerUnavailableError
from quartet.tracking.tracking import Tracking

__all__ = ["TrackerUnavailableError", "Tracking"]
