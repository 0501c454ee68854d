"""Pure-Python reference model of the tagma range engine's semantics (tagma/csrc/tagma.h).

The model keeps the block-level state: per-block request and cache reference counts, the free set (derived:
usable blocks with neither count), the LRU list of cache-only blocks and each request's logical block list.
It does not make placement decisions; :meth:`ReferenceEngine.check_append` VALIDATES the engine's choices
against the header's rules, then applies them. Interpretation of the header used here:

* Eviction comes first: when free < count, exactly count - free cache-only blocks are evicted, the first
  ones of the LRU list, and become free (their cache counts drop to zero).
* Then in-place growth: the last range (the request's last physical block b) grows into the free run that
  starts at b + 1, by min(count, run length) blocks; a request with no blocks does not grow.
* Then the remainder (count - growth) is placed over the free runs as they are after the evictions and the
  growth: as ONE range when some free run can hold it, chosen by the policy
    first fit: the lowest-addressed run that fits, placed at its start;
    best fit:  a smallest run that fits, lowest address on ties, placed at its start (also reserve, whose
               reservations come only from append_runs hints, which this model's appends never carry);
    headroom:  a largest run (any of equal length), placed at run.start when the run starts at the first
               usable block, else at run.start + (run.length - remainder) // 2;
  otherwise as several ranges taken largest-first: every piece but the last is a whole free run, the pieces'
  runs are taken in non-increasing length order, the last piece lies inside a largest run of those left, and
  no untouched run is longer than a run taken whole (ties and the last piece's position are not checked).
* A request's ranges are the maximal runs of physically consecutive ids in its logical block list (appended
  or attached ranges adjacent to the previous last range merge).
* cache_mark on a cache-only block raises its cache count and leaves its LRU position unchanged.
* release drops references in reverse logical order; blocks left unreferenced join the LRU tail in that
  order when they have cache references, else become free.

With align > 1 the usable space is [align, (num_blocks // align) * align) and only weaker properties of
append are checked (see :meth:`ReferenceEngine.check_append`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tagma.engine import (
    TAGMA_E_INVALID_ARG,
    TAGMA_E_MISALIGNED,
    TAGMA_E_NO_SPACE,
    TAGMA_E_NOT_FOUND,
    TAGMA_E_OUT_OF_RANGE,
    TAGMA_E_STATE,
    Policy,
)

# Statuses accepted where the header names the failure but not its code (the null block is neither free nor
# in use; a duplicate id inside one call is "a block the request already holds" or a bad argument).
NULL_BLOCK_STATUSES = frozenset({TAGMA_E_OUT_OF_RANGE, TAGMA_E_STATE, TAGMA_E_INVALID_ARG})
DUPLICATE_STATUSES = frozenset({TAGMA_E_STATE, TAGMA_E_INVALID_ARG})


class ModelViolationError(AssertionError):
    """The engine did something the header's semantics do not allow."""


@dataclass(frozen=True)
class Run:
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length


def runs_of(ids: list[int]) -> list[Run]:
    """Maximal runs of consecutive ids, in list order."""
    out: list[Run] = []
    for b in ids:
        if out and out[-1].end == b:
            out[-1] = Run(out[-1].start, out[-1].length + 1)
        else:
            out.append(Run(b, 1))
    return out


@dataclass
class Counters:
    in_place_growths: int = 0
    new_ranges: int = 0
    appended_blocks: int = 0
    evictions_by_append: int = 0
    evictions_by_evict: int = 0


