"""The engine soak's view from inside the engine: invariants, holdings and memory growth sites.

``ProbedCore`` wraps an engine core and passes every call through. It counts the steps that
end (results from ``step``, refusals from ``submit``), runs the core's ``check_integrity``
every ``integrity_every`` of them (a failed check is recorded, not raised, so the soak goes
on and reports it), and when ``trace_frames`` > 0 traces Python allocations with
``tracemalloc`` from the moment the core is built: a snapshot when ``warmup_steps`` steps
have ended and one at ``close`` (each after a full ``gc.collect()``), whose difference names
the code lines that allocated what is still held. glibc's own counts (``mallinfo2``: bytes
in use, bytes free inside the heap) are read at the same two moments, so growth outside
Python objects (torch, ZMQ, allocator fragmentation) shows too. ``close`` writes the
``ProbeReport`` as JSON to ``out`` (when set) before it closes the core.

In a soak through the transport the engine process is started exactly as the node starts it
(``EngineClient``: ``python -m vla_sched.engine.main``). The soak puts
``bench/soak_site`` first on that process's ``PYTHONPATH`` and the probe's settings, as JSON,
in ``VLA_SCHED_SOAK_PROBE``; that folder's ``sitecustomize`` calls ``install_from_env``,
which wraps ``core_factory.build_core`` before ``engine_main`` imports it. Without the
variable nothing is installed.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import dataclasses
import gc
import json
import os
import time
import tracemalloc
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PROBE_ENV = 'VLA_SCHED_SOAK_PROBE'
MAX_FAILURE_MESSAGES = 10


@dataclass(frozen=True, slots=True)
class ProbeConfig:
    """What the probe does: ``out`` ('' writes nothing), ``trace_frames`` 0 traces nothing."""

    out: str = ''
    warmup_steps: int = 0
    integrity_every: int = 100
    trace_frames: int = 0
    num_top_sites: int = 15


@dataclass(slots=True)
class ProbeReport:
    """What the probe saw; memory in kB, ``None`` where it was not measured.

    ``top_growth``: the ``num_top_sites`` source lines whose held Python memory grew most
    between the warm-up snapshot and the end (held size and block count, and their growth),
    each with the call stack that holds most of it.
    """

    num_steps_ended: int = 0
    num_integrity_checks: int = 0
    num_integrity_failures: int = 0
    integrity_failures: list[str] = field(default_factory=list)
    held: dict[str, int] = field(default_factory=dict)
    traced_kb_warm: float | None = None
    traced_kb_end: float | None = None
    malloc_kb_warm: dict[str, float] | None = None
    malloc_kb_end: dict[str, float] | None = None
    top_growth: list[dict[str, Any]] = field(default_factory=list)


class _MallInfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ('arena', 'ordblks', 'smblks', 'hblks', 'hblkhd', 'usmblks', 'fsmblks',
                     'uordblks', 'fordblks', 'keepcost')
    ]  # fmt: skip


def malloc_kb() -> dict[str, float] | None:
    """glibc's heap counts over all arenas in kB: ``in_use`` (allocated, mmapped blocks
    included) and ``free`` (held by the allocator, not in use); None without ``mallinfo2``."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library('c'))
        mallinfo2 = libc.mallinfo2
    except (OSError, AttributeError, TypeError):
        return None
    mallinfo2.restype = _MallInfo2
    info = mallinfo2()
    return {'in_use': (info.uordblks + info.hblkhd) / 1024, 'free': info.fordblks / 1024}


def held_sizes(core: Any) -> dict[str, int]:
    """How many entries a ``ScheduledCore``'s per-robot and per-request structures hold now
    (an empty map for a core without a scheduler)."""
    scheduler, memory = getattr(core, 'scheduler', None), getattr(core, 'memory', None)
    if scheduler is None or memory is None:
        return {}
    sizes = {
        'sessions': len(memory.sessions),
        'metrics_robots': len(scheduler.metrics.robots),
        'live_requests': len(scheduler.live_reqs()),
        'in_flight_robots': len(scheduler.robots.in_flight_steps()),
        'request_kv': len(memory.admitted_reqs()),
        'radix_nodes': sum(1 for _ in memory.tree.iter_nodes()),
    }
    feature_cache = getattr(scheduler.runner, 'feature_cache', None)
    if feature_cache is not None:
        sizes['feature_cache_entries'] = len(feature_cache)
    return sizes


def _trace_filters() -> list[tracemalloc.Filter]:
    """Leave out the tracer's own allocations and the import machinery's."""
    return [
        tracemalloc.Filter(False, tracemalloc.__file__),
        tracemalloc.Filter(False, '<frozen importlib._bootstrap>'),
        tracemalloc.Filter(False, '<frozen importlib._bootstrap_external>'),
        tracemalloc.Filter(False, '<unknown>'),
    ]


def top_growth(
    before: tracemalloc.Snapshot, after: tracemalloc.Snapshot, num_sites: int
) -> list[dict[str, Any]]:
    """The ``num_sites`` source lines whose held memory grew most from ``before`` to
    ``after``, each with the call stack (oldest call first) that holds most of it."""
    before, after = before.filter_traces(_trace_filters()), after.filter_traces(_trace_filters())
    grown = [s for s in after.compare_to(before, 'lineno') if s.size_diff > 0][:num_sites]
    stacks = after.statistics('traceback')
    sites = []
    for stat in grown:
        frame = stat.traceback[0]
        # Traceback frames run from the oldest call to the allocating line.
        stack = next((s.traceback for s in stacks if s.traceback[-1] == frame), stat.traceback)
        sites.append(
            {
                'site': f'{frame.filename}:{frame.lineno}',
                'size_diff_kb': stat.size_diff / 1024,
                'size_kb': stat.size / 1024,
                'count_diff': stat.count_diff,
                'count': stat.count,
                'stack': [f'{f.filename}:{f.lineno}' for f in stack],
            }
        )
    return sites


