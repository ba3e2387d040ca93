"""Builds the scheduled engine core from the engine's settings: the one place a checkpoint's
family, the device, the KV memory, the model runner and the scheduler's settings are
chosen. ``ScheduledCore`` only serves steps on what this builds.

API::

    parts = assemble_core(config)          # reads the folder, loads the weights
    core = ScheduledCore(parts)
    # a benchmark that records or paces the runner's passes builds its own core:
    core = ScheduledCore(dataclasses.replace(parts, runner=Recorder(parts.runner)))

The family (``vla_sched.model.families.registry.family_of``) answers everything that
depends on the checkpoint: how a step becomes a request, the runner, the step's shape and
the rules the scheduler honours (``ServingRules``); the engine sizes a request row and the
prefill chunk from those rules alone.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

from vla_sched.core.forward_batch import BatchRunner
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.pages import round_down_to_page, round_up_to_page
from vla_sched.core.scheduling.scheduler import Scheduler
from vla_sched.core.scheduling.scheduler_config import PrefillDelayerConfig, SchedulerConfig
from vla_sched.engine.checkpoints import check_model_path, open_served, resolve_checkpoint
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.core_stats import engine_info
from vla_sched.engine.device_choice import pick_device_and_dtype
from vla_sched.ipc.messages import EngineInfo
from vla_sched.model.families.protocol import ServedModel, ServingRules

PROMPT_MARGIN_TOKENS = 64  # template text around the instruction (BOS, prefix, suffix), in tokens
# A request row's room beyond the prompt's text, image and action tokens: the state tokens
# (one per state value) and the scheduler's length reserve (``intake.RequestLimits``: a
# prompt leaves at least 7 tokens of the row, prompt plus new tokens at least 2).
CONTEXT_RESERVE_TOKENS = 64


@dataclass(frozen=True, slots=True)
class CoreParts:
    """What a ``ScheduledCore`` serves with.

    Attributes:
        config: the engine's settings.
        served: the checkpoint as its family serves it.
        memory: the paged KV memory.
        runner: the model runner the scheduler launches passes on.
        scheduler_config: the scheduler's settings.
        info: what the frontend is told about the checkpoint.
    """

    config: EngineConfig
    served: ServedModel
    memory: KVMemory
    runner: BatchRunner
    scheduler_config: SchedulerConfig
    info: EngineInfo

    def build_scheduler(self) -> Scheduler:
        return Scheduler(self.scheduler_config, self.memory, self.runner, clock=time.time_ns)


def assemble_core(
    config: EngineConfig, *, folder: Path | None = None, random_weights: bool | None = None
) -> CoreParts:
    """The parts of the scheduled core for ``config``: the folder of ``config.model_path``
    (checked first; empty: the built-in tiny checkpoint) unless ``folder`` is given, its
    family's served model, the KV memory sized for it, the runner with its weights loaded
    on the device ``config`` picks, and the scheduler's settings on that device."""
    if folder is None:
        check_model_path(config)
        folder, random_weights = resolve_checkpoint(config.model_path)
    served = open_served(folder, config)
    device, dtype = pick_device_and_dtype(config)
    memory = KVMemory(kv_memory_config_for(config, served.rules))
    runner = served.build_runner(
        req_to_token=memory.req_to_token_pool.req_to_token,
        num_kv_slots=(memory.allocator.num_pages + 1) * config.page_size,
        device=device,
        dtype=dtype,
        cuda_graphs=config.cuda_graphs,
    )
    min_pass = served.rules.min_steps_per_pass * memory.config.max_context_len
    return CoreParts(
        config=config,
        served=served,
        memory=memory,
        runner=runner,
        scheduler_config=scheduler_config_for(config, device.type, min_chunk_tokens=min_pass),
        info=engine_info(
            served,
            max_instruction_bytes=config.max_instruction_bytes,
            random_weights=bool(random_weights),
        ),
    )


def kv_memory_config_for(c: EngineConfig, rules: ServingRules) -> KVMemoryConfig:
    """The KV memory the engine sizes from ``c`` for a family's ``rules``.

    A request row (``max_context_len``, whole pages) holds the longest prompt the engine
    accepts (the instruction's tokens, bounded by ``max_instruction_tokens`` and by its bytes
    (a token is at least a byte), whichever is tighter; ``PROMPT_MARGIN_TOKENS`` of template;
    the step's other tokens as the family counts them; ``CONTEXT_RESERVE_TOKENS``). A session
    step's own KV is freed when it ends; a session idle for ``session_idle_timeout_s`` is
    closed.
    """
    text_tokens = min(c.max_instruction_bytes, c.max_instruction_tokens)
    num_tokens = (
        text_tokens + PROMPT_MARGIN_TOKENS + rules.num_non_text_tokens + CONTEXT_RESERVE_TOKENS
    )
    return KVMemoryConfig(
        num_pages=c.kv_pool_tokens // c.page_size,
        page_size=c.page_size,
        num_req_slots=c.max_running_requests,
        max_context_len=round_up_to_page(num_tokens, c.page_size),
        session_step_kv='free',
        session_idle_timeout_s=c.session_idle_timeout_s,
    )


def scheduler_config_for(
    c: EngineConfig, device_type: str, *, min_chunk_tokens: int = 0
) -> SchedulerConfig:
    """The scheduler's settings the engine derives from ``c`` on a ``device_type`` device.

    Every exposed setting maps onto its SGLang knob (defaults and choices stay on
    ``EngineConfig``); the chunk size (the device's default for 0, raised to
    ``min_chunk_tokens``: what a family's ``min_steps_per_pass`` asks) is rounded to whole
    pages. The rest are fixed for robots: a pass may prefill at least 1024 tokens, a
    robot's priority is ignored (not refused) while priority scheduling is off, under
    'drop' a step that cannot meet its deadline is dropped while it waits, and a prefill pass
    is sized from the measured cost per token so its steps keep their deadlines. Knobs not named
    here keep ``SchedulerConfig``'s SGLang defaults.
    """
    chunk = c.prefill_chunk_tokens(device_type)
    chunk = max(c.page_size, round_down_to_page(chunk, c.page_size))
    chunk = max(chunk, round_up_to_page(min_chunk_tokens, c.page_size))
    return SchedulerConfig(
        schedule_policy=c.policy,
        max_running_requests=c.max_running_requests,
        chunked_prefill_size=chunk,
        max_prefill_tokens=max(chunk, 1024),
        enable_priority_scheduling=c.enable_priority,
        abort_on_priority_when_disabled=False,
        robot_priorities=(
            tuple((r, c.robot_priority(r)) for r in c.robots) if c.enable_priority else ()
        ),
        late_policy=c.late_policy,
        drop_unmeetable_steps=True,  # only under 'drop': keeps overload from collapsing
        # One long step (a long instruction) never makes the others in its pass late.
        size_passes_by_deadline=True,
        # On the CPU a step's tokens are known when it returns: nothing to overlap.
        enable_overlap=c.enable_overlap and device_type != 'cpu',
        num_continuous_decode_steps=c.num_continuous_decode_steps,
        # On a GPU a mixed pass runs on the captured prefill path (the running requests'
        # rows are one-token extends there), so it needs CUDA graphs.
        enable_mixed_chunk=(
            c.enable_mixed_chunk
            and (device_type == 'cpu' or (device_type == 'cuda' and c.cuda_graphs))
        ),
        prefill_delayer=PrefillDelayerConfig(enabled=c.enable_prefill_delayer),
        prefill_decode_interval=c.prefill_decode_interval,
    )
