"""`quartet inspect`: a local page over a run's curves and rollouts, token by token, and a comparison."""

from quartet.inspector.run_data import RunData, RunNotFoundError, SampleFilter

__all__ = ["RunData", "RunNotFoundError", "SampleFilter"]
