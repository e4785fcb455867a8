"""The whole configuration of a run: one field per component."""

from __future__ import annotations

from dataclasses import dataclass, field

from quartet.config.algorithm import AlgorithmConfig
from quartet.config.cluster import ClusterConfig
from quartet.config.data import DataConfig
from quartet.config.model import ModelConfig
from quartet.config.reward import RewardConfig
from quartet.config.roles import ActorConfig, CriticConfig, ReferenceConfig, TeacherConfig
from quartet.config.rollout import RolloutConfig
from quartet.config.sft import SFTConfig
from quartet.config.trainer import TrainerConfig

__all__ = ["QuartetConfig"]


@dataclass(frozen=True)
class QuartetConfig:
    """Every setting of a run. Defaults give the built-in demo: a tiny model on arithmetic, GRPO, on CPU."""

    data: DataConfig = field(default_factory=DataConfig)
    """Datasets and length limits."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""

    actor: ActorConfig = field(default_factory=ActorConfig)
    """Policy updates."""

    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    """Generation."""

    critic: CriticConfig = field(default_factory=CriticConfig)
    """Value model (GAE only)."""

    reference: ReferenceConfig = field(default_factory=ReferenceConfig)
    """Frozen reference policy (KL terms only)."""

    teacher: TeacherConfig = field(default_factory=TeacherConfig)
    """Frozen teacher of on-policy distillation (`algorithm.distill_coef`)."""

    reward: RewardConfig = field(default_factory=RewardConfig)
    """Scoring."""

    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    """Advantage estimator and in-reward KL."""

    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    """Outer loop and outputs."""

    cluster: ClusterConfig = field(default_factory=ClusterConfig)
    """Ray cluster and resource pool."""

    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised fine-tuning (`quartet sft`); unused by RL runs."""
