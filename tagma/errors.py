"""Every error tagma raises, in one hierarchy under :class:`TagmaBaseError`.

* configuration refusals: :class:`TagmaConfigError` (a ``ValueError``; one line starting with ``tagma:``)
  and :class:`TagmaUnsupported` (also a ``NotImplementedError``);
* the engine library missing or unloadable: :class:`EngineNotBuiltError` (an ``ImportError``);
* a non-OK status from the C engine: :class:`TagmaError` and one subclass per status (the status codes
  mirror ``tagma/csrc/tagma.h``);
* an argument the binding refuses before it reaches the ABI (it would wrap in ctypes, or make the engine read
  past a buffer): the status's class, or one of :class:`InvalidMemberError`, :class:`TokenIdsError` and
  :class:`TokenRangeError`, which also keep the builtin base Python code expects there.

Each class keeps its builtin base, so ``except ValueError`` / ``NotImplementedError`` / ``ImportError``
clauses keep catching what they caught. This module imports only the standard library.
"""

from __future__ import annotations

from typing import Final

__all__ = [
    "ERROR_CLASSES",
    "STATUS_NAMES",
    "BlockStateError",
    "EngineNotBuiltError",
    "InternalError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "InvalidMemberError",
    "MisalignedError",
    "NoSpaceError",
    "OutOfRangeError",
    "RequestNotFoundError",
    "TagmaBaseError",
    "TagmaConfigError",
    "TagmaError",
    "TagmaOverflowError",
    "TagmaUnsupported",
    "TokenIdsError",
    "TokenRangeError",
    "error_for_status",
]

# Status codes (tagma.h).
TAGMA_OK: Final = 0
TAGMA_E_INVALID_ARG: Final = 1
TAGMA_E_INVALID_HANDLE: Final = 2
TAGMA_E_NOT_FOUND: Final = 3
TAGMA_E_NO_SPACE: Final = 4
TAGMA_E_MISALIGNED: Final = 5
TAGMA_E_OUT_OF_RANGE: Final = 6
TAGMA_E_OVERFLOW: Final = 7
TAGMA_E_STATE: Final = 8
TAGMA_E_INTERNAL: Final = 9

STATUS_NAMES: Final[dict[int, str]] = {
    TAGMA_OK: "TAGMA_OK",
    TAGMA_E_INVALID_ARG: "TAGMA_E_INVALID_ARG",
    TAGMA_E_INVALID_HANDLE: "TAGMA_E_INVALID_HANDLE",
    TAGMA_E_NOT_FOUND: "TAGMA_E_NOT_FOUND",
    TAGMA_E_NO_SPACE: "TAGMA_E_NO_SPACE",
    TAGMA_E_MISALIGNED: "TAGMA_E_MISALIGNED",
    TAGMA_E_OUT_OF_RANGE: "TAGMA_E_OUT_OF_RANGE",
    TAGMA_E_OVERFLOW: "TAGMA_E_OVERFLOW",
    TAGMA_E_STATE: "TAGMA_E_STATE",
    TAGMA_E_INTERNAL: "TAGMA_E_INTERNAL",
}


class TagmaBaseError(Exception):
    """The base of every error tagma raises."""


# --------------------------------------------------------------------------------------------- errors


class EngineNotBuiltError(TagmaBaseError, ImportError):
    """The engine's shared library is missing or cannot be loaded."""


class TagmaError(TagmaBaseError):
    """A non-OK status from the engine; ``status`` is the tagma_status, ``message`` its last-error text."""

    status: int
    message: str

    def __init__(self, status: int, message: str) -> None:
        self.status = status
        self.message = message
        name = STATUS_NAMES.get(status, f"status {status}")
        super().__init__(f"{message} [{name}]" if message else name)


class InvalidArgumentError(TagmaError):
    """TAGMA_E_INVALID_ARG: zero/negative count, null pointer, unknown policy."""


class InvalidHandleError(TagmaError):
    """TAGMA_E_INVALID_HANDLE: unknown or destroyed engine handle."""


class RequestNotFoundError(TagmaError):
    """TAGMA_E_NOT_FOUND: unknown or released request id."""


class NoSpaceError(TagmaError):
    """TAGMA_E_NO_SPACE: not enough free + evictable blocks."""


class MisalignedError(TagmaError):
    """TAGMA_E_MISALIGNED: count not a multiple of the engine's alignment."""


class OutOfRangeError(TagmaError):
    """TAGMA_E_OUT_OF_RANGE: block id or coordinate outside its bounds."""


class TagmaOverflowError(TagmaError):
    """TAGMA_E_OVERFLOW: arithmetic would overflow int64."""


class BlockStateError(TagmaError):
    """TAGMA_E_STATE: operation not valid for the block's state (e.g. attach a free block)."""


class InternalError(TagmaError):
    """TAGMA_E_INTERNAL: allocation failure or broken invariant inside the engine."""


# ------------------------------------------------------------------- arguments refused by the binding


class InvalidMemberError(InvalidArgumentError, ValueError):
    """An enum argument (placement policy, eviction mode) that names no member: an unknown name, or a value
    that is not one of the members (one outside the C type's range included). Also a ``ValueError``."""


class TokenIdsError(InvalidArgumentError, TypeError):
    """Token ids the engine cannot read: not a list, tuple, ``ConstantList`` or sequence of ints, or a buffer
    that is not 1-D, C-contiguous native int32 (``bytes``, an int64 array, a strided memoryview). Also a
    ``TypeError``; both token paths (the C list reader and the fallback) raise it with the same message."""


class TokenRangeError(OutOfRangeError, OverflowError):
    """A token id outside int32. Also an ``OverflowError``."""


ERROR_CLASSES: Final[dict[int, type[TagmaError]]] = {
    TAGMA_E_INVALID_ARG: InvalidArgumentError,
    TAGMA_E_INVALID_HANDLE: InvalidHandleError,
    TAGMA_E_NOT_FOUND: RequestNotFoundError,
    TAGMA_E_NO_SPACE: NoSpaceError,
    TAGMA_E_MISALIGNED: MisalignedError,
    TAGMA_E_OUT_OF_RANGE: OutOfRangeError,
    TAGMA_E_OVERFLOW: TagmaOverflowError,
    TAGMA_E_STATE: BlockStateError,
    TAGMA_E_INTERNAL: InternalError,
}


def error_for_status(status: int, message: str) -> TagmaError:
    """The exception for a non-OK engine status (its class from :data:`ERROR_CLASSES`)."""
    return ERROR_CLASSES.get(status, TagmaError)(status, message)


# ------------------------------------------------------------------------------ configuration refusals


class TagmaConfigError(TagmaBaseError, ValueError):
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
