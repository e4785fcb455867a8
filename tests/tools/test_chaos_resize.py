"""The soak's `resize` fault (`tools/chaos_resize.py`): each resize switches the run's overrides to the other
world size, and the soak's config with them is one quartet accepts (validation checks the actor's
micro-batch against what one device of that world gets) with the world it says."""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tools"))

from chaos_config import ASYNC, KINDS, PATTERNS  # noqa: E402
from chaos_resize import current_world, resize  # noqa: E402

from quartet.config import load_config  # noqa: E402


def test_resizes_toggle_the_world_and_load() -> None:
    assert "resize" in KINDS and "resize" in PATTERNS
    overrides = [*ASYNC, "trainer.total_steps=10"]
    assert current_world(overrides) == 1
    worlds = []
    for _ in range(2):
        old, new = resize(overrides)
        assert old == current_world([]) or old == worlds[-1]
        cfg = load_config(None, overrides)
        assert cfg.cluster.world_size == new == current_world(overrides)
        assert cfg.actor.micro_batch_size_per_device == 16 // new
        worlds.append(new)
    assert worlds == [2, 1]
    assert sum(o.startswith("cluster.bundles_per_node=") for o in overrides) == 1  # replaced, not stacked