@dataclass
class ReferenceEngine:
    num_blocks: int
    align: int = 1
    policy: Policy = Policy.BEST_FIT
    req_refs: list[int] = field(init=False)
    cache_refs: list[int] = field(init=False)
    lru: dict[int, None] = field(init=False, default_factory=dict)  # insertion-ordered: LRU first
    requests: dict[int, list[int]] = field(init=False, default_factory=dict)
    released: set[int] = field(init=False, default_factory=set)
    counters: Counters = field(init=False, default_factory=Counters)

    def __post_init__(self) -> None:
        self.req_refs = [0] * self.num_blocks
        self.cache_refs = [0] * self.num_blocks

    # ---- derived state

    @property
    def first_usable(self) -> int:
        return self.align

    @property
    def usable_end(self) -> int:
        return (self.num_blocks // self.align) * self.align

    @property
    def usable_blocks(self) -> int:
        return max(0, self.usable_end - self.first_usable)

    def is_usable(self, b: int) -> bool:
        return self.first_usable <= b < self.usable_end

    def is_free(self, b: int) -> bool:
        return self.is_usable(b) and self.req_refs[b] == 0 and self.cache_refs[b] == 0

    def is_cache_only(self, b: int) -> bool:
        return self.req_refs[b] == 0 and self.cache_refs[b] > 0

    def free_runs(self) -> list[Run]:
        """Maximal runs of free blocks in address order."""
        req_refs, cache_refs = self.req_refs, self.cache_refs
        runs: list[Run] = []
        start = -1
        for b in range(self.first_usable, self.usable_end):
            if req_refs[b] == 0 and cache_refs[b] == 0:
                if start < 0:
                    start = b
            elif start >= 0:
                runs.append(Run(start, b - start))
                start = -1
        if start >= 0:
            runs.append(Run(start, self.usable_end - start))
        return runs

    def num_free(self) -> int:
        req_refs, cache_refs = self.req_refs, self.cache_refs
        return sum(
            1 for b in range(self.first_usable, self.usable_end) if req_refs[b] == 0 and cache_refs[b] == 0
        )

    def num_used(self) -> int:
        return sum(1 for r in self.req_refs if r > 0)

    def lru_list(self) -> list[int]:
        return list(self.lru)

    def request_runs(self, req: int) -> list[tuple[int, int, int]]:
        """(physical_start, count, first_logical) triples: maximal physically consecutive runs."""
        out: list[tuple[int, int, int]] = []
        logical = 0
        for run in runs_of(self.requests[req]):
            out.append((run.start, run.length, logical))
            logical += run.length
        return out

    def live_in_use_blocks(self) -> list[int]:
        return [b for b in range(self.num_blocks) if self.req_refs[b] > 0]

    def cached_blocks(self) -> list[int]:
        return [b for b in range(self.num_blocks) if self.cache_refs[b] > 0]

    # ---- requests

    def create(self, req: int) -> None:
        if req in self.requests or req in self.released:
            raise ModelViolationError(f"request id {req} reused")
        self.requests[req] = []

    def release(self, req: int) -> None:
        for b in reversed(self.requests.pop(req)):
            self.req_refs[b] -= 1
            if self.req_refs[b] == 0 and self.cache_refs[b] > 0:
                self.lru[b] = None
        self.released.add(req)

    def expected_request_error(self, req: int) -> int | None:
        return None if req in self.requests else TAGMA_E_NOT_FOUND

    # ---- append

    def append_must_fail(self, count: int) -> int | None:
        """The status an append of ``count`` blocks must fail with, when the header decides it (else None)."""
        if count <= 0:
            return TAGMA_E_INVALID_ARG
        if count % self.align:
            return TAGMA_E_MISALIGNED
        if self.num_free() + len(self.lru) < count:
            return TAGMA_E_NO_SPACE
        return None

    def append_must_succeed(self, count: int) -> bool:
        if self.append_must_fail(count) is not None:
            return False
        if self.align == 1:
            return True
        # Aligned ranges can always be cut from the aligned parts of the free runs, without evicting.
        return self.aligned_free_capacity() >= count

    def aligned_free_capacity(self) -> int:
        a = self.align
        total = 0
        for run in self.free_runs():
            lo = -(-run.start // a) * a
            hi = (run.end // a) * a
            total += max(0, hi - lo)
        return total

    def check_append(self, req: int, count: int, new_blocks: list[int], evicted: list[int]) -> None:
        """Validate a successful append against the model, then apply it. Raises ModelViolationError."""
        if req not in self.requests:
            raise ModelViolationError(f"append to unknown request {req} succeeded")
        failure = self.append_must_fail(count)
        if failure is not None:
            raise ModelViolationError(f"append of {count} succeeded; expected status {failure}")
        free_before = self.num_free()
        lru_before = self.lru_list()
        if len(new_blocks) != count:
            raise ModelViolationError(f"append of {count} returned {len(new_blocks)} blocks")
        if len(set(new_blocks)) != count:
            raise ModelViolationError(f"append returned duplicate blocks {new_blocks}")

        # 1. evictions: a prefix of the LRU list.
        if evicted != lru_before[: len(evicted)]:
            raise ModelViolationError(f"evicted {evicted} is not a prefix of the LRU order {lru_before}")
        if self.align == 1:
            need = max(0, count - free_before)
            if len(evicted) != need:
                raise ModelViolationError(
                    f"free={free_before}, count={count}: evicted {len(evicted)} blocks, "
                    f"expected exactly {need}"
                )
        elif len(evicted) < count - free_before:
            raise ModelViolationError(f"free={free_before}, count={count}: evicted only {len(evicted)}")
        elif self.aligned_free_capacity() >= count and evicted:
            raise ModelViolationError(
                f"evicted {evicted} although the aligned free space holds {count} blocks"
            )
        for b in evicted:
            self.cache_refs[b] = 0
            del self.lru[b]

        for b in new_blocks:
            if not self.is_free(b):
                raise ModelViolationError(
                    f"appended block {b} was not free (req_refs={self.req_refs[b]}, "
                    f"cache_refs={self.cache_refs[b]}) after evicting {evicted}"
                )

        blocks = self.requests[req]
        if self.align == 1:
            self._check_placement(blocks, count, new_blocks)
        else:
            for run in runs_of(new_blocks):
                if run.start % self.align or run.length % self.align:
                    raise ModelViolationError(
                        f"align={self.align}: appended run {run} is misaligned (new blocks {new_blocks})"
                    )
            after = next((r for r in self.free_runs() if blocks and r.start == blocks[-1] + 1), None)
            if after is not None and after.length >= self.align and new_blocks[0] != after.start:
                raise ModelViolationError(
                    f"free run {after} follows the last range but the append did not grow "
                    f"in place: {new_blocks}"
                )

        # Apply.
        for b in new_blocks:
            self.req_refs[b] = 1
        grew = bool(blocks) and new_blocks[0] == blocks[-1] + 1
        pieces = runs_of(new_blocks)
        self.counters.in_place_growths += int(grew)
        self.counters.new_ranges += len(pieces) - int(grew)
        self.counters.appended_blocks += count
        self.counters.evictions_by_append += len(evicted)
        blocks.extend(new_blocks)

    def _check_placement(self, blocks: list[int], count: int, new_blocks: list[int]) -> None:
        """align == 1: growth in place, then one range by the policy, else several largest-first."""
        runs = self.free_runs()  # after the evictions
        grow = 0
        if blocks:
            nxt = blocks[-1] + 1
            after = next((r for r in runs if r.start == nxt), None)
            if after is not None:
                grow = min(count, after.length)
                runs = [r for r in runs if r is not after]
                if after.length > grow:
                    runs.append(Run(nxt + grow, after.length - grow))
                    runs.sort(key=lambda r: r.start)
        if grow and new_blocks[:grow] != list(range(blocks[-1] + 1, blocks[-1] + 1 + grow)):
            raise ModelViolationError(
                f"expected in-place growth of {grow} blocks after block {blocks[-1]}, got {new_blocks}"
            )
        rest = new_blocks[grow:]
        rem = len(rest)
        if not rem:
            return
        where = f"free runs {[(r.start, r.length) for r in runs]} (after growth {grow}), remainder {rem}"
        fitting = [r for r in runs if r.length >= rem]
        if fitting:
            if rest != list(range(rest[0], rest[0] + rem)):
                raise ModelViolationError(f"{where}: a single run fits but the remainder was split: {rest}")
            allowed = self._policy_starts(fitting, runs, rem)
            if rest[0] not in allowed:
                raise ModelViolationError(
                    f"{self.policy.name}: {where}: placed at {rest[0]}, expected one of {sorted(allowed)}"
                )
            return
        pieces = runs_of(rest)
        sources: list[Run] = []
        for p in pieces:
            src = next((r for r in runs if r.start <= p.start and p.end <= r.end), None)
            if src is None or src in sources:
                raise ModelViolationError(
                    f"{where}: piece {p} is not inside an unused free run; pieces {pieces}"
                )
            sources.append(src)
        whole = pieces[:-1]
        for p, src in zip(whole, sources, strict=False):
            if p != src:
                raise ModelViolationError(
                    f"{where}: piece {p} is not a whole free run ({src}); pieces {pieces}"
                )
        lengths = [s.length for s in sources]
        if lengths != sorted(lengths, reverse=True):
            raise ModelViolationError(f"{where}: runs not taken largest-first: pieces {pieces}")
        untouched = [r for r in runs if r not in sources]
        if untouched and max(r.length for r in untouched) > sources[-1].length:
            raise ModelViolationError(
                f"{where}: the last piece {pieces[-1]} came from {sources[-1]} while a "
                f"larger run was left: pieces {pieces}"
            )

    def _policy_starts(self, fitting: list[Run], runs: list[Run], n: int) -> set[int]:
        if self.policy == Policy.FIRST_FIT:
            return {min(fitting, key=lambda r: r.start).start}
        if self.policy in (Policy.BEST_FIT, Policy.RESERVE):  # RESERVE without hints: nothing is reserved
            return {min(fitting, key=lambda r: (r.length, r.start)).start}
        largest = max(r.length for r in runs)
        return {
            r.start if r.start == self.first_usable else r.start + (r.length - n) // 2
            for r in runs
            if r.length == largest
        }

    # ---- attach

    def expected_attach_error(self, req: int, ids: list[int]) -> frozenset[int] | None:
        if req not in self.requests:
            return frozenset({TAGMA_E_NOT_FOUND})
        if not ids:
            return frozenset({TAGMA_E_INVALID_ARG})
        codes: set[int] = set()
        held = set(self.requests[req])
        seen: set[int] = set()
        for b in ids:
            if not 0 <= b < self.num_blocks:
                codes.add(TAGMA_E_OUT_OF_RANGE)
            elif b == 0:
                codes |= NULL_BLOCK_STATUSES
            elif b in seen:
                codes |= DUPLICATE_STATUSES
            elif b in held or (self.req_refs[b] == 0 and self.cache_refs[b] == 0):
                codes.add(TAGMA_E_STATE)  # held, free, or never usable
            seen.add(b)
        return frozenset(codes) or None

    def attach(self, req: int, ids: list[int]) -> None:
        for b in ids:
            if self.req_refs[b] == 0:
                del self.lru[b]
            self.req_refs[b] += 1
        self.requests[req].extend(ids)

    # ---- cache references

    def _expected_block_errors(self, ids: list[int], ok: list[bool]) -> frozenset[int] | None:
        codes: set[int] = set()
        for b, good in zip(ids, ok, strict=True):
            if not 0 <= b < self.num_blocks:
                codes.add(TAGMA_E_OUT_OF_RANGE)
            elif b == 0:
                codes |= NULL_BLOCK_STATUSES
            elif not good:
                codes.add(TAGMA_E_STATE)
        return frozenset(codes) or None

    def expected_mark_error(self, ids: list[int]) -> frozenset[int] | None:
        ok = [0 <= b < self.num_blocks and (self.req_refs[b] > 0 or self.cache_refs[b] > 0) for b in ids]
        return self._expected_block_errors(ids, ok)

    def expected_unmark_error(self, ids: list[int]) -> frozenset[int] | None:
        ok = [0 <= b < self.num_blocks and self.cache_refs[b] > 0 for b in ids]
        return self._expected_block_errors(ids, ok)

    def mark(self, ids: list[int]) -> None:
        for b in ids:
            self.cache_refs[b] += 1  # a cache-only block keeps its LRU position

    def unmark(self, ids: list[int]) -> None:
        for b in ids:
            self.cache_refs[b] -= 1
            if self.cache_refs[b] == 0 and self.req_refs[b] == 0:
                del self.lru[b]

    def evict(self, max_blocks: int) -> list[int]:
        out = self.lru_list()[: max(0, max_blocks)]
        for b in out:
            self.cache_refs[b] = 0
            del self.lru[b]
        self.counters.evictions_by_evict += len(out)
        return out

    def clear(self) -> int:
        dropped = sum(1 for c in self.cache_refs if c > 0)
        self.cache_refs = [0] * self.num_blocks
        self.lru.clear()
        return dropped

    # ---- slot mapping

    def slot(self, req: int, pos: int, block_size: int) -> int:
        blocks = self.requests[req]
        logical = pos // block_size
        if logical >= len(blocks):
            return -1
        return blocks[logical] * block_size + pos % block_size
