"""training/models package."""
