"""Workloads: what the client sends. ``registry`` picks the builder for a spec's ``kind``; ``spec`` holds the
spec and the built requests; the rest are the builders and their inputs (datasets, traces, lengths,
arrivals)."""
