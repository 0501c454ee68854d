"""Host-side cost of paged vs tagma against vLLM's own code (``python -m benchmarks.host.main``)."""
