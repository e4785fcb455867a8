"""Recovery: what lets a run go on after a failure. Checkpoints (the trainer's state and the roles'), the
save of the last completed step on a failure, the export of a checkpoint, and rollout replicas restarted
when their process dies (`rollout.max_replica_restarts`): `replica_keeper` restarts a replica and brings it
to the current weights; `healing` hands the loop the rollout view and the weight sync that go through the
keeper, so the loop itself holds no recovery branch."""
