"""The per-rank rule of an elastic resume (`quartet.engines.elastic`) on real files: which saved rank's file
each rank of the new world reads, the derived seed, and the line that says what changed."""

from __future__ import annotations

from pathlib import Path

import pytest

from quartet.engines.elastic import derived_seed, describe_change, elastic_source, saved_ranks


def _files(folder: Path, ranks: range) -> None:
    for r in ranks:
        (folder / f"extra_rank{r}.pt").write_bytes(b"x")
    (folder / "extra_rankX.pt").write_bytes(b"x")  # not a rank's file: ignored
    (folder / "role_rank0.pt").write_bytes(b"x")  # another prefix: ignored


def test_a_rank_reads_its_own_file_else_rank_0s(tmp_path: Path) -> None:
    _files(tmp_path, range(2))
    assert saved_ranks(tmp_path, "extra_rank") == [0, 1]
    own = elastic_source(tmp_path, "extra_rank", 1)
    assert own.own and own.path.name == "extra_rank1.pt" and own.saved_world == 2
    new = elastic_source(tmp_path, "extra_rank", 3)
    assert not new.own and new.path.name == "extra_rank0.pt"


def test_a_folder_without_rank_files_is_named(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match=f"{tmp_path} holds no extra_rank<rank>.pt"):
        elastic_source(tmp_path, "extra_rank", 0)


def test_derived_seeds_differ_by_rank_and_step_and_repeat() -> None:
    seeds = {derived_seed(7, step, rank) for step in (1, 2) for rank in range(4)}
    assert len(seeds) == 8 and all(0 <= s < 2**63 for s in seeds)
    assert derived_seed(7, 1, 2) == derived_seed(7, 1, 2)
    assert derived_seed(7, 1, 2) != derived_seed(8, 1, 2)
    assert derived_seed(7, 1, 2, "role") != derived_seed(7, 1, 2)  # a role's stream is not torch's


def test_the_change_line_names_new_and_dropped_ranks() -> None:
    assert describe_change(2, 2, "torch RNG") is None
    grown = describe_change(1, 3, "torch RNG")
    assert grown is not None and "from 1 to 3" in grown and "new ranks [1, 2] seeded" in grown
    shrunk = describe_change(4, 2, "torch RNG")
    assert shrunk is not None and "saved ranks [2, 3] dropped" in shrunk
