"""evaluation package: closed-loop evaluation jobs, their metrics and reports (above collection)."""
