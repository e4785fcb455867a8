"""Typed run configuration: one frozen dataclass per component, YAML + CLI loading, cross-field checks.

cfg = load_config("run.yaml", ["actor.optim.lr=1e-5", "rollout.n=4"])   # built and validated
text = to_yaml(cfg)                                                       # the resolved YAML
"""

from quartet.config.algorithm import AlgorithmConfig, KLControl, KLControlConfig
from quartet.config.cluster import Backend, ClusterConfig, DeviceKind, PlacementStrategy
from quartet.config.data import BuiltinTask, DataConfig, OverlongPrompt
from quartet.config.docs import field_docs, iter_field_docs
from quartet.config.errors import ConfigError
from quartet.config.loader import apply_overrides, from_dict, load_config, to_dict, to_yaml
from quartet.config.model import Dtype, LoraConfig, ModelConfig, TinyArch, TinyModelConfig
from quartet.config.optim import LrSchedule, OptimConfig
from quartet.config.plan import OldLogprobs, RefLogprobs, StepPlan, plan_step
from quartet.config.reward import RewardConfig
from quartet.config.roles import (
    ActorConfig,
    CriticConfig,
    MicroBatching,
    ReferenceConfig,
    Role,
    RoutingReplay,
)
from quartet.config.rollout import (
    FusedKernels,
    RolloutConfig,
    RolloutEngineKind,
    RolloutInterface,
    RolloutQuantization,
    SamplingConfig,
    WeightApply,
    WeightSyncConfig,
    WeightTransport,
)
from quartet.config.root import QuartetConfig
from quartet.config.sft import ArithmeticOp, SFTBuiltinConfig, SFTConfig
from quartet.config.trainer import AlarmMode, Logger, StalenessControl, TrainerConfig, TrainerMode
from quartet.config.validate import sft_rules, validate

__all__ = [
    "ActorConfig",
    "AlarmMode",
    "AlgorithmConfig",
    "ArithmeticOp",
    "Backend",
    "BuiltinTask",
    "ClusterConfig",
    "ConfigError",
    "CriticConfig",
    "DataConfig",
    "DeviceKind",
    "Dtype",
    "KLControl",
    "KLControlConfig",
    "Logger",
    "LoraConfig",
    "LrSchedule",
    "MicroBatching",
    "ModelConfig",
    "OldLogprobs",
    "OptimConfig",
    "OverlongPrompt",
    "PlacementStrategy",
    "QuartetConfig",
    "RefLogprobs",
    "ReferenceConfig",
    "RewardConfig",
    "Role",
    "RoutingReplay",
    "FusedKernels",
    "RolloutConfig",
    "RolloutEngineKind",
    "RolloutInterface",
    "RolloutQuantization",
    "StalenessControl",
    "TrainerMode",
    "WeightApply",
    "WeightTransport",
    "WeightSyncConfig",
    "SFTBuiltinConfig",
    "SFTConfig",
    "SamplingConfig",
    "StepPlan",
    "TinyArch",
    "TinyModelConfig",
    "TrainerConfig",
    "apply_overrides",
    "field_docs",
    "from_dict",
    "iter_field_docs",
    "load_config",
    "plan_step",
    "sft_rules",
    "to_dict",
    "to_yaml",
    "validate",
]
