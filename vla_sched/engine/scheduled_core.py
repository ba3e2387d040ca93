"""The engine core that batches every robot's steps: scheduler + paged KV + model runner.

A well-formed ``StepRequest`` becomes a scheduler ``Req`` through the ``StepTranslator``
(prompt, image span, H*D action tokens, the robot's deadline), and the robot's session is
opened on its first step, its prefix swapped when the instruction version changes. Each
``step`` runs one scheduler iteration; requests that end become ``StepResult`` (tokens ->
actions) or ``StepFailure`` (the abort reason mapped to the frontend's reasons).

An OpenVLA-OFT folder (``engine.oft_preset`` set) runs on the same scheduler and KV with
the ``ParallelActionRunner``: the ``OFTStepTranslator`` makes each step one prefill-only
request (the whole OFT sequence, every camera, the state; no session), the scheduler
batches the steps of several robots into one pass and frees their KV after it, and the
result's actions are the pass's action chunk (``prefill_ms`` the pass, ``decode_ms`` 0).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vla_sched.core.forward_batch import BatchRunner
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.memory.pages import round_down_to_page, round_up_to_page
from vla_sched.core.scheduling.request import AbortReason, Req
from vla_sched.core.scheduling.scheduler import Scheduler
from vla_sched.core.scheduling.scheduler_config import PrefillDelayerConfig, SchedulerConfig
from vla_sched.engine.checkpoints import (
    check_model_path,
    read_configured_spec,
    resolve_checkpoint,
)
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.core_stats import engine_info, engine_stats, oft_engine_info
from vla_sched.engine.device_choice import pick_device_and_dtype
from vla_sched.engine.oft_step_translator import OFTStepTranslator
from vla_sched.engine.step_checks import refuse_malformed
from vla_sched.engine.step_translator import StepTranslator
from vla_sched.ipc.messages import (
    EngineInfo,
    EngineStats,
    FailureReason,
    StepFailure,
    StepRequest,
    StepResult,
)
from vla_sched.model.config.openvla_oft import OFTCheckpointSpec
from vla_sched.model.prompting.action_tokenizer import ActionChunkDecoder

if TYPE_CHECKING:
    import torch

    from vla_sched.model.config.checkpoint_spec import CheckpointSpec

logger = logging.getLogger(__name__)

# Scheduler abort reasons as the frontend reports them; the rest are internal errors.
FAILURE_OF_ABORT = {
    AbortReason.OUT_OF_MEMORY: FailureReason.KV_POOL_FULL,
    AbortReason.SUPERSEDED: FailureReason.SUPERSEDED,
    AbortReason.DEADLINE_MISSED: FailureReason.DEADLINE_MISSED,
    AbortReason.WAITING_TIMEOUT: FailureReason.DEADLINE_MISSED,
    AbortReason.RUNNING_TIMEOUT: FailureReason.DEADLINE_MISSED,
    AbortReason.PROMPT_TOO_LONG: FailureReason.INVALID_INSTRUCTION,
    AbortReason.MAX_NEW_TOKENS_UNFIT: FailureReason.KV_POOL_FULL,
    AbortReason.QUEUE_FULL: FailureReason.QUEUE_FULL,
    AbortReason.PREEMPTED_BY_PRIORITY: FailureReason.QUEUE_FULL,
    AbortReason.CLIENT: FailureReason.CANCELLED,
    AbortReason.SESSION_CLOSED: FailureReason.CANCELLED,
}
PROMPT_MARGIN_TOKENS = 64  # template text around the instruction (BOS, prefix, suffix), in tokens
# A request row's room beyond the prompt's text, image and action tokens: the state tokens
# (one per state value) and the scheduler's length reserve (``intake.RequestLimits``: a
# prompt leaves at least 7 tokens of the row, prompt plus new tokens at least 2).
CONTEXT_RESERVE_TOKENS = 64
# OpenVLA-OFT: a pass holds at least this many of the longest steps a request row takes.
OFT_MIN_STEPS_PER_PASS = 4


class ScheduledCore:
    """Serves every robot's steps through one ``Scheduler`` (see the module docstring).

    Args:
        config: the engine's settings.
        folder: the checkpoint folder.
        random_weights: whether the checkpoint is the built-in random one (reported in
            ``info``).
        scheduler_config: the scheduler's settings; default: what the engine derives from
            ``config`` on its device (``scheduler_config_for``).
        wrap_runner: replaces the model runner the scheduler launches steps on by what it
            returns for it (a benchmark records or paces the launches).
    """

    def __init__(
        self,
        config: EngineConfig,
        *,
        folder: Path,
        random_weights: bool,
        scheduler_config: SchedulerConfig | None = None,
        wrap_runner: Callable[[BatchRunner], BatchRunner] | None = None,
    ) -> None:
        self.config = config
        spec = read_configured_spec(folder, config)
        device, dtype = pick_device_and_dtype(config)
        self.memory = KVMemory(kv_memory_config_for(config, spec))
        num_kv_slots = (self.memory.allocator.num_pages + 1) * config.page_size
        if isinstance(spec, OFTCheckpointSpec):
            self.translator = OFTStepTranslator.from_checkpoint(folder, spec, config)
            runner = _oft_runner(folder, spec, self.memory, num_kv_slots, device, dtype, config)
            self.decoder = None
            info = oft_engine_info(
                spec,
                model_name=self.translator.model_name,
                max_instruction_bytes=config.max_instruction_bytes,
                random_weights=random_weights,
            )
        else:
            self.translator = StepTranslator.from_checkpoint(folder, config, spec=spec)
            runner = _token_runner(folder, spec, self.memory, num_kv_slots, device, dtype, config)
            self.decoder = ActionChunkDecoder.for_checkpoint(spec)
            info = engine_info(
                spec,
                model_name=self.translator.model_name,
                max_instruction_bytes=config.max_instruction_bytes,
                random_weights=random_weights,
            )
        self.spec = spec
        if wrap_runner is not None:
            runner = wrap_runner(runner)
        if scheduler_config is None:
            scheduler_config = scheduler_config_for(
                config, device.type, min_chunk_tokens=oft_pass_tokens(self.memory.config, spec)
            )
        self.scheduler = Scheduler(scheduler_config, self.memory, runner,
                                   clock=time.time_ns)  # fmt: skip
        self._info = info

    @classmethod
    def from_config(
        cls,
        config: EngineConfig,
        *,
        scheduler_config: SchedulerConfig | None = None,
        wrap_runner: Callable[[BatchRunner], BatchRunner] | None = None,
    ) -> ScheduledCore:
        """The core of ``config.model_path`` (checked first; empty: the built-in tiny
        checkpoint); the keywords as for the constructor."""
        check_model_path(config)
        folder, random_weights = resolve_checkpoint(config.model_path)
        return cls(
            config,
            folder=folder,
            random_weights=random_weights,
            scheduler_config=scheduler_config,
            wrap_runner=wrap_runner,
        )

    @property
    def info(self) -> EngineInfo:
        return self._info

    # ---- steps -------------------------------------------------------------------------

    def submit(self, request: StepRequest, now_ns: int) -> list[StepFailure]:
        refused = refuse_malformed(request, self._info, self.scheduler.metrics)
        if refused:
            return refused
        step = self.translator.translate(request)
        if step.session_prefix is not None:
            self.scheduler.open_or_update_session(
                request.robot_id, step.session_prefix, instruction_version=step.instruction_version
            )
        reason = self.scheduler.add_request(step.req)
        if reason is None:
            return []
        return [self._failure(step.req)]

    def close_session(self, robot_id: str) -> None:
        self.scheduler.close_session(robot_id)

    def has_work(self) -> bool:
        return self.scheduler.has_work()

    def step(self, now_ns: int) -> list[StepResult | StepFailure]:
        out: list[StepResult | StepFailure] = []
        for req in self.scheduler.run_once():
            if req.finished_reason is not None and not req.finished_reason.is_abort:
                out.append(self._result(req))
            else:
                out.append(self._failure(req))
        return out

    def _result(self, req: Req) -> StepResult:
        times = req.times
        received = times.received_ns if times.received_ns is not None else times.arrival_ns
        admitted = times.admitted_ns or received
        first = times.first_token_ns or admitted
        last = times.finished_ns or times.last_token_ns or first
        if req.prefill_only:  # OpenVLA-OFT: the chunk of the step's one pass, no decode
            actions = np.asarray(req.action_chunk, dtype=np.float32)
            last = first
        else:
            actions = self.decoder.decode(
                req.output_ids, clip_to_bins=self.translator.whole_vocab
            ).astype(np.float32)
        return StepResult(
            robot_id=req.robot_id,
            step_seq=req.step_seq,
            stamp_ns=req.stamp_ns,
            actions=actions,
            queue_ms=(admitted - received) / 1e6,
            prefill_ms=(first - admitted) / 1e6,
            decode_ms=(last - first) / 1e6,
            late=req.late,
            num_cached_prefix_tokens=req.num_cached_tokens,
        )

    def _failure(self, req: Req) -> StepFailure:
        finish = req.finished_reason
        abort = finish.abort if finish is not None else None
        # The scheduler has counted this abort already.
        reason = FAILURE_OF_ABORT.get(abort, FailureReason.INTERNAL_ERROR)
        too_long = len(req.origin_input_ids) + req.max_new_tokens
        if abort is AbortReason.PROMPT_TOO_LONG and too_long <= self.memory.config.max_context_len:
            reason = FailureReason.KV_POOL_FULL  # it fits the context, not the pool
        detail = finish.message if finish is not None and finish.message else str(abort)
        if reason is FailureReason.KV_POOL_FULL:
            detail += (
                f' (KV pool: {self.memory.num_free_tokens()} free, '
                f'{self.memory.evictable_size()} evictable, '
                f'{self.memory.protected_size()} protected tokens)'
            )
            logger.warning('%s', detail)
        return StepFailure(req.robot_id, req.step_seq, req.stamp_ns or 0, reason, detail)

    def stats(self, now_ns: int) -> EngineStats:
        """The scheduler's counters, and its queue, batch and KV use read now."""
        chunked = self.scheduler.chunked_req
        return engine_stats(
            self.scheduler.metrics,
            now_ns,
            num_waiting=len(self.scheduler.waiting_queue),
            num_running=len(self.scheduler.running_batch.reqs),
            chunked_rid=chunked.rid if chunked is not None else '',
            kv_use_percent=100.0 * self.scheduler.token_usage(),
            session_prefix_tokens={s.robot_id: s.locked_len for s in self.scheduler.sessions()},
        )

    def check_integrity(self) -> None:
        self.scheduler.check_integrity()

    def close(self) -> None:
        for session in self.scheduler.sessions():
            self.scheduler.close_session(session.robot_id)


