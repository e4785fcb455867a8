"""A Tinker-compatible training service: the official `tinker` SDK drives quartet (issue 51).

`wire` turns the SDK's protobuf bodies into plain arrays and back, `backend` runs the calls on a local
model (LoRA through quartet's model builder, on this process), `server` is the aiohttp service with its
sessions, futures, API key and errors. Sampling: `sampling` samples from a torch module (pure),
`sample_wire` decodes and checks the sample bodies and encodes `SampleResponse`, `samplers` holds the
sampling sessions and their routes. The protocol: docs/notes/tinker_protocol.md.
"""

from __future__ import annotations