class ProbedCore:
    """An engine core with the probe around it (see the module docstring)."""

    def __init__(self, core: Any, config: ProbeConfig) -> None:
        self.core = core
        self.config = config
        self.report = ProbeReport()
        self._next_check = config.integrity_every
        self._warm_snapshot: tracemalloc.Snapshot | None = None
        self._closed = False
        if config.trace_frames > 0 and not tracemalloc.is_tracing():
            tracemalloc.start(config.trace_frames)
        if config.warmup_steps == 0:
            self._at_warmup()

    # --- the core's calls, passed through ---------------------------------------------

    @property
    def info(self) -> Any:
        return self.core.info

    def submit(self, request: Any, now_ns: int) -> list[Any]:
        refused = self.core.submit(request, now_ns)
        self._ended(len(refused))
        return refused

    def close_session(self, robot_id: str) -> None:
        self.core.close_session(robot_id)

    def has_work(self) -> bool:
        return self.core.has_work()

    def step(self, now_ns: int) -> list[Any]:
        out = self.core.step(now_ns)
        self._ended(len(out))
        return out

    def stats(self, now_ns: int) -> Any:
        return self.core.stats(now_ns)

    def check_integrity(self) -> None:
        """Check the core's invariants; a failure is recorded in the report, not raised."""
        self.report.num_integrity_checks += 1
        try:
            self.core.check_integrity()
        except Exception as exc:
            self.report.num_integrity_failures += 1
            if len(self.report.integrity_failures) < MAX_FAILURE_MESSAGES:
                self.report.integrity_failures.append(
                    f'after {self.report.num_steps_ended} steps: {type(exc).__name__}: {exc}'
                )

    def close(self) -> None:
        """Finish the report (a last integrity check, holdings, memory) and write it; then
        close the core."""
        if self._closed:
            return
        self._closed = True
        try:
            self.finish()
        finally:
            self.core.close()

    # --- the probe ----------------------------------------------------------------------

    def finish(self) -> ProbeReport:
        """Complete the report as of now and write it to ``out`` (when set)."""
        report = self.report
        self.check_integrity()
        report.held = held_sizes(self.core)
        if tracemalloc.is_tracing():
            report.traced_kb_end, end = _traced_now()
            if self._warm_snapshot is not None:
                report.top_growth = top_growth(self._warm_snapshot, end, self.config.num_top_sites)
        report.malloc_kb_end = malloc_kb()
        if self.config.out:
            _write_json(Path(self.config.out), dataclasses.asdict(report))
        return report

    def _ended(self, num: int) -> None:
        if not num:
            return
        before = self.report.num_steps_ended
        self.report.num_steps_ended += num
        if before < self.config.warmup_steps <= self.report.num_steps_ended:
            self._at_warmup()
        if self.report.num_steps_ended >= self._next_check:
            self.check_integrity()
            self._next_check = self.report.num_steps_ended + self.config.integrity_every

    def _at_warmup(self) -> None:
        if tracemalloc.is_tracing():
            self.report.traced_kb_warm, self._warm_snapshot = _traced_now()
        self.report.malloc_kb_warm = malloc_kb()


def _traced_now() -> tuple[float, tracemalloc.Snapshot]:
    """Traced Python memory (kB) and a snapshot, after a full collection: objects that only
    wait for the cycle collector, and the interpreter's free lists (which keep freed objects
    traced at the line that first allocated them), would otherwise read as held."""
    gc.collect()
    return tracemalloc.get_traced_memory()[0] / 1024, tracemalloc.take_snapshot()


def _write_json(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` to a temporary file beside ``path``, then rename it into place, so a
    reader never sees half a report."""
    tmp = path.with_name(f'.{path.name}.{os.getpid()}.{time.monotonic_ns()}')
    tmp.write_text(json.dumps(data, indent=1) + '\n')
    tmp.replace(path)


def probe_config_from_env() -> ProbeConfig | None:
    """The probe settings in ``VLA_SCHED_SOAK_PROBE`` (JSON), or None when it is unset."""
    raw = os.environ.get(PROBE_ENV)
    if not raw:
        return None
    return ProbeConfig(**json.loads(raw))


def probe_env(config: ProbeConfig) -> str:
    """``config`` as the value of ``VLA_SCHED_SOAK_PROBE``."""
    return json.dumps(dataclasses.asdict(config))


def install_from_env() -> None:
    """Wrap ``core_factory.build_core`` so that the core it builds is probed (nothing happens
    unless ``VLA_SCHED_SOAK_PROBE`` is set); must run before ``engine_main`` is imported."""
    config = probe_config_from_env()
    if config is None:
        return
    from vla_sched.engine import core_factory

    build_core = core_factory.build_core

    def build_probed_core(engine_config: Any) -> ProbedCore:
        return ProbedCore(build_core(engine_config), config)

    core_factory.build_core = build_probed_core
