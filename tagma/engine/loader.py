"""Loading the tagma engine's shared library, lazily on first use, and raising on a non-OK status.

The library comes from ``$TAGMA_LIB`` when set, else ``tagma/_lib/libtagma.so``; importing this module never
needs it.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, NoReturn

if TYPE_CHECKING:
    pass

from tagma.contract import ENV_LIB
from tagma.engine.abi import (
    _SIGNATURES,
    _STATUS,
)
from tagma.errors import (
    EngineNotBuiltError,
    error_for_status,
)

__all__ = [
    "hot_function",
    "library_path",
    "version",
]


_DEFAULT_LIB: Final = Path(__file__).resolve().parent.parent / "_lib" / "libtagma.so"
_lib: ctypes.CDLL | None = None
_lib_lock = threading.Lock()


def library_path() -> Path:
    """Where the shared library is looked for: ``$TAGMA_LIB`` when set, else ``tagma/_lib/libtagma.so``."""
    env = os.environ.get(ENV_LIB)
    return Path(env) if env else _DEFAULT_LIB


def _load() -> ctypes.CDLL:
    global _lib
    if _lib is not None:
        return _lib
    with _lib_lock:
        if _lib is None:
            path = library_path()
            origin = f" (from {ENV_LIB})" if os.environ.get(ENV_LIB) else ""
            if not path.is_file():
                raise EngineNotBuiltError(
                    f"the tagma engine library is not built: {path}{origin} does not exist; "
                    "run `make setup` to build it"
                )
            try:
                lib = ctypes.CDLL(str(path))
            except OSError as exc:
                raise EngineNotBuiltError(
                    f"cannot load the tagma engine library {path}{origin}: {exc}; "
                    "run `make setup` to rebuild it"
                ) from exc
            for name, (restype, argtypes) in _SIGNATURES.items():
                try:
                    fn = getattr(lib, name)
                except AttributeError:
                    raise EngineNotBuiltError(
                        f"the tagma engine library {path}{origin} lacks {name} (stale build?); "
                        "run `make setup` to rebuild it"
                    ) from None
                fn.restype = restype
                fn.argtypes = argtypes
            _lib = lib
    return _lib


def _raise(lib: ctypes.CDLL, status: int) -> NoReturn:
    # Read the thread-local message before any other tagma call can replace it.
    raw = lib.tagma_last_error()
    message = raw.decode("utf-8", "replace") if raw else ""
    raise error_for_status(status, message)


def hot_function(name: str, *argtypes: Any) -> Any:
    """A prebound hot-path entry point: ABI function ``name`` through a ``PYFUNCTYPE`` prototype.

    Unlike the library's ordinary function objects it keeps the GIL during the call (no release and
    re-acquire around a call of a microsecond or less, and no wait for the GIL afterwards when another thread
    holds it); the engine's calls are short and never call back into Python. Pass arguments as ctypes
    objects made once (a ``c_void_p`` to a prefilled struct): a Python int is converted on every call.
    """
    lib = _load()
    if name not in _SIGNATURES:
        raise ValueError(f"{name!r} is not a tagma ABI function")
    return ctypes.PYFUNCTYPE(_STATUS, *argtypes)((name, lib))


def version() -> str:
    """The engine's version string."""
    raw = _load().tagma_version()
    return raw.decode("utf-8", "replace") if raw else ""
