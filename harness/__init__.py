"""harness: paged-vs-tagma vLLM serving benchmarks.

Data flows config -> launcher -> workload -> client -> metrics -> report.
"""
