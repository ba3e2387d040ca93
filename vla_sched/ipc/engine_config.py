"""The engine's settings: one frozen dataclass, built from the node's parameters.

The frontend sends these as a JSON-able mapping (the engine may run in another process);
``EngineConfig.from_mapping`` validates every key without I/O and names the offending one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

POLICIES = ('fcfs', 'lpm', 'dfs-weight', 'lof')
LATE_POLICIES = ('drop', 'deliver_late')
CORES = ('scheduled', 'sequential')


class EngineConfigError(ValueError):
    """An engine setting is missing, unknown or out of range."""


@dataclass(frozen=True, slots=True)
class EngineConfig:
    """How the engine loads its model and schedules steps.

    ``model_path`` empty means the built-in tiny random checkpoint (built on first use; its
    actions are meaningless). ``core`` 'sequential' runs one step at a time with no batching
    (the way single-robot VLA servers work), for comparison. ``prefill_decode_interval``
    decode-only passes follow each prefill, so a new image cannot stall robots mid-decode
    for more than one prefill at a time (0: SGLang's prefill-first). ``cpu_threads`` is
    torch's thread count when the model runs on the CPU (small models run fastest on one).
    ``cuda_graphs`` replays decode steps as CUDA graphs (GPU only; ignored on the CPU).
    """

    model_path: str = ''
    device: str = 'auto'
    dtype: str = 'auto'
    core: str = 'scheduled'
    policy: str = 'fcfs'
    enable_priority: bool = False
    chunked_prefill_size: int = 256
    page_size: int = 16
    kv_pool_tokens: int = 16384
    max_running_requests: int = 64
    enable_prefill_delayer: bool = True
    prefill_decode_interval: int = 1
    enable_overlap: bool = True
    cpu_threads: int = 1
    cuda_graphs: bool = False
    late_policy: str = 'drop'
    max_instruction_bytes: int = 1024
    stats_period_s: float = 1.0
    robots: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        choices = {
            'device': ('auto', 'cpu', 'cuda'),
            'dtype': ('auto', 'float32', 'bfloat16', 'float16'),
            'core': CORES,
            'policy': POLICIES,
            'late_policy': LATE_POLICIES,
        }
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise EngineConfigError(
                    f'{name} must be one of {allowed}, got {getattr(self, name)!r}'
                )
        for name in (
            'chunked_prefill_size',
            'page_size',
            'kv_pool_tokens',
            'max_running_requests',
            'max_instruction_bytes',
            'cpu_threads',
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise EngineConfigError(f'{name} must be a positive integer, got {value!r}')
        if self.kv_pool_tokens < self.page_size:
            raise EngineConfigError(
                f'kv_pool_tokens ({self.kv_pool_tokens}) is smaller than one page '
                f'({self.page_size})'
            )
        interval = self.prefill_decode_interval
        if isinstance(interval, bool) or not isinstance(interval, int) or interval < 0:
            raise EngineConfigError(f'prefill_decode_interval must be >= 0, got {interval!r}')
        if not self.stats_period_s > 0:
            raise EngineConfigError(f'stats_period_s must be > 0, got {self.stats_period_s!r}')
        for robot_id, settings in self.robots.items():
            if not robot_id or not isinstance(settings, Mapping):
                raise EngineConfigError(f'robots: bad entry {robot_id!r}: {settings!r}')
            unknown = set(settings) - {'priority'}
            if unknown:
                raise EngineConfigError(f'robots.{robot_id}: unknown keys {sorted(unknown)}')
            priority = settings.get('priority', 0)
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise EngineConfigError(f'robots.{robot_id}.priority must be an integer')

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> EngineConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise EngineConfigError(f'unknown engine settings {unknown}')
        return cls(**dict(data))

    def to_mapping(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out['robots'] = {k: dict(v) for k, v in self.robots.items()}
        return out

    def robot_priority(self, robot_id: str) -> int:
        return int(self.robots.get(robot_id, {}).get('priority', 0))
