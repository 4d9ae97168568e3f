"""The `quadforge` command line, reports and benchmarks."""
