"""Weight-sync errors cross process boundaries intact: a Ray actor's exception reaches the driver by pickle,
and one that cannot be rebuilt arrives as `UnserializableException`, naming nothing."""

from __future__ import annotations

import pickle

from quartet.weight_sync.errors import GroupJoinError, WeightSyncError


def test_weight_sync_errors_survive_a_pickle_round_trip() -> None:
    errors = [
        WeightSyncError(183, "bucket 1 or end header", 428288, "Connection closed by peer"),
        WeightSyncError(None, "header", 0, "this process closed the group"),
        GroupJoinError("127.0.0.1:9600", 3, 2, "timed out after 60 s"),
        GroupJoinError("127.0.0.1:9600", 2, -1, "the sender's store is unreachable"),
    ]
    for error in errors:
        back = pickle.loads(pickle.dumps(error))
        assert type(back) is type(error) and str(back) == str(error) and vars(back) == vars(error)
    assert "weight sync of version 183 failed at bucket 1 or end header after 428288" in str(errors[0])
