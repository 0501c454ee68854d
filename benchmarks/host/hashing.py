"""vLLM's prefix-caching hash algorithms as sides of the host benchmark.

vLLM hashes every full block of a request's tokens when prefix caching is on (its ``Request`` constructor
runs the block hasher, and every appended token that fills a block hashes it). The algorithm is
``--prefix-caching-hash-algo`` (``CacheConfig.prefix_caching_hash_algo``), read by
:func:`vllm.utils.hashing.get_hash_fn_by_name`: ``sha256`` (the default, pickle + SHA-256), ``sha256_cbor``,
``xxhash`` (pickle + xxh3_128, the fastest) and ``xxhash_cbor``. The bench's vLLM sides hash with sha256, and
with :data:`FAST` where vLLM's hashing is timed: the strongest baseline a user could pick.

The first block of a request chains onto ``kv_cache_utils.NONE_HASH``, a process-global that vLLM's engine
core sets once with ``init_none_hash(hash_fn)`` for the configured algorithm: ``hash_fn(seed)``, the seed
being PYTHONHASHSEED if set, else a fixed string for sha256 and fresh random bytes for xxhash (a
non-cryptographic hash keeps its seed secret). One process of this bench hosts both algorithms, so
:func:`none_hash` derives each one's NONE_HASH once, as its own engine core would, and :func:`use` puts the
side's value in place (outside the timed regions) before that side hashes anything. The block hashes feed
the manager as opaque keys either way; tests/benchmarks/test_host_bench_xxhash.py checks that both give
the same hits.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core import kv_cache_utils
from vllm.v1.core.kv_cache_utils import BlockHash, get_request_block_hasher, init_none_hash

__all__ = [
    "DEFAULT", "FAST", "available", "block_hasher", "none_hash", "seed_source", "set_active", "side_name",
    "use",
]  # fmt: skip

DEFAULT = "sha256"  # vLLM's CacheConfig default
FAST = "xxhash"  # vLLM's fastest (xxh3_128 of the pickled block)

_NONE_HASH: dict[str, BlockHash] = {}


def available(algo: str) -> str | None:
    """None when vLLM can hash with ``algo`` here, else why not (xxhash needs the ``xxhash`` package)."""
    try:
        get_hash_fn_by_name(algo)
    except ValueError as exc:
        return str(exc)
    if algo.startswith("xxhash"):
        if importlib.util.find_spec("xxhash") is None:
            return "the xxhash package is not installed"
        import xxhash

        if not hasattr(xxhash, "xxh3_128_digest"):
            return f"xxhash {xxhash.VERSION} has no xxh3_128_digest"
    return None


def side_name(algo: str) -> str:
    """The vLLM side hashing with ``algo``: ``paged`` for the default, ``paged_<algo>`` otherwise."""
    return "paged" if algo == DEFAULT else f"paged_{algo}"


def none_hash(algo: str) -> BlockHash:
    """``algo``'s NONE_HASH, derived once per process by vLLM's ``init_none_hash`` (global restored)."""
    if algo not in _NONE_HASH:
        before = getattr(kv_cache_utils, "NONE_HASH", None)
        init_none_hash(get_hash_fn_by_name(algo))
        _NONE_HASH[algo] = kv_cache_utils.NONE_HASH
        if before is not None:
            kv_cache_utils.NONE_HASH = before
    return _NONE_HASH[algo]


def seed_source(algo: str) -> str:
    """Where ``algo``'s NONE_HASH seed comes from, as ``resolve_none_hash_seed`` decides."""
    if os.getenv("PYTHONHASHSEED") is not None:
        return "PYTHONHASHSEED"
    if get_hash_fn_by_name(algo) in kv_cache_utils._NON_CRYPTO_HASH_FUNCTIONS:
        return "random per process"
    return kv_cache_utils.DEFAULT_NONE_HASH_SEED


def set_active(algo: str) -> None:
    """Make ``algo``'s NONE_HASH the one vLLM's hasher chains the first block onto."""
    kv_cache_utils.NONE_HASH = none_hash(algo)


@contextmanager
def use(algo: str) -> Iterator[None]:
    """``algo``'s NONE_HASH in place for the block; the previous value afterwards."""
    before = getattr(kv_cache_utils, "NONE_HASH", None)
    set_active(algo)
    try:
        yield
    finally:
        if before is not None:
            kv_cache_utils.NONE_HASH = before


def block_hasher(block_size: int, algo: str = DEFAULT) -> Callable[[Any], list[BlockHash]]:
    """vLLM's request block hasher with ``algo`` (``get_request_block_hasher``), NONE_HASH derived."""
    none_hash(algo)
    return get_request_block_hasher(block_size, get_hash_fn_by_name(algo))
