"""quartet: reinforcement-learning post-training of language models on Ray.

Importing the package is cheap and side-effect free: it neither imports Ray nor starts a cluster.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
