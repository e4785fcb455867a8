"""`quartet serve tinker --model NAME=FOLDER [...]`: a Tinker-compatible training service (issue 51).

The official `tinker` SDK then works unchanged against it: `tinker.ServiceClient(base_url=URL,
api_key=KEY)`. The key comes from `--api-key` or `QUARTET_TINKER_API_KEY` and must start with `tml-` (the
SDK refuses others). Checkpoints go to `--state-dir` (default `runs/tinker`, named in the start-up line)
and survive a restart. Needs the `tinker` extra. Runs until interrupted. Exit status: 0 stopped, 2 bad
arguments. What is served: docs/notes/tinker_protocol.md and `quartet.serving.tinker.server`.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
from pathlib import Path
from typing import Any

__all__ = ["add_parser", "parse_models", "run"]


def add_parser(sub: Any) -> None:
    parser = sub.add_parser("serve", help="serve a training API (tinker: the Tinker SDK's protocol)")
    kinds = parser.add_subparsers(dest="service", required=True)
    tinker = kinds.add_parser(
        "tinker", help="a Tinker-compatible service over local models (LoRA, CPU or GPU)"
    )
    tinker.add_argument(
        "--model", action="append", required=True, metavar="NAME=FOLDER",
        help="a base model clients may name, and its local folder (repeat for several)",
    )  # fmt: skip
    tinker.add_argument(
        "--api-key", default=None, help="the key clients send (default: $QUARTET_TINKER_API_KEY)"
    )
    tinker.add_argument("--host", default="127.0.0.1", help="address to listen on (default 127.0.0.1)")
    tinker.add_argument("--port", type=int, default=8000, help="port (default 8000; 0: any free port)")
    tinker.add_argument(
        "--state-dir", type=Path, default=Path("runs/tinker"),
        help="folder of saved checkpoints and run records, kept across restarts (default runs/tinker)",
    )  # fmt: skip
    tinker.add_argument(
        "--torch-threads", type=int, default=0,
        help="torch's CPU threads (default: torch's own); 1 keeps a loaded small CPU machine responsive",
    )  # fmt: skip
    tinker.set_defaults(run=run)


def parse_models(items: list[str]) -> dict[str, Path]:
    """`NAME=FOLDER` pairs as a mapping; ValueError names a malformed pair or a missing folder."""
    models: dict[str, Path] = {}
    for item in items:
        name, sep, folder = item.partition("=")
        if not sep or not name or not folder:
            raise ValueError(f"--model {item!r}: expected NAME=FOLDER")
        if not Path(folder).is_dir():
            raise ValueError(f"--model {item!r}: {folder} is not a folder")
        models[name] = Path(folder)
    return models


def run(args: Any) -> int:
    key = args.api_key or os.environ.get("QUARTET_TINKER_API_KEY", "")
    try:
        models = parse_models(args.model)
        if not key.startswith("tml-"):
            raise ValueError("the API key (--api-key or QUARTET_TINKER_API_KEY) must start with 'tml-'")
        from quartet.serving.tinker.server import TinkerServer

        if args.torch_threads > 0:
            import torch

            torch.set_num_threads(args.torch_threads)

        server = TinkerServer(models, api_key=key, host=args.host, port=args.port, state_dir=args.state_dir)
    except (ValueError, OSError) as err:  # OSError: a --state-dir that cannot be created
        print(f"quartet serve tinker: {err}", file=sys.stderr)
        return 2
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C is how the service is stopped
        asyncio.run(_serve(server))
    return 0


async def _serve(server: Any) -> None:
    url = await server.start()
    print(
        f"quartet serve tinker: {url} (tinker.ServiceClient(base_url={url!r}, api_key=...)); "
        f"checkpoints in {server.store.root}",
        flush=True,
    )
    try:
        await asyncio.Event().wait()
    finally:
        await server.stop()
