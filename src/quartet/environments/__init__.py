"""Environments from the ecosystem, outside quartet's own tasks (issue 52). First: reasoning-gym's
procedural tasks as prompt rows scored by reasoning-gym's own verifiers (`environments.reasoning_gym`)."""

from __future__ import annotations
