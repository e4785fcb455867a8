"""The interaction interface: an async `Interaction` that plays the user in a multi-turn conversation.

A tool answers the model when the model calls it; an interaction answers when the model does *not* call a
tool. After each assistant turn without a tool call, the agent loop hands the whole conversation to the
interaction, which writes the simulated user's next message, decides whether the conversation is over, and
may score the trajectory (the role verl's `BaseInteraction` plays, with our own names and types).

Lifecycle, one instance per trajectory, the same shape as a `Tool`'s:

    instance_id = await interaction.start(**interaction_kwargs)     # from the row's extra_info
    reply = await interaction.respond(instance_id, messages)         # after each assistant turn
    ... the loop appends {"role": "user", "content": reply.content} until reply.done ...
    await interaction.finish(instance_id)                            # idempotent

`messages` are chat dicts (`{"role": ..., "content": ...}`), the last one the assistant's turn with the
model's decoded text as content. A reply's `score` is a reward for the whole trajectory; it may come at any
turn and the loop keeps the last one that is not None. `respond` must not block the event loop, since many
trajectories share it: do blocking work with `asyncio.to_thread` or in a subprocess.

Interactions are declared in YAML and built at start-up by `quartet.agents.interaction_registry`; their
constructor's keyword arguments are an entry's `config`, plus `name`.
"""

from __future__ import annotations

import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, ClassVar

__all__ = ["Interaction", "InteractionError", "InteractionReply", "check_name"]

_NAME = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")


class InteractionError(ValueError):
    """An interaction used wrongly: bad per-trajectory kwargs, an unknown instance, a bad name or option.

    The message says what is wrong and where to fix it (e.g. the row's `extra_info.interaction_kwargs`).
    """


@dataclass(frozen=True)
class InteractionReply:
    """The simulated user's answer to one assistant turn."""

    content: str
    """The user's next message; may be "" when `done` (nothing more is said)."""
    done: bool
    """True when the conversation is over: the model gets no further turn."""
    score: float | None = None
    """A reward for the trajectory, at the end or at any turn; the loop keeps the last one not None."""
    turn_reward: float | None = None
    """A reward for the model turn this reply answers alone (turn-level credit, algorithm.turn_reward_coef);
    None: the turn earns nothing."""
    metrics: dict[str, float] = field(default_factory=dict)
    """Numbers for logging (e.g. `interaction/guesses`), named `interaction/...` by convention."""


def check_name(name: object) -> str:
    """`name` when it is 1-64 letters, digits, `_`, `-` or `.`; else `InteractionError` saying so.

    Rows pick their interaction by this name, so it must survive YAML, JSON and parquet unchanged.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise InteractionError(
            f"an interaction name must be 1-64 letters, digits, '_', '-' or '.', got {name!r}"
        )
    return name


class Interaction(ABC):
    """A simulated user (see the module docstring for the lifecycle).

    Subclasses implement `respond`, set `default_name`, and call `super().__init__(name=name)` from a
    keyword-only constructor whose other arguments are the YAML entry's `config`. Subclasses with typed
    per-trajectory state override `start` (checking the kwargs) and `finish` (dropping the state).
    """

    default_name: ClassVar[str]
    """The name used when the YAML entry or the constructor gives none."""
    name: str
    """The name rows use to pick this interaction."""
    instances: dict[str, dict[str, Any]]
    """Per-trajectory kwargs by instance id, as `start` stored them."""

    def __init__(self, *, name: str | None = None) -> None:
        chosen = name if name is not None else getattr(type(self), "default_name", None)
        if chosen is None:
            raise InteractionError(f"{type(self).__name__} has no default_name; give a name")
        self.name = check_name(chosen)
        self.instances = {}

    async def start(self, instance_id: str | None = None, **kwargs: Any) -> str:
        """Start a per-trajectory instance holding `kwargs`; returns its id (a new uuid if None)."""
        instance_id = instance_id or uuid.uuid4().hex
        self.instances[instance_id] = dict(kwargs)
        return instance_id

    @abstractmethod
    async def respond(self, instance_id: str, messages: list[dict[str, Any]]) -> InteractionReply:
        """The user's reply to the conversation so far (the last message is the assistant's turn)."""

    async def finish(self, instance_id: str) -> None:
        """Forget the instance's state (idempotent)."""
        self.instances.pop(instance_id, None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"
