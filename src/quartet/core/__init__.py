"""Pure tensor code shared by every layer: the Batch type and the RL algorithm choices."""
