"""The one error of the tracking layer, and the check that raises it before any sink is built."""

from __future__ import annotations

import importlib

__all__ = ["TrackerUnavailableError", "require_module"]

EXTRA = "tracking"
"""The extra of `pyproject.toml` that holds every optional tracking package."""


class TrackerUnavailableError(RuntimeError):
    """A configured sink (or `quartet plot`) needs a package that is not installed."""


def require_module(module: str, needed_by: str, package: str | None = None) -> None:
    """Import `module` or raise `TrackerUnavailableError` naming the package and the extra.

    `needed_by` says who asked, e.g. "trainer.loggers has 'tensorboard'". The import itself is the check
    (not `importlib.util.find_spec`), so a package that is present but broken is reported too.
    """
    try:
        importlib.import_module(module)
    except ImportError as err:
        raise TrackerUnavailableError(
            f"{needed_by} but the {package or module} package is not installed: "
            f"pip install 'quartet[{EXTRA}]' ({err})"
        ) from err
