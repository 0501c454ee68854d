"""The errors tagma raises when it refuses a configuration: one line, starting with ``tagma:``."""

from __future__ import annotations

__all__ = ["TagmaConfigError", "TagmaUnsupported"]


class TagmaConfigError(ValueError):
    """A configuration tagma refuses; its message is one line starting with ``tagma:``."""


class TagmaUnsupported(TagmaConfigError, NotImplementedError):
    """A feature tagma does not serve; the message reads ``tagma: unsupported: <feature>``.

    Raised at startup (fail-closed checks, the KV cache manager's own checks) and by vLLM calls that tagma
    cannot honour at run time (block-pool verbs that assume a free block queue, elastic-EP swaps). It is a
    ``TagmaConfigError`` (so a ``ValueError``) and a ``NotImplementedError``: code that catches either of
    those, as vLLM and the plugin do, keeps catching it.
    """

    def __init__(self, feature: str) -> None:
        super().__init__(f"tagma: unsupported: {feature}")
        self.feature = feature
