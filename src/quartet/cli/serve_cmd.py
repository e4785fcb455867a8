"""`quartet serve tinker [CONFIG] [--model NAME=FOLDER ...]`: a Tinker-compatible training service (issue 51).

The official `tinker` SDK then works unchanged against it: `tinker.ServiceClient(base_url=URL,
api_key=KEY)`. CONFIG is a YAML file (`serving.tinker.service_config`: models, limits, state folder);
flags override it, and `--model` alone needs no file. The key comes from `--api-key` or the config's
`api_key_env` (default `QUARTET_TINKER_API_KEY`) and must start with `tml-` (the SDK refuses others). Needs
the `tinker` extra. Runs until SIGINT or SIGTERM, then stops gracefully (running calls get
`shutdown_grace_s`, queued ones are cancelled, nothing is saved that no client asked for). Exit status: 0
stopped, 2 bad arguments or config. What is served: docs/tinker.md.
"""

from __future__ import annotations

import asyncio
import signal
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
    tinker.add_argument("config", nargs="?", default=None, help="a YAML service config (optional)")
    tinker.add_argument(
        "--model", action="append", default=None, metavar="NAME=FOLDER",
        help="a base model clients may name, and its local folder (repeatable; replaces the config's)",
    )  # fmt: skip
    tinker.add_argument(
        "--api-key", default=None, help="the key clients send (default: $QUARTET_TINKER_API_KEY)"
    )
    tinker.add_argument("--host", default=None, help="address to listen on (default 127.0.0.1)")
    tinker.add_argument("--port", type=int, default=None, help="port (default 8000; 0: any free port)")
    tinker.add_argument(
        "--state-dir", default=None, help="checkpoints and the model registry (default runs/tinker)"
    )
    tinker.add_argument(
        "--torch-threads", type=int, default=None,
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
    from quartet.config.errors import ConfigError

    try:
        config = _config(args)
        key = args.api_key or config.api_key()
        if not key.startswith("tml-"):
            raise ValueError("the API key (--api-key or QUARTET_TINKER_API_KEY) must start with 'tml-'")
        from quartet.serving.tinker.server import TinkerServer

        if config.torch_threads > 0:
            import torch

            torch.set_num_threads(config.torch_threads)
        server = TinkerServer(config.models, api_key=key, host=config.host, port=config.port, config=config)
    except (ValueError, ConfigError, OSError) as err:  # OSError: a state_dir that cannot be created
        print(f"quartet serve tinker: {err}", file=sys.stderr)
        return 2
    asyncio.run(_serve(server))
    return 0


def _config(args: Any) -> Any:
    """The service config: the file (if given), then the flags on top."""
    from quartet.serving.tinker.service_config import TinkerServiceConfig, load_service_config

    flags: dict[str, Any] = {
        "host": args.host, "port": args.port, "state_dir": args.state_dir,
        "torch_threads": args.torch_threads,
    }  # fmt: skip
    if args.model:
        flags["models"] = {name: str(folder) for name, folder in parse_models(args.model).items()}
    if args.config is not None:
        return load_service_config(args.config, **flags)
    if not args.model:
        raise ValueError("give a CONFIG file or at least one --model NAME=FOLDER")
    return TinkerServiceConfig(**{k: v for k, v in flags.items() if v is not None})


async def _serve(server: Any) -> None:
    """Serve until SIGINT or SIGTERM, then stop gracefully."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    url = await server.start()
    state_dir = Path(server.config.state_dir).resolve()
    hint = f"tinker.ServiceClient(base_url={url!r}, api_key=...)"
    print(f"quartet serve tinker: {url} ({hint}); checkpoints in {state_dir}", flush=True)
    try:
        await stop.wait()
    finally:
        print(
            f"quartet serve tinker: stopping (running calls get {server.config.shutdown_grace_s:g} s)",
            flush=True,
        )
        await server.stop()
