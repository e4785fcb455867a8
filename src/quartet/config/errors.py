"""The one exception type of the config layer."""

from __future__ import annotations

__all__ = ["ConfigError", "raise_problems", "require"]


class ConfigError(ValueError):
    """A config value is unknown, of the wrong type, impossible, or inconsistent with another one.

    `field` is the dotted path of the offending key (for example `actor.optim.lr`); `fix` tells the user what
    to change. Several problems found together are joined into one message.
    """

    def __init__(self, field: str, problem: str, fix: str = "", source: str = "") -> None:
        self.field = field
        self.problem = problem
        self.fix = fix
        self.source = source
        super().__init__(self._render())

    def _render(self) -> str:
        where = f" (from {self.source})" if self.source else ""
        text = f"{self.field}: {self.problem}{where}" if self.field else f"{self.problem}{where}"
        if self.fix:
            text += f"\n  fix: {self.fix}"
        return text

    def under(self, prefix: str, source: str = "") -> ConfigError:
        """The same error with its field path placed under `prefix` (used while descending a tree)."""
        field = f"{prefix}.{self.field}" if prefix and self.field else (prefix or self.field)
        return ConfigError(field, self.problem, self.fix, self.source or source)


def require(condition: bool, field: str, problem: str, fix: str = "") -> None:
    """Raise a ConfigError for `field` unless `condition` holds (for `__post_init__` checks)."""
    if not condition:
        raise ConfigError(field, problem, fix)


def raise_problems(problems: list[ConfigError]) -> None:
    """Raise the one problem as is, or one ConfigError listing all of them; nothing when there is none."""
    if len(problems) == 1:
        raise problems[0]
    if problems:
        listing = "\n".join(f"- {p}" for p in problems)
        raise ConfigError(problems[0].field, f"{len(problems)} config problems:\n{listing}")