def kv_memory_config_for(c: EngineConfig, spec: CheckpointSpec) -> KVMemoryConfig:
    """The KV memory the engine sizes from ``c`` for ``spec``'s checkpoint.

    A request row (``max_context_len``, whole pages) holds the longest prompt the engine
    accepts (instruction bytes bound its tokens, ``PROMPT_MARGIN_TOKENS`` of template, the
    image tokens, ``CONTEXT_RESERVE_TOKENS``) and the step's action tokens. A session step's
    own KV is freed when it ends; a session idle for ``session_idle_timeout_s`` is closed.
    For an OpenVLA-OFT checkpoint the row holds one whole OFT sequence (every camera's
    image tokens, the proprio token, the action slots and the stop token) and no decoded
    token; its KV is freed after the pass.
    """
    num_tokens = (
        c.max_instruction_bytes + PROMPT_MARGIN_TOKENS + _non_text_tokens(spec)
        + CONTEXT_RESERVE_TOKENS
    )  # fmt: skip
    return KVMemoryConfig(
        num_pages=c.kv_pool_tokens // c.page_size,
        page_size=c.page_size,
        num_req_slots=c.max_running_requests,
        max_context_len=round_up_to_page(num_tokens, c.page_size),
        session_step_kv='free',
        session_idle_timeout_s=c.session_idle_timeout_s,
    )


