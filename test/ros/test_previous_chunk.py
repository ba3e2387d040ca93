"""A real-time-chunking robot's steps carry its previous chunk's actions still to run at the
step's action times, and the inference delay from its measured latency; a robot without
rtc, or its first step, carries none."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from vla_sched.ipc.messages import StepRequest, StepResult
from vla_sched.ros.camera_sync import CameraFrame
from vla_sched.ros.node_config import RobotConfig
from vla_sched.ros.previous_chunk import PublishedChunk, inference_delay
from vla_sched.ros.robot_slot import RobotSlot

MS = 1_000_000
CHUNK = np.arange(10 * 2, dtype=np.float32).reshape(10, 2)  # action j: [2j, 2j + 1]


@pytest.mark.parametrize(
    ('stamp_ms', 'first_row'), [(0, 0), (100, 1), (340, 3), (360, 4), (960, 10), (-100, 10)]
)
def test_the_remaining_actions_start_at_the_new_steps_time(stamp_ms, first_row):
    chunk = PublishedChunk(stamp_ns=1000 * MS, actions=CHUNK)
    rest = chunk.remaining_at((1000 + stamp_ms) * MS, dt_s=0.1)
    if first_row >= CHUNK.shape[0]:
        assert rest.shape == (0, 0)
    else:
        np.testing.assert_array_equal(rest, CHUNK[first_row:])


def test_the_delay_is_the_latency_in_actions_rounded_up_and_capped():
    assert inference_delay(float('nan'), dt_s=0.1, horizon=10) == 0
    assert inference_delay(0.0, dt_s=0.1, horizon=10) == 0
    assert inference_delay(99.0, dt_s=0.1, horizon=10) == 1
    assert inference_delay(250.0, dt_s=0.1, horizon=10) == 3
    assert inference_delay(5000.0, dt_s=0.1, horizon=10) == 10


def _slot(rtc: bool) -> RobotSlot:
    config = RobotConfig(robot_id='r1', period_s=0.1, instruction='pick it up', rtc=rtc, dt=0.1)
    return RobotSlot(config, window_s=1.0, created_ns=0)


def _step(slot: RobotSlot, stamp_ns: int) -> StepRequest:
    frame = CameraFrame(image=np.zeros((2, 2, 3), np.uint8), stamp_ns=stamp_ns,
                        received_ns=stamp_ns)  # fmt: skip
    slot.offer_image(frame)
    step = slot.take_step(stamp_ns, budget_ns=500 * MS, num_state=0, num_images=1, priority=0)
    assert isinstance(step, StepRequest), step
    slot.mark_sent(step)
    return step


def _finish(slot: RobotSlot, step: StepRequest, published_ns: int) -> None:
    result = StepResult(robot_id='r1', step_seq=step.step_seq, stamp_ns=step.stamp_ns,
                        actions=CHUNK, queue_ms=0.0, prefill_ms=0.0, decode_ms=0.0, late=False,
                        num_cached_prefix_tokens=0)  # fmt: skip
    assert slot.finish(result, published_ns)


@pytest.mark.parametrize('rtc', [True, False])
def test_a_robots_next_step_carries_its_previous_chunk_only_under_rtc(rtc):
    slot = _slot(rtc)
    first = _step(slot, 1000 * MS)
    assert first.previous_actions.shape == (0, 0) and first.inference_delay == 0
    _finish(slot, first, published_ns=1250 * MS)  # 250 ms from image to publish
    second = _step(slot, 1300 * MS)
    if not rtc:
        assert second.previous_actions.shape == (0, 0) and second.inference_delay == 0
        return
    np.testing.assert_array_equal(second.previous_actions, CHUNK[3:])
    assert second.inference_delay == 3


def test_the_request_fields_default_to_no_previous_chunk():
    fields = {f.name for f in dataclasses.fields(StepRequest)}
    assert {'previous_actions', 'inference_delay'} <= fields
