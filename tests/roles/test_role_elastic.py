"""The actor's own state on an elastic resume (`EngineRole.load`, `quartet.engines.elastic`): a rank the
checkpoint has files for gets its shuffling generator back exactly; a rank it has none for takes the saved
counters (the update count) and a generator seeded from (seed, step, rank, "role"), not a copy of another
rank's. The second case is made from a real checkpoint by renaming rank 0's files to rank 1's, which is what
a rank of a larger world finds."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from quartet.config import ActorConfig
from quartet.engines.elastic import derived_seed
from quartet.roles.actor import Actor
from quartet.roles.run_values import RunValues

pytestmark = pytest.mark.usefixtures("one_local_rank")


def _saved(actor_config: ActorConfig, run_values: RunValues, folder: Path) -> Actor:
    actor = Actor(actor_config, run_values)
    torch.randperm(7, generator=actor.generator)  # the stream moved on, as after shuffled updates
    actor.updates = 3
    actor.save(str(folder))
    return actor


def test_own_files_restore_the_generator_and_new_ranks_get_a_derived_one(
    actor_config: ActorConfig, run_values: RunValues, tmp_path: Path
) -> None:
    saved = _saved(actor_config, run_values, tmp_path)
    own = Actor(actor_config, run_values)
    own.load(str(tmp_path))
    assert own.updates == 3 and torch.equal(own.generator.get_state(), saved.generator.get_state())

    for name in ("extra_rank", "role_rank"):  # this rank (0) is now one the checkpoint has no files for
        (tmp_path / f"{name}0.pt").rename(tmp_path / f"{name}1.pt")
    new = Actor(actor_config, run_values)
    new.load(str(tmp_path))
    assert new.updates == 3 and new.engine.steps == saved.engine.steps
    want = torch.Generator().manual_seed(derived_seed(run_values.seed, saved.engine.steps, 0, "role"))
    assert torch.equal(new.generator.get_state(), want.get_state())
    assert not torch.equal(new.generator.get_state(), saved.generator.get_state())
