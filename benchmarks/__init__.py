"""chunkstream benchmarks: ``python -m benchmarks.run --quick`` (see BENCHMARKS.md)."""
