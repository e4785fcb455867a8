"""`TinkerServiceConfig`: what `quartet serve tinker CONFIG` reads (a YAML file), with its limits.

```yaml
models:                       # the base_model names clients may ask for -> local folders
  tiny: /models/tiny
api_key_env: QUARTET_TINKER_API_KEY   # the key is read from this environment variable, never the file
host: 127.0.0.1
port: 8000
state_dir: runs/tinker          # checkpoints and the run registry (what survives a restart)
max_queued_per_model: 64      # beyond it: 429 with Retry-After (the SDK retries on its own)
max_tokens_per_request: 131072
max_num_samples: 64
max_sample_tokens: 4096
max_sampler_adapters: 16      # sampler weights kept loaded per base model (LRU; reloaded from disk)
result_ttl_s: 900             # a finished result nobody fetched is dropped after this (410 afterwards)
session_ttl_s: 600            # no heartbeat for this long: the session's models are unloaded (410 to it)
shutdown_grace_s: 30          # SIGTERM: running calls get this long; queued ones are cancelled
torch_threads: 0              # 0: torch's own choice
backend: local                # or ray: each base model in a Ray actor of its own
ray_address: ""               # backend ray: as cluster.address (empty: RAY_ADDRESS or a local Ray)
gpus_per_base: 0              # backend ray: GPUs per base model's actor
call_timeout_s: 600
```

Unknown keys and bad values are refused naming the key and the file (`config.loader.from_dict`).
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

from quartet.config.errors import ConfigError, require
from quartet.config.loader import from_dict

__all__ = ["ServiceSettings", "TinkerServiceConfig", "load_service_config"]


@dataclasses.dataclass(frozen=True)
class ServiceSettings:
    """Every setting but the models (module doc)."""

    api_key_env: str = "QUARTET_TINKER_API_KEY"
    """The environment variable holding the API key (it must start with `tml-`)."""

    host: str = "127.0.0.1"
    port: int = 8000
    state_dir: str = "runs/tinker"
    """Checkpoints (`tinker://` paths resolve under it only) and the registry of created models."""

    max_queued_per_model: int = 64
    max_tokens_per_request: int = 131072
    max_num_samples: int = 64
    max_sample_tokens: int = 4096
    max_sampler_adapters: int = 16
    """Sampler adapters (saved weights being sampled) kept loaded per base model, least recently used out."""

    result_ttl_s: float = 900.0
    session_ttl_s: float = 600.0
    """A session with no heartbeat for this long is over: its models are unloaded (unsaved state is lost)."""

    shutdown_grace_s: float = 30.0
    torch_threads: int = 0
    backend: str = "local"
    """Where base models run: `local` (this process) or `ray` (a Ray actor per base model)."""

    ray_address: str = ""
    """`backend: ray`: the cluster to join (as `cluster.address`: empty, `auto`, `local`, `host:port`)."""

    ray_namespace: str = "quartet-tinker"
    gpus_per_base: float = 0.0
    """`backend: ray`: GPUs each base model's actor takes."""

    start_timeout_s: float = 300.0
    """How long loading a base model (in its actor) may take."""

    call_timeout_s: float = 600.0
    """`backend: ray`: how long one call on a base model may take before it fails naming this key."""

    def __post_init__(self) -> None:
        require(0 <= self.port <= 65535, "port", "must be in [0, 65535]")
        for key in (
            "max_queued_per_model", "max_tokens_per_request", "max_num_samples", "max_sample_tokens",
            "max_sampler_adapters",
        ):  # fmt: skip
            require(getattr(self, key) >= 1, key, "must be >= 1")
        require(self.result_ttl_s > 0, "result_ttl_s", "must be > 0")
        require(self.session_ttl_s > 0, "session_ttl_s", "must be > 0")
        require(self.shutdown_grace_s >= 0, "shutdown_grace_s", "must be >= 0")
        require(self.backend in ("local", "ray"), "backend", f"is {self.backend!r}", "use local or ray")
        require(self.gpus_per_base >= 0, "gpus_per_base", "must be >= 0")
        require(self.start_timeout_s > 0, "start_timeout_s", "must be > 0")
        require(self.call_timeout_s > 0, "call_timeout_s", "must be > 0")
        require(self.torch_threads >= 0, "torch_threads", "must be >= 0 (0: torch's own choice)")

    def api_key(self) -> str:
        """The key from `api_key_env`; ConfigError naming the variable if unset or not `tml-...`."""
        key = os.environ.get(self.api_key_env, "")
        if not key.startswith("tml-"):
            raise ConfigError(
                "api_key_env", f"${self.api_key_env} is unset or does not start with 'tml-'",
                fix=f"export {self.api_key_env}=tml-<secret> (the SDK only sends keys that start with tml-)",
            )  # fmt: skip
        return key


@dataclasses.dataclass(frozen=True)
class TinkerServiceConfig(ServiceSettings):
    """The Tinker service's settings (module doc): the settings and the base models."""

    models: dict[str, str] = dataclasses.field(default_factory=dict)
    """Base model names -> local model folders (nothing is downloaded)."""

    def __post_init__(self) -> None:
        super().__post_init__()
        require(bool(self.models), "models", "is empty", "name a base model: models: {tiny: /path}")
        for name, folder in self.models.items():
            require(
                Path(folder).expanduser().is_dir(), f"models.{name}", f"{folder} is not a folder",
                "give the local folder of a transformers model",
            )  # fmt: skip


def load_service_config(path: str | Path, **overrides: object) -> TinkerServiceConfig:
    """The config in YAML file `path`, with `overrides` (command-line flags) on top."""
    import yaml

    file = Path(path)
    try:
        data = yaml.safe_load(file.read_text()) or {}
    except (OSError, yaml.YAMLError) as err:
        raise ConfigError("", f"cannot read {file}: {err}", source=str(file)) from err
    if not isinstance(data, dict):
        raise ConfigError("", "expected a mapping of settings", source=str(file))
    data.update({k: v for k, v in overrides.items() if v is not None})
    models = data.pop("models", {})
    if not isinstance(models, dict) or not all(isinstance(v, str | Path) for v in models.values()):
        raise ConfigError("models", "must map names to folders", "models: {tiny: /path/to/model}", str(file))
    plain = from_dict(ServiceSettings, data, source=str(file))
    try:
        folders = {str(k): str(v) for k, v in models.items()}
        return TinkerServiceConfig(models=folders, **dataclasses.asdict(plain))
    except ConfigError as err:
        raise err.under("", str(file)) from None
