"""The engine's settings, and how the frontend runs and watches the engine.

Each setting is defined once, as a field made by ``vla_sched.settings.setting``; the node's
ROS parameters are derived from those fields (the field's ``group`` is the parameter
section). The frontend sends ``EngineConfig`` as a JSON-able mapping (the engine may run in
another process); ``EngineConfig.from_mapping`` validates every key without I/O and names the
offending one.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from vla_sched.core.scheduling.scheduler_config import (
    DEFAULT_CHUNKED_PREFILL_SIZE,
    LATE_POLICIES,
    PRIORITY_POLICIES,
    SCHEDULE_POLICIES,
)
from vla_sched.settings import check_settings, setting

DEVICES = ('auto', 'cpu', 'cuda')
DTYPES = ('auto', 'float32', 'bfloat16', 'float16')
CORES = ('scheduled', 'sequential')
ENGINE_MODES = ('process', 'inprocess')
ACTION_DECODINGS = ('auto', 'whole_vocab', 'action_range')
ROBOT_KEYS = ('priority', 'center_crop')  # what ``EngineConfig.robots`` may say of a robot
# OpenVLA-OFT platform presets (``model/families/openvla_oft/checkpoint.OFT_PRESETS``; ''
# for none).
OFT_PRESET_CHOICES = ('', 'aloha', 'bridge', 'libero')
# Prefill chunks when chunked_prefill_size is 0. On a CPU a short chunk keeps a new robot's
# prefill from stalling the others' decodes; on a GPU a whole OpenVLA prompt (about 280
# tokens) costs a few decode steps, and every extra chunk pays the eager pass's host time.
CPU_CHUNKED_PREFILL_SIZE = 256
GPU_CHUNKED_PREFILL_SIZE = DEFAULT_CHUNKED_PREFILL_SIZE


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
    ``cuda_graphs`` captures decode, prefill and the vision encoder as CUDA graphs, and for
    an OpenVLA-OFT checkpoint its passes (decoder and action head) and vision encoder (GPU
    only; ignored on the CPU).
    ``unnorm_key`` names the dataset whose statistics un-normalize the actions; it may stay
    empty only for a checkpoint with one dataset (or one that names its own).
    ``action_decoding`` chooses the action token ids: ``whole_vocab`` is OpenVLA's (greedy
    over the whole vocabulary; an id outside the action range is clipped into the nearest
    edge bin), ``action_range`` picks only among the action tokens (the greedy choice
    differs from OpenVLA's exactly when a non-action token would win), ``auto`` the
    checkpoint's own: ``whole_vocab`` for OpenVLA folders, ``action_range`` otherwise.

    ``max_instruction_tokens`` bounds an instruction in the model's tokens (counted by the
    checkpoint's family; a step beyond it is refused as INVALID_INSTRUCTION) as
    ``max_instruction_bytes`` bounds its bytes; a request row holds the tighter of the two.

    The settings without a group are not parameters of their own: the node fills them in
    from its ``deadlines``, ``limits`` and ``diagnostics`` settings and its robots' settings
    (``robots``: ``{robot_id: {'priority': int, 'center_crop': bool}}``, each key optional;
    ``center_crop`` true: the robot's frames get OpenVLA's LIBERO center crop before the
    model sees them).

    ``oft_preset`` serves an OpenVLA-OFT folder with the settings of one of upstream's
    platforms (chunk length, action and state sizes, normalization, cameras, center crop:
    ``oft_preset``); ``oft_num_images`` and ``oft_chunk_len`` (0: the preset's),
    ``oft_use_proprio`` and ``oft_center_crop`` override what a checkpoint of that platform
    may have been trained differently with. An OFT folder is served only with a preset, a
    preset only with an OFT folder, and only by the scheduled core (all three checked with
    the folder: ``checkpoints.check_model_path``).
    """

    model_path: str = setting(
        '', 'checkpoint folder (empty: the built-in tiny one)', group='engine'
    )
    unnorm_key: str = setting(
        '',
        "dataset whose statistics un-normalize actions (empty: the checkpoint's only one)",
        group='engine',
    )
    action_decoding: str = setting(
        'auto',
        "auto (the checkpoint's own), whole_vocab (OpenVLA's: greedy over the whole "
        'vocabulary, clipped into the action bins) or action_range (action tokens only)',
        choices=ACTION_DECODINGS,
        group='engine',
    )
    device: str = setting('auto', 'auto, cpu or cuda', choices=DEVICES, group='engine')
    dtype: str = setting('auto', 'weights and KV dtype', choices=DTYPES, group='engine')
    core: str = setting(
        'scheduled',
        'scheduled (batching) or sequential (baseline)',
        choices=CORES,
        group='engine',
    )
    oft_preset: str = setting(
        '',
        'OpenVLA-OFT platform preset: libero, aloha or bridge (empty: the folder is not OFT)',
        choices=OFT_PRESET_CHOICES,
        group='engine',
    )
    oft_num_images: int = setting(
        0,
        "OpenVLA-OFT: cameras per step, the primary first (0: the preset's)",
        min_value=0,
        max_value=3,
        group='engine',
    )
    oft_chunk_len: int = setting(
        0,
        "OpenVLA-OFT: actions per chunk (0: the preset's)",
        min_value=0,
        max_value=256,
        group='engine',
    )
    oft_use_proprio: bool = setting(
        True, 'OpenVLA-OFT: the robot state enters the model (as trained)', group='engine'
    )
    oft_center_crop: bool = setting(
        True,
        "OpenVLA-OFT: center-crop every camera image as upstream's evaluation does",
        group='engine',
    )
    cpu_threads: int = setting(
        1,
        'torch threads when the model runs on the CPU',
        min_value=1,
        max_value=256,
        group='engine',
    )
    cuda_graphs: bool = setting(
        True,
        'capture decode, prefill and the vision encoder as CUDA graphs, and an '
        "OpenVLA-OFT checkpoint's passes (GPU only)",
        group='engine',
    )
    policy: str = setting(
        'fcfs', 'waiting-queue order', choices=SCHEDULE_POLICIES, group='scheduler'
    )
    enable_priority: bool = setting(False, 'order by robot priority first', group='scheduler')
    chunked_prefill_size: int = setting(
        0,
        f'max prefill tokens per step (0: {CPU_CHUNKED_PREFILL_SIZE} on the CPU, '
        f'{GPU_CHUNKED_PREFILL_SIZE} on a GPU)',
        min_value=0,
        max_value=1 << 20,
        group='scheduler',
    )
    page_size: int = setting(
        16, 'tokens per KV page', min_value=1, max_value=1024, group='scheduler'
    )
    kv_pool_tokens: int = setting(
        16384, 'KV pool size in tokens', min_value=1, max_value=1 << 30, group='scheduler'
    )
    max_running_requests: int = setting(
        64, 'max steps decoding at once', min_value=1, max_value=4096, group='scheduler'
    )
    enable_prefill_delayer: bool = setting(
        True, 'delay prefills to protect decodes', group='scheduler'
    )
    enable_overlap: bool = setting(
        True,
        'process results one step behind the GPU (GPU only: on the CPU a step has its '
        'tokens when it returns)',
        group='scheduler',
    )
    num_continuous_decode_steps: int = setting(
        8,
        'decode steps one pass may run when no step waits for prefill (without overlap)',
        min_value=1,
        max_value=64,
        group='scheduler',
    )
    enable_mixed_chunk: bool = setting(
        True,
        'decode the running steps in each prefill pass (on a GPU with cuda_graphs only: '
        'the pass runs on the captured prefill path)',
        group='scheduler',
    )
    prefill_decode_interval: int = setting(
        1,
        'decode-only steps after each prefill (0: prefill first)',
        min_value=0,
        max_value=1000,
        group='scheduler',
    )
    session_idle_timeout_s: float = setting(
        30.0,
        "close a robot's session after this long without a step (s), unlocking its prompt "
        'prefix in the KV cache (0: never)',
        min_value=0.0,
        max_value=86400.0,
        group='scheduler',
    )
    late_policy: str = setting(
        'drop', 'drop late steps or deliver them marked late', choices=LATE_POLICIES
    )
    max_instruction_bytes: int = setting(
        1024, 'longest accepted instruction (UTF-8 bytes)', min_value=1, max_value=1 << 20
    )
    max_instruction_tokens: int = setting(
        256,
        "longest accepted instruction in the model's tokens (a step's pass grows with it)",
        min_value=1,
        max_value=1 << 20,
        group='engine',
    )
    stats_period_s: float = setting(
        1.0, 'period of the engine statistics (s)', min_value=0.05, max_value=60.0
    )
    seed: int = setting(
        0,
        "seed of a flow-matching model's noise (with the robot and its step number)",
        min_value=0,
        max_value=(1 << 31) - 1,
        group='engine',
    )
    rtc_execution_horizon: int = setting(
        10,
        "real-time chunking: actions of a new chunk guided towards the previous chunk's "
        '(the soft mask reaches 0 there; capped at the chunk)',
        min_value=1,
        max_value=1000,
        group='engine',
    )
    rtc_max_guidance: float = setting(
        10.0,
        "real-time chunking: the cap of the guidance weight (the paper's beta)",
        min_value=0.0,
        max_value=1000.0,
        group='engine',
    )
    rtc_mask_schedule: str = setting(
        'linear',
        'real-time chunking: how the soft mask decays from the frozen actions to the horizon',
        choices=('zeros', 'ones', 'linear', 'exp'),
        group='engine',
    )
    pi0_tokenizer_path: str = setting(
        '',
        "pi0 / pi0.5: folder of PaliGemma's tokenizer files (empty: the Hugging Face cache)",
        group='engine',
    )
    smolvla_vlm_path: str = setting(
        '',
        "SmolVLA: folder of the VLM's config.json and tokenizer files (empty: the Hugging Face "
        "cache of the folder's vlm_model_name)",
        group='engine',
    )
    robots: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        check_settings(self, error=EngineConfigError)
        if self.kv_pool_tokens < self.page_size:
            raise EngineConfigError(
                f'kv_pool_tokens ({self.kv_pool_tokens}) is smaller than one page '
                f'({self.page_size})'
            )
        if self.enable_priority and self.policy not in PRIORITY_POLICIES:
            raise EngineConfigError(
                f'scheduler.enable_priority works with policy {" or ".join(PRIORITY_POLICIES)}'
                f', not {self.policy!r}'
            )
        self._check_family_settings()
        for robot_id, settings in self.robots.items():
            if not robot_id or not isinstance(settings, Mapping):
                raise EngineConfigError(f'robots: bad entry {robot_id!r}: {settings!r}')
            unknown = set(settings) - set(ROBOT_KEYS)
            if unknown:
                raise EngineConfigError(f'robots.{robot_id}: unknown keys {sorted(unknown)}')
            priority = settings.get('priority', 0)
            if isinstance(priority, bool) or not isinstance(priority, int):
                raise EngineConfigError(f'robots.{robot_id}.priority must be an integer')
            if not isinstance(settings.get('center_crop', False), bool):
                raise EngineConfigError(f'robots.{robot_id}.center_crop must be a boolean')

    def _check_family_settings(self) -> None:
        """Each model family's own settings (``oft_*``), checked by the family, no I/O."""
        from vla_sched.model.families.protocol import FamilyError
        from vla_sched.model.families.registry import check_engine_settings

        try:
            check_engine_settings(self.to_mapping())
        except FamilyError as exc:
            raise EngineConfigError(str(exc)) from None

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> EngineConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise EngineConfigError(f'unknown engine settings {unknown}')
        return cls(**dict(data))

    def to_mapping(self) -> dict[str, Any]:
        """Every field as JSON-able values; ``from_mapping`` rebuilds an equal config."""
        out = dataclasses.asdict(self)
        out['robots'] = {k: dict(v) for k, v in self.robots.items()}
        return out

    def robot_priority(self, robot_id: str) -> int:
        return int(self.robots.get(robot_id, {}).get('priority', 0))

    def robot_center_crop(self, robot_id: str) -> bool:
        return bool(self.robots.get(robot_id, {}).get('center_crop', False))

    def prefill_chunk_tokens(self, device_type: str) -> int:
        """Prefill tokens per step on ``device_type`` ('cpu', 'cuda'): the setting, or for 0
        the device's default."""
        if self.chunked_prefill_size:
            return self.chunked_prefill_size
        return CPU_CHUNKED_PREFILL_SIZE if device_type == 'cpu' else GPU_CHUNKED_PREFILL_SIZE


