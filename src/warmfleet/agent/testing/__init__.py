"""Local origins (HTTP, HF-compatible, OCI registry) for tests and benchmarks."""
