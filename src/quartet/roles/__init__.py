"""The model roles the driver calls, one module each: actor, reference, critic, reward model.

Each role is a plain class whose driver-facing methods declare their dispatch (`quartet.cluster.dispatch`);
`colocate` places several of them in one host process per device slot. Every role holds one
`TrainingEngine` and turns the RL math of `quartet.core` into its loss functions.
"""
