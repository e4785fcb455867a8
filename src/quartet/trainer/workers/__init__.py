"""The running roles and the driver's ways to them: the workers started on their pools (`start`), the calls
the loop makes on the rollout group (`rollout_calls`) and the weight sync that brings the rollout up to the
actor (`weight_sync`)."""
