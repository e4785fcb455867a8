"""Multi-turn agentic rollout: token-exact trajectories, agent loops, tools."""
