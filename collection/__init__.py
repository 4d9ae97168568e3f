"""collection package."""
