"""Rule scorers with verl's signature: GSM8K, competition math, and the built-in tasks (by `data_source`)."""

from quartet.rewards.rules.registry import (
    GSM8K_SOURCES,
    MATH_SOURCES,
    UnknownDataSourceError,
    default_compute_score,
    known_data_sources,
    select_scorer,
)

__all__ = [
    "GSM8K_SOURCES",
    "MATH_SOURCES",
    "UnknownDataSourceError",
    "default_compute_score",
    "known_data_sources",
    "select_scorer",
]