def _non_text_tokens(spec: CheckpointSpec | OFTCheckpointSpec) -> int:
    """A step's tokens besides its prompt text and template."""
    if isinstance(spec, OFTCheckpointSpec):
        settings = spec.settings
        images = settings.num_images * spec.num_image_tokens
        return images + int(settings.use_proprio) + settings.num_action_tokens + 1  # + </s>
    return spec.num_image_tokens + spec.num_action_tokens


def oft_pass_tokens(kv: KVMemoryConfig, spec: CheckpointSpec | OFTCheckpointSpec) -> int:
    """The prefill tokens an OpenVLA-OFT checkpoint's passes must hold (0 for the others):
    ``OFT_MIN_STEPS_PER_PASS`` steps as long as a request row, since an OFT step is never
    cut into chunks (a longer one would be refused)."""
    if not isinstance(spec, OFTCheckpointSpec):
        return 0
    return OFT_MIN_STEPS_PER_PASS * kv.max_context_len


def scheduler_config_for(
    c: EngineConfig, device_type: str, *, min_chunk_tokens: int = 0
) -> SchedulerConfig:
    """The scheduler's settings the engine derives from ``c`` on a ``device_type`` device.

    Every exposed setting maps onto its SGLang knob (defaults and choices stay on
    ``EngineConfig``); the chunk size (the device's default for 0, raised to
    ``min_chunk_tokens``: ``oft_pass_tokens`` for an OpenVLA-OFT checkpoint) is rounded
    to whole pages. The rest are fixed for robots: a pass may prefill at least 1024 tokens,
    a robot's priority is ignored (not refused) while priority scheduling is off, and
    under 'drop' a step that cannot meet its deadline is dropped while it waits. Knobs not
    named here keep ``SchedulerConfig``'s SGLang defaults.
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


def _token_runner(
    folder: Path,
    spec: CheckpointSpec,
    memory: KVMemory,
    num_kv_slots: int,
    device: torch.device,
    dtype: torch.dtype,
    config: EngineConfig,
) -> BatchRunner:
    """The ``ModelRunner`` of a checkpoint whose actions are decoded tokens."""
    from vla_sched.model.loading.checkpoint import load_checkpoint
    from vla_sched.model.runner.model_runner import ModelRunner, RunnerConfig

    model = load_checkpoint(folder, device=device, dtype=dtype, spec=spec)
    return ModelRunner(
        model,
        req_to_token=memory.req_to_token_pool.req_to_token,
        num_kv_slots=num_kv_slots,
        config=RunnerConfig(cuda_graphs=config.cuda_graphs and device.type == 'cuda'),
    )


def _oft_runner(
    folder: Path,
    spec: OFTCheckpointSpec,
    memory: KVMemory,
    num_kv_slots: int,
    device: torch.device,
    dtype: torch.dtype,
    config: EngineConfig,
) -> BatchRunner:
    """The ``ParallelActionRunner`` of an OpenVLA-OFT checkpoint (its passes and the vision
    encoder replayed as CUDA graphs with ``engine.cuda_graphs`` on a GPU)."""
    from vla_sched.model.loading.oft_model import load_oft_checkpoint
    from vla_sched.model.runner.action_chunk_runner import ParallelActionRunner

    model = load_oft_checkpoint(folder, spec=spec, device=device, dtype=dtype)
    return ParallelActionRunner(
        model,
        req_to_token=memory.req_to_token_pool.req_to_token,
        num_kv_slots=num_kv_slots,
        cuda_graphs=config.cuda_graphs and device.type == 'cuda',
    )
