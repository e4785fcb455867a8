"""A Tinker-compatible training service: the official `tinker` SDK drives quartet (issue 51).

`wire` turns the SDK's protobuf bodies into plain arrays and back, `backend` runs the calls on a local
model (LoRA through quartet's model builder, on this process), `server` is the aiohttp service with its
sessions, futures, API key and errors. The protocol: docs/notes/tinker_protocol.md.
"""

from __future__ import annotations
