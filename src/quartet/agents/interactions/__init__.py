"""Built-in interactions (simulated users), each a subclass of `quartet.agents.interaction.Interaction`.

`guessing.GuessingGameInteraction`: hides an integer in a range and answers "Higher."/"Lower.".
"""

from quartet.agents.interactions.guessing import (
    HIGHER,
    INVALID,
    LOWER,
    GuessingGameInteraction,
    binary_search_transcript,
    last_integer,
    optimal_guess,
)

__all__ = [
    "HIGHER",
    "INVALID",
    "LOWER",
    "GuessingGameInteraction",
    "binary_search_transcript",
    "last_integer",
    "optimal_guess",
]