@dataclass(frozen=True, slots=True)
class EngineLinkConfig:
    """How the frontend runs the engine and watches it (``engine.*`` parameters).

    Heartbeats go both ways every ``heartbeat_period_s``; an engine not heard from for
    ``heartbeat_timeout_s`` is presumed dead. Beats are sent between scheduler iterations, so
    the timeout must exceed the slowest iteration; a dead process or thread is noticed by its
    exit within a heartbeat period, without waiting for the timeout. A dead engine is
    restarted after ``restart_delay_s``, doubled for each restart in a row up to
    ``restart_max_delay_s``; an engine that stays ready for ``restart_max_delay_s`` ends the
    row. One not ready ``start_timeout_s`` after a start is dead. The frontend is woken by the
    engine's messages; it polls nothing.
    """

    mode: str = setting(
        'process',
        'process: own process over ZMQ; inprocess: thread',
        choices=ENGINE_MODES,
        group='engine',
    )
    heartbeat_period_s: float = setting(
        0.2, 'heartbeat period both ways (s)', min_value=0.01, max_value=10.0, group='engine'
    )
    heartbeat_timeout_s: float = setting(
        1.0, 'engine presumed dead after (s)', min_value=0.05, max_value=60.0, group='engine'
    )
    restart_delay_s: float = setting(
        1.0,
        'wait before the first restart of a dead engine (s); doubles for each restart in a row',
        min_value=0.0,
        max_value=600.0,
        group='engine',
    )
    restart_max_delay_s: float = setting(
        30.0,
        'longest wait before a restart (s); an engine ready this long resets the wait',
        min_value=0.0,
        max_value=3600.0,
        group='engine',
    )
    start_timeout_s: float = setting(
        120.0,
        'an engine not ready after this is dead (s)',
        min_value=1.0,
        max_value=3600.0,
        group='engine',
    )

    def __post_init__(self) -> None:
        check_settings(self, error=EngineConfigError)
        if self.heartbeat_period_s >= self.heartbeat_timeout_s:
            raise EngineConfigError(
                'engine.heartbeat_period_s must be below engine.heartbeat_timeout_s'
            )
        if self.restart_max_delay_s < self.restart_delay_s:
            raise EngineConfigError(
                f'engine.restart_max_delay_s ({self.restart_max_delay_s}) is below '
                f'engine.restart_delay_s ({self.restart_delay_s})'
            )
