"""envs/tasks package."""
