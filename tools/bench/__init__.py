"""tools/bench package."""
