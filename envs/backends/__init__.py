"""envs/backends package."""
