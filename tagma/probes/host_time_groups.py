"""The KV manager's host time per KV cache group (``TAGMA_HOST_TIME_GROUPS=1``, models with several groups).

Installed by :func:`tagma.probes.host_time_hooks.after_kv_manager_init` when asked, on both arms: the
manager's time per group, nested inside its timed calls (each group interval counts only inside a timed
KV manager call, so it is a part of the manager's time). vLLM's coordinator does a group's block work in
that group's single-type manager, whose public methods get timed instance attributes; tagma's group
managers do it in per-group loop bodies, which time themselves through the manager's ``group_time`` (a
:class:`GroupClock`, None unless installed). The prefix-cache hit search, joint over the groups of one spec
on both arms, stays in the manager's total and in no group; so does tagma's ``pop_blocks_for_free`` (one
dict pop for every group). Rows: ``tagma.probes.host_time.COLUMNS["kv_groups"]``, written per step by the
:class:`~tagma.probes.host_time_hooks.SchedulerClock` the groups are attached to.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from tagma.probes.host_time import GROUP_KINDS, INSTRUMENTED_MARK, WRAPPED_MARK, public_methods

_clock = time.thread_time_ns  # the same clock as the manager's timers (host_time_hooks)

__all__ = ["GroupClock", "group_kind", "install_group_timers", "instrument_single_type_manager"]


class GroupClock:
    """Per-KV-cache-group accumulators of the KV manager's block work (:func:`install_group_timers`).

    A per-group interval counts only inside a timed KV manager call of ``kv`` (so it is a part of the
    manager's time). tagma's loop bodies use :meth:`start` / :meth:`stop`; vLLM's single-type managers are
    wrapped (:func:`instrument_single_type_manager`), with ``active`` as their re-entrancy guard.
    """

    __slots__ = ("active", "calls", "kinds", "kv", "ns", "windows")

    def __init__(self, kv: Any, kinds: tuple[int, ...], windows: tuple[int, ...]) -> None:
        if len(kinds) != len(windows):
            raise ValueError("host time: one kind and one window per KV cache group")
        self.kv = kv
        self.kinds = tuple(kinds)
        self.windows = tuple(windows)
        self.ns = [0] * len(kinds)
        self.calls = [0] * len(kinds)
        self.active = False

    def __len__(self) -> int:
        return len(self.kinds)

    @staticmethod
    def start() -> int:
        return _clock()

    def stop(self, group: int, t0: int) -> None:
        dt = _clock() - t0
        if self.kv.in_kv:
            self.ns[group] += dt
            self.calls[group] += 1

    def take(self) -> tuple[list[int], list[int]]:
        """The accumulated (ns, calls) per group, and zero them."""
        n = len(self.kinds)
        out = (self.ns, self.calls)
        self.ns, self.calls = [0] * n, [0] * n
        return out


def group_kind(single: Any) -> tuple[int, int]:
    """(GROUP_KINDS index, window in tokens or 0) of a KV cache group, from its single-type manager's spec."""
    from vllm.v1.kv_cache_interface import FullAttentionSpec, MambaSpec, SlidingWindowSpec

    spec = getattr(single, "kv_cache_spec", None)
    if isinstance(spec, SlidingWindowSpec):
        return GROUP_KINDS.index("window"), int(spec.sliding_window)
    if isinstance(spec, MambaSpec):
        return GROUP_KINDS.index("state"), 0
    if isinstance(spec, FullAttentionSpec):
        return GROUP_KINDS.index("full"), 0
    return GROUP_KINDS.index("other"), 0


def single_type_methods() -> tuple[str, ...]:
    """The public plain methods of vLLM's ``SingleTypeKVCacheManager`` (the coordinator's per-group calls;
    its classmethods, the hit search, are not per instance)."""
    from vllm.v1.core.single_type_kv_cache_manager import SingleTypeKVCacheManager

    return public_methods(SingleTypeKVCacheManager)


def instrument_single_type_manager(single: Any, group: int, groups: GroupClock,
                                   methods: tuple[str, ...]) -> None:  # fmt: skip
    """Time ``single``'s ``methods`` (bound, as the instance resolves them) as group ``group``'s block work;
    a call inside another timed group call is that call's time."""
    if single.__dict__.get(INSTRUMENTED_MARK):
        return

    def timed_in_group(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def timed(*args: Any, **kwargs: Any) -> Any:
            if groups.active:
                return fn(*args, **kwargs)
            groups.active = True
            t0 = _clock()
            try:
                return fn(*args, **kwargs)
            finally:
                groups.stop(group, t0)
                groups.active = False

        setattr(timed, WRAPPED_MARK, True)
        return timed

    for name in methods:
        bound = getattr(single, name, None)
        if callable(bound):
            setattr(single, name, timed_in_group(bound))
    single.__dict__[INSTRUMENTED_MARK] = True


def install_group_timers(manager: Any, clock: Any, writer: Any = None) -> GroupClock | None:
    """Per-group timers for a manager over several KV cache groups (None for one group), attached to
    ``clock`` (the :class:`~tagma.probes.host_time_hooks.SchedulerClock` whose manager calls they nest in).
    tagma's group managers get the GroupClock as ``group_time`` and time their own loops; any other manager
    (vLLM's) gets its coordinator's single-type managers wrapped. Rows go to ``writer`` (None: the process's
    ``kv_groups`` file, made at the first step)."""
    coordinator = getattr(manager, "coordinator", None)
    singles = tuple(getattr(coordinator, "single_type_managers", ()) or ())
    if len(singles) < 2:
        return None
    kinds, windows = zip(*(group_kind(s) for s in singles), strict=True)
    groups = GroupClock(clock, kinds, windows)
    if hasattr(manager, "group_time"):
        manager.group_time = groups
    else:
        methods = single_type_methods()
        for g, single in enumerate(singles):
            instrument_single_type_manager(single, g, groups, methods)
    clock.attach_groups(groups, writer)
    return groups
