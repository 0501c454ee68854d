"""harness: paged-vs-tagma vLLM serving benchmarks (config -> launcher -> workload -> client -> metrics -> report)."""
