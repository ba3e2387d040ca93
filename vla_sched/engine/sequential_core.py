"""One step at a time through transformers' ``generate``: how single-robot VLA servers run.

This is the comparison point for the scheduled core: no batching, no KV reuse across steps,
the whole prompt prefilled on every step. It shares the input checks, the robot rules
(``RobotRules``: a newer step supersedes the waiting one, an older one is refused, a step's
deadline is judged by the same test) and the statistics with the scheduled core, so the two
differ only in how steps execute.
"""

from __future__ import annotations

import itertools
import time
from collections import OrderedDict

from vla_sched.core.scheduling.robot_rules import RobotRules
from vla_sched.engine.checkpoints import check_model_path, open_served, resolve_checkpoint
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.core_stats import (
    engine_info,
    engine_stats,
    new_metrics,
    record_failure,
)
from vla_sched.engine.device_choice import pick_device_and_dtype
from vla_sched.engine.step_checks import InstructionTokenLimit, refuse_malformed
from vla_sched.ipc.messages import (
    EngineInfo,
    EngineStats,
    FailureReason,
    StepFailure,
    StepRequest,
    StepResult,
)


class SequentialCore:
    """Serves steps one by one on the checkpoint family's one-step baseline (transformers'
    ``generate``; see the module docstring)."""

    def __init__(self, config: EngineConfig, *, folder, random_weights: bool) -> None:
        self.config = config
        self.device, self.dtype = pick_device_and_dtype(config)
        served = open_served(folder, config)
        self.baseline = served.one_step_baseline(device=self.device, dtype=self.dtype)
        self._token_limit = InstructionTokenLimit(
            config.max_instruction_tokens, served.instruction_tokens
        )
        self._info = engine_info(
            served,
            max_instruction_bytes=config.max_instruction_bytes,
            random_weights=random_weights,
        )
        # Each robot's waiting step and when it arrived here (ns): latencies start there.
        self._waiting: OrderedDict[str, tuple[StepRequest, int]] = OrderedDict()
        self.rules = RobotRules(late_policy=config.late_policy)
        self.metrics = new_metrics()

    @classmethod
    def from_config(cls, config: EngineConfig) -> SequentialCore:
        check_model_path(config)
        folder, random_weights = resolve_checkpoint(config.model_path)
        return cls(config, folder=folder, random_weights=random_weights)

    @property
    def info(self) -> EngineInfo:
        return self._info

    def submit(self, request: StepRequest, now_ns: int) -> list[StepFailure]:
        refused = refuse_malformed(
            request, self._info, self.metrics, token_limit=self._token_limit
        )
        if refused:
            return refused
        waiting = self._waiting.get(request.robot_id)
        older, stale = self.rules.superseded(request, [waiting[0]] if waiting else [])
        if stale:
            return [self._superseded(request, 'is not newer than the step its robot has')]
        why = f'was superseded by step {request.step_seq}'
        out = [self._superseded(old, why) for old in older]
        self._waiting.pop(request.robot_id, None)  # the newest queues behind the others
        self._waiting[request.robot_id] = (request, now_ns)
        return out

    def _superseded(self, request: StepRequest, why: str) -> StepFailure:
        record_failure(self.metrics, request.robot_id, FailureReason.SUPERSEDED)
        return StepFailure(
            request.robot_id, request.step_seq, request.stamp_ns, FailureReason.SUPERSEDED,
            f'step {request.step_seq} {why}',
        )  # fmt: skip

    def close_session(self, robot_id: str) -> None:
        self._waiting.pop(robot_id, None)

    def has_work(self) -> bool:
        return bool(self._waiting)

    def step(self, now_ns: int) -> list[StepResult | StepFailure]:
        _, (request, arrival_ns) = self._waiting.popitem(last=False)
        if self.rules.is_overdue(request, now_ns) and self.rules.drops_late_steps:
            record_failure(self.metrics, request.robot_id, FailureReason.DEADLINE_MISSED)
            return [
                StepFailure(
                    request.robot_id, request.step_seq, request.stamp_ns,
                    FailureReason.DEADLINE_MISSED,
                    f'waited {(now_ns - request.received_ns) / 1e6:.1f} ms, past its deadline',
                )
            ]  # fmt: skip
        result = self._generate(request, arrival_ns=arrival_ns, start_ns=now_ns)
        if result.late and self.rules.drops_late_steps:
            record_failure(self.metrics, request.robot_id, FailureReason.DEADLINE_MISSED)
            done_ms = (time.time_ns() - request.deadline_ns) / 1e6
            return [
                StepFailure(
                    request.robot_id, request.step_seq, request.stamp_ns,
                    FailureReason.DEADLINE_MISSED, f'done {done_ms:.1f} ms after its deadline',
                )
            ]  # fmt: skip
        return [result]

    def _generate(self, request: StepRequest, *, arrival_ns: int, start_ns: int) -> StepResult:
        """Generate one step that arrived at ``arrival_ns`` and starts at ``start_ns``."""
        start = time.perf_counter()
        out = self.baseline.run(
            request, center_crop=self.config.robot_center_crop(request.robot_id)
        )
        end = time.perf_counter()
        stamps = [start, *out.token_times_s, end]
        prefill_ms = (stamps[1] - start) * 1e3
        decode_ms = (end - stamps[1]) * 1e3
        done_ns = time.time_ns()
        late = self.rules.is_overdue(request, done_ns)
        queue_ms = (start_ns - request.received_ns) / 1e6
        robot = request.robot_id
        self.metrics.record_first_token(robot, start_ns - arrival_ns + int(prefill_ms * 1e6))
        for a, b in itertools.pairwise(stamps[1:-1]):
            self.metrics.record_itl(robot, int((b - a) * 1e9))
        self.metrics.record_cache_hit(robot, 0, out.num_prompt_tokens)
        if late and not self.rules.drops_late_steps:
            self.metrics.record_deadline_miss(robot)
        if not (late and self.rules.drops_late_steps):
            self.metrics.record_step_done(robot, done_ns - arrival_ns)
        return StepResult(
            robot_id=request.robot_id,
            step_seq=request.step_seq,
            stamp_ns=request.stamp_ns,
            actions=out.actions,
            queue_ms=queue_ms,
            prefill_ms=prefill_ms,
            decode_ms=decode_ms,
            late=late,
            num_cached_prefix_tokens=0,
        )

    def stats(self, now_ns: int) -> EngineStats:
        return engine_stats(
            self.metrics,
            now_ns,
            num_waiting=len(self._waiting),
            num_running=0,
            chunked_rid='',
            kv_use_percent=0.0,
        )

    def close(self) -> None:
        self._waiting.clear()
