"""One log line, not a traceback, for a request aiohttp's HTTP parser refuses.

A client that sends a 100 KB URL, 200 headers, a 100 KB header or `Content-Length: -5` gets a 400 from
aiohttp before any of this server's code runs; aiohttp then logs "Error handling request" with the
parser's whole traceback at ERROR (`RequestHandler.handle_error`), so every such client leaves a dozen
lines in the server's log that say nothing about the server. The server hands aiohttp its own logger
(`http_logger`), whose filter turns those records into one WARNING line naming the client, the status and
the parser's reason (cut to `REASON_CHARS`). Errors that are not the client's (anything but a 4xx parser
error) keep their traceback.
"""

from __future__ import annotations

import logging

from aiohttp.http_exceptions import HttpProcessingError

__all__ = ["REASON_CHARS", "http_logger"]

REASON_CHARS = 200
"""Longest reason kept in the line (a parser's reason may quote the whole 100 KB line)."""


class _OneLineParseErrors(logging.Filter):
    """Rewrites records of client HTTP parse errors (4xx) as one line at WARNING, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if isinstance(exc, HttpProcessingError) and 400 <= (exc.code or 0) < 500:
            lines = (exc.message or "").strip().splitlines() or [type(exc).__name__]
            reason = lines[0][:REASON_CHARS]
            record.msg = f"{record.getMessage()}: {exc.code} {type(exc).__name__}: {reason}"
            record.args = ()
            record.exc_info = None
            record.exc_text = None
            record.levelno = logging.WARNING
            record.levelname = "WARNING"
        return True


def http_logger() -> logging.Logger:
    """The logger aiohttp's request handlers log to (`quartet.serving.http`), with the one-line filter."""
    logger = logging.getLogger("quartet.serving.http")
    if not any(isinstance(f, _OneLineParseErrors) for f in logger.filters):
        logger.addFilter(_OneLineParseErrors())
    return logger
