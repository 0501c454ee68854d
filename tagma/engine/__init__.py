"""ctypes binding of the tagma range engine (C ABI in ``tagma/csrc/tagma.h``).

Submodules: :mod:`~tagma.engine.loader` (the library and statuses), :mod:`~tagma.engine.abi` (ABI types and
conversions), :mod:`~tagma.engine.range_engine` (:class:`RangeEngine`), :mod:`~tagma.engine.append_batch`
(:class:`AppendBatch`), :mod:`~tagma.engine.slot_mapping` (slot mapping, ``coord_offset``) and
:mod:`~tagma.engine.prefix_index` (the prefix index). They import each other by submodule path; this package
only re-exports their public names (errors from :mod:`tagma.errors`).

The shared library is loaded lazily, on first use, from ``$TAGMA_LIB`` when set, else from
``tagma/_lib/libtagma.so``; importing this module never needs it. Every ABI function returns a status; a
non-zero status raises the :class:`TagmaError` subclass for that status, carrying the engine's last-error
text. Buffers cross the ABI as numpy arrays passed by address (``c_void_p`` argtypes), and each engine keeps
its out-parameter scratch objects and bound function objects, so a call costs one ctypes dispatch.
"""

from tagma.engine.abi import (
    AppendResult,
    CoordLayout,
    EngineStats,
    I32Array,
    I64Array,
    IntArrayLike,
    Policy,
    Range,
    _CCoordLayout,
    _CStats,
    parse_member,
)
from tagma.engine.append_batch import AppendBatch
from tagma.engine.loader import _load, _raise, hot_function, library_path, version
from tagma.engine.range_engine import RangeEngine
from tagma.engine.slot_mapping import (
    SlotMappingStep,
    coord_offset,
    slot_mapping_paged,
    slot_mapping_ranges,
    slot_mapping_step,
)
from tagma.errors import (
    ERROR_CLASSES,
    STATUS_NAMES,
    TAGMA_E_INTERNAL,
    TAGMA_E_INVALID_ARG,
    TAGMA_E_INVALID_HANDLE,
    TAGMA_E_MISALIGNED,
    TAGMA_E_NO_SPACE,
    TAGMA_E_NOT_FOUND,
    TAGMA_E_OUT_OF_RANGE,
    TAGMA_E_OVERFLOW,
    TAGMA_E_STATE,
    TAGMA_OK,
    BlockStateError,
    EngineNotBuiltError,
    InternalError,
    InvalidArgumentError,
    InvalidHandleError,
    MisalignedError,
    NoSpaceError,
    OutOfRangeError,
    RequestNotFoundError,
    TagmaError,
    TagmaOverflowError,
)

__all__ = [
    "AppendBatch",
    "AppendResult",
    "BlockStateError",
    "CoordLayout",
    "ERROR_CLASSES",
    "EngineNotBuiltError",
    "EngineStats",
    "I32Array",
    "I64Array",
    "IntArrayLike",
    "InternalError",
    "InvalidArgumentError",
    "InvalidHandleError",
    "MisalignedError",
    "NoSpaceError",
    "OutOfRangeError",
    "Policy",
    "Range",
    "RangeEngine",
    "RequestNotFoundError",
    "STATUS_NAMES",
    "SlotMappingStep",
    "TAGMA_E_INTERNAL",
    "TAGMA_E_INVALID_ARG",
    "TAGMA_E_INVALID_HANDLE",
    "TAGMA_E_MISALIGNED",
    "TAGMA_E_NOT_FOUND",
    "TAGMA_E_NO_SPACE",
    "TAGMA_E_OUT_OF_RANGE",
    "TAGMA_E_OVERFLOW",
    "TAGMA_E_STATE",
    "TAGMA_OK",
    "TagmaError",
    "TagmaOverflowError",
    "_CCoordLayout",
    "_CStats",
    "_load",
    "_raise",
    "coord_offset",
    "hot_function",
    "library_path",
    "parse_member",
    "slot_mapping_paged",
    "slot_mapping_ranges",
    "slot_mapping_step",
    "version",
]
