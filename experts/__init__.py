"""experts package."""
