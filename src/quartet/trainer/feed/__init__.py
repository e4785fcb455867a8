"""Where each step's scored batch comes from: the prompt data, the batch sources (generated now, or ahead
on the rollout's own pool under admission control), dynamic sampling and the scoring of rollouts."""
