"""Measurement probes that run inside a server: not the system under test, the instruments that time it.

* :mod:`tagma.probes.host_time`: the host-time record format (a contract module: the harness imports it);
* :mod:`tagma.probes.host_time_hooks`: the wrappers that time the scheduler, the KV cache manager and the
  worker inside vLLM;
* :mod:`tagma.probes.telemetry`: the placement telemetry a KV cache manager writes.
"""
