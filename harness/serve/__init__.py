"""Serving: start and stop vLLM servers (or the mock), read the model's context, watch the server and the
machine."""
