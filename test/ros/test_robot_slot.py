"""Per-robot rules: newest observation wins, one step in flight, periods, deadlines."""

from __future__ import annotations

import math

import numpy as np
import pytest

from vla_sched.ipc.messages import FailureReason, StepFailure, StepRequest, StepResult
from vla_sched.ros.camera_sync import CameraFrame
from vla_sched.ros.node_config import RobotConfig
from vla_sched.ros.robot_slot import (
    Refusal,
    RobotSlot,
    stale_state_problem,
    stamp_problem,
)
from vla_sched.ros.text_bounds import MAX_DETAIL_CHARS
from vla_sched.ros.windows import CountingThrottle

MS = 1_000_000
S = 1_000_000_000
BUDGET = 500 * MS


def _slot(**overrides) -> RobotSlot:
    fields = {'robot_id': 'r1', 'period_s': 0.1, 'instruction': 'pick it up'}
    fields.update(overrides)
    return RobotSlot(RobotConfig(**fields), window_s=1.0, created_ns=0)


def _obs(stamp_ns: int, value: int = 0, *, received_ns: int | None = None) -> CameraFrame:
    received_ns = stamp_ns if received_ns is None else received_ns
    return CameraFrame(
        image=np.full((2, 2, 3), value, np.uint8), stamp_ns=stamp_ns, received_ns=received_ns
    )


def _take(slot: RobotSlot, now: int, num_state: int = 0, num_images: int = 0):
    """``num_images`` 0: the checkpoint takes as many images as the robot has cameras."""
    num_images = num_images or slot.cameras.num_cameras
    return slot.take_step(
        now, budget_ns=BUDGET, num_state=num_state, num_images=num_images, priority=3
    )


def _send(slot: RobotSlot, now: int) -> StepRequest:
    step = _take(slot, now)
    assert isinstance(step, StepRequest), step
    slot.mark_sent(step)
    return step


def _result(step: StepRequest, *, late: bool = False) -> StepResult:
    return StepResult(
        robot_id=step.robot_id,
        step_seq=step.step_seq,
        stamp_ns=step.stamp_ns,
        actions=np.zeros((2, 7), np.float32),
        queue_ms=1.0,
        prefill_ms=2.0,
        decode_ms=3.0,
        late=late,
        num_cached_prefix_tokens=12,
    )


def test_newest_observation_wins_and_the_dropped_one_is_counted():
    slot = _slot()
    slot.offer_image(_obs(1 * MS, value=1))
    slot.offer_image(_obs(2 * MS, value=2))
    step = _take(slot, 3 * MS)
    assert isinstance(step, StepRequest)
    assert step.stamp_ns == 2 * MS and int(step.images[0][0, 0, 0]) == 2
    assert slot.num_superseded == 1
    assert step.priority == 3 and step.instruction == 'pick it up'
    assert step.deadline_ns == 2 * MS + BUDGET


def test_at_most_one_step_in_flight():
    slot = _slot(trigger='on_image')
    slot.offer_image(_obs(0))
    step = _send(slot, 1 * MS)
    slot.offer_image(_obs(5 * MS))
    assert not slot.is_due(10 * S)
    assert slot.finish(_result(step), 20 * MS)
    assert slot.is_due(20 * MS)


def test_periodic_robot_is_due_once_per_period_and_skips_missed_periods():
    slot = _slot(period_s=0.1)
    slot.offer_image(_obs(0))
    assert slot.is_due(0)
    step = _send(slot, 0)
    slot.finish(_result(step), 10 * MS)
    slot.offer_image(_obs(20 * MS))
    assert not slot.is_due(99 * MS)
    assert slot.is_due(100 * MS)
    step = _send(slot, 100 * MS)
    slot.finish(_result(step), 450 * MS)
    slot.offer_image(_obs(450 * MS))
    # Fell behind (next period at 200 ms passed): back to its phase, the next period's start.
    assert not slot.is_due(451 * MS) and slot.due_at_ns() == 500 * MS
    assert slot.is_due(500 * MS)
    _send(slot, 503 * MS)  # a little late: the next one stays on the phase
    slot.in_flight = None
    slot.offer_image(_obs(560 * MS))
    assert not slot.is_due(599 * MS)
    assert slot.is_due(600 * MS)


def test_a_robot_waiting_only_for_its_period_says_when_it_is_due():
    slot = _slot(period_s=0.1)
    assert slot.due_at_ns() is None  # nothing to send
    slot.offer_image(_obs(0))
    step = _send(slot, 0)
    slot.offer_image(_obs(20 * MS))
    assert slot.due_at_ns() is None  # waits for its step in flight, not for a time
    slot.finish(_result(step), 30 * MS)
    assert slot.due_at_ns() == 100 * MS
    assert not slot.is_due(100 * MS - 1) and slot.is_due(slot.due_at_ns())
    on_image = _slot(trigger='on_image')
    on_image.offer_image(_obs(0))
    assert on_image.due_at_ns() is None and on_image.is_due(0)


def test_on_image_robot_is_due_on_every_new_image_only():
    slot = _slot(trigger='on_image')
    assert not slot.is_due(0)
    slot.offer_image(_obs(0))
    step = _send(slot, 0)
    slot.finish(_result(step), 1 * MS)
    assert not slot.is_due(2 * MS)
    slot.offer_image(_obs(3 * MS))
    assert slot.is_due(3 * MS)


def test_step_past_its_deadline_is_refused_before_sending():
    slot = _slot()
    slot.offer_image(_obs(0))
    refusal = _take(slot, BUDGET + 1)
    assert isinstance(refusal, Refusal)
    assert refusal.reason is FailureReason.DEADLINE_MISSED and refusal.step_seq == 0
    assert slot.num_deadline_misses == 1
    assert slot.pending is None and slot.in_flight is None


def test_refused_instruction_stops_the_robot_until_a_valid_one_arrives():
    slot = _slot()
    version = slot.instruction_version
    slot.refuse_instruction('instruction is empty')
    slot.offer_image(_obs(0))
    refusal = _take(slot, 1)
    assert isinstance(refusal, Refusal)
    assert refusal.reason is FailureReason.INVALID_INSTRUCTION
    assert 'instruction is empty' in refusal.detail
    slot.set_instruction('open the drawer')
    assert slot.instruction_version == version + 2
    slot.offer_image(_obs(200 * MS))
    step = _take(slot, 200 * MS)
    assert isinstance(step, StepRequest) and step.instruction == 'open the drawer'


def test_state_is_required_when_the_checkpoint_takes_it():
    slot = _slot(state_joint_names=('a', 'b'))
    slot.offer_image(_obs(0))
    refusal = _take(slot, 1, num_state=2)
    assert isinstance(refusal, Refusal) and refusal.reason is FailureReason.INVALID_STATE
    assert 'no joint_states' in refusal.detail
    slot.set_state(np.array([0.5, -0.5], np.float32), stamp_ns=150 * MS)
    slot.offer_image(_obs(200 * MS))
    step = _take(slot, 200 * MS, num_state=2)
    assert isinstance(step, StepRequest)
    np.testing.assert_array_equal(step.state, [0.5, -0.5])
    slot.refuse_state("joint_states has non-finite positions for ['b']")
    slot.offer_image(_obs(400 * MS))
    refusal = _take(slot, 400 * MS, num_state=2)
    assert isinstance(refusal, Refusal) and 'non-finite' in refusal.detail


def test_state_name_count_must_match_the_checkpoint():
    slot = _slot(state_joint_names=('a',))
    slot.set_state(np.zeros(1, np.float32), stamp_ns=1)
    slot.offer_image(_obs(0))
    refusal = _take(slot, 1, num_state=7)
    assert isinstance(refusal, Refusal)
    assert 'takes 7 state values but state_joint_names has 1' in refusal.detail


def _stale(state_ns: int, image_ns: int, now_ns: int, **limits) -> str | None:
    config = RobotConfig('r1', **limits)
    return stale_state_problem(state_ns, image_stamp_ns=image_ns, now_ns=now_ns, config=config)


def test_a_state_older_than_its_limit_is_stale_naming_the_setting():
    limits = {'max_state_age_s': 0.5, 'max_state_image_skew_s': 0.0}
    assert _stale(1 * S, 1 * S, 1 * S + 500 * MS, **limits) is None  # at the limit: fresh
    problem = _stale(1 * S, 1 * S, 1 * S + 501 * MS, **limits)
    assert 'joint state is 0.501 s old' in problem
    assert 'robots.r1.max_state_age_s = 0.5 s' in problem


def test_a_state_stamped_far_from_its_image_is_stale_either_way():
    limits = {'max_state_age_s': 0.0, 'max_state_image_skew_s': 0.1}
    assert _stale(1 * S, 1 * S + 100 * MS, 2 * S, **limits) is None
    before = _stale(1 * S, 1 * S + 101 * MS, 2 * S, **limits)
    assert 'stamped 0.101 s before the image' in before
    assert 'robots.r1.max_state_image_skew_s = 0.1 s' in before
    after = _stale(1 * S + 250 * MS, 1 * S, 2 * S, **limits)
    assert 'stamped 0.250 s after the image' in after


def test_a_zero_state_stamp_is_stale_unless_both_checks_are_off():
    assert 'header.stamp is zero' in _stale(0, 1 * S, 1 * S)
    assert _stale(0, 1 * S, 1 * S, max_state_age_s=0.0, max_state_image_skew_s=0.0) is None
    # either limit alone still needs to know when the state was measured
    assert _stale(0, 1 * S, 1 * S, max_state_age_s=0.0) is not None


def test_a_step_with_a_stale_state_is_refused_with_its_own_reason():
    slot = _slot(state_joint_names=('a', 'b'), max_state_age_s=0.2)
    slot.set_state(np.array([0.5, -0.5], np.float32), stamp_ns=1 * S)
    slot.offer_image(_obs(1 * S + 100 * MS))
    step = _take(slot, 1 * S + 150 * MS, num_state=2)
    assert isinstance(step, StepRequest)
    np.testing.assert_array_equal(step.state, [0.5, -0.5])
    # joint_states stops: the next step is refused, never sent with the old state
    slot.offer_image(_obs(1 * S + 300 * MS))
    refusal = _take(slot, 1 * S + 300 * MS, num_state=2)
    assert isinstance(refusal, Refusal) and refusal.reason is FailureReason.STALE_STATE
    assert 'joint state is 0.300 s old' in refusal.detail
    view = slot.view(1 * S + 300 * MS)
    assert view.refused_by_reason == {'stale_state': 1}
    assert view.last_error.startswith('stale_state: joint state is 0.300 s old')
    assert view.state_age_s == pytest.approx(0.3)
    # a fresh state serves again
    slot.set_state(np.array([0.1, 0.2], np.float32), stamp_ns=1 * S + 390 * MS)
    slot.offer_image(_obs(1 * S + 400 * MS))
    assert isinstance(_take(slot, 1 * S + 400 * MS, num_state=2), StepRequest)


def test_state_age_is_not_reported_for_a_robot_without_state_joints():
    slot = _slot()
    assert math.isnan(slot.view(1 * S).state_age_s)
    with_joints = _slot(state_joint_names=('a',))
    assert math.isnan(with_joints.view(1 * S).state_age_s)  # no state yet
    with_joints.set_state(np.zeros(1, np.float32), stamp_ns=1 * S)
    assert with_joints.view(1 * S + 250 * MS).state_age_s == pytest.approx(0.25)


def test_a_robot_without_state_joints_is_never_refused_for_its_state():
    slot = _slot(max_state_age_s=0.001)
    slot.offer_image(_obs(1 * S))
    assert isinstance(_take(slot, 1 * S + 100 * MS, num_state=0), StepRequest)


def test_step_seq_counts_only_sent_steps():
    slot = _slot(trigger='on_image')
    slot.offer_image(_obs(0))
    first = _send(slot, 0)
    slot.finish(_result(first), 1 * MS)
    slot.offer_image(_obs(0))
    assert isinstance(_take(slot, BUDGET + 1), Refusal)  # refused: no step created
    slot.offer_image(_obs(2 * S))
    second = _send(slot, 2 * S)
    assert (first.step_seq, second.step_seq) == (1, 2)


def test_results_of_steps_not_in_flight_are_ignored():
    slot = _slot(trigger='on_image')
    slot.offer_image(_obs(0))
    step = _send(slot, 0)
    refusal = slot.abandon(FailureReason.ENGINE_UNAVAILABLE, 'engine dead', 5 * MS)
    assert refusal is not None and refusal.step_seq == step.step_seq
    assert not slot.finish(_result(step), 6 * MS)  # arrives after the engine was lost
    assert slot.num_chunks == 0
    assert slot.refused_by_reason == {'engine_unavailable': 1}


def test_engine_failures_end_the_step_and_are_counted():
    slot = _slot(trigger='on_image')
    slot.offer_image(_obs(0))
    step = _send(slot, 0)
    other = StepFailure('r1', step.step_seq + 5, 0, FailureReason.KV_POOL_FULL, 'x')
    assert slot.fail(other, 1) is None and slot.in_flight is not None
    failure = StepFailure('r1', step.step_seq, 0, FailureReason.DEADLINE_MISSED, 'too late')
    refusal = slot.fail(failure, 2)
    assert refusal is not None and refusal.reason is FailureReason.DEADLINE_MISSED
    assert slot.in_flight is None and slot.num_deadline_misses == 1
    assert slot.last_error == 'deadline_missed: too late'


def test_view_reports_rate_latency_and_silence_over_the_window():
    slot = _slot(trigger='on_image', period_s=0.1)
    now = 0
    for _ in range(10):
        slot.offer_image(_obs(now))
        step = _send(slot, now)
        now += 100 * MS
        slot.finish(_result(step, late=now > 500 * MS), now)
    view = slot.view(now)
    assert view.num_chunks == 10
    assert view.action_rate_hz == pytest.approx(10.0)
    assert view.target_rate_hz == pytest.approx(10.0)
    assert view.stamp_to_publish_ms_p50 == pytest.approx(100.0)
    assert view.num_deadline_misses == 5
    assert view.rate_judged and view.seen_image
    later = slot.view(now + 3 * S)
    assert later.action_rate_hz == 0.0
    assert later.silent_s == pytest.approx(3.1)


def test_step_latency_percentiles_and_publish_jitter_are_reported_per_robot():
    slot = _slot(trigger='on_image', period_s=0.1)
    # published 0, 100, 230 and 310 ms after the first: intervals 100, 130, 80 ms against a
    # period of 100 ms, so |interval - period| is 0, 30 and 20 ms
    for k, published in enumerate((1000, 1100, 1230, 1310)):
        stamp = published * MS - (40 + 20 * k) * MS  # latencies 40, 60, 80, 100 ms
        slot.offer_image(_obs(stamp))
        slot.finish(_result(_send(slot, stamp)), published * MS)
    view = slot.view(1310 * MS)
    assert view.stamp_to_publish_ms_p50 == pytest.approx(70.0)
    assert view.stamp_to_publish_ms_p95 == pytest.approx(97.0)
    assert view.stamp_to_publish_ms_p99 == pytest.approx(99.4)
    assert view.publish_jitter_ms_p99 == pytest.approx(29.8)
    assert math.isnan(_slot().view(0).publish_jitter_ms_p99)  # no two chunks yet


def test_chunks_with_no_action_left_are_counted_with_their_cause_for_a_window():
    slot = _slot()
    assert slot.view(0).num_all_past_window == 0 and slot.view(0).all_past_cause == ''
    slot.count_all_past(100 * MS, 'latency 118.0 ms > horizon x dt 100 ms')
    slot.count_all_past(200 * MS, 'latency 121.0 ms > horizon x dt 100 ms')
    view = slot.view(300 * MS)
    assert view.num_chunks_all_past == 2 and view.num_all_past_window == 2
    assert view.all_past_cause == 'latency 121.0 ms > horizon x dt 100 ms'  # the last one
    later = slot.view(1200 * MS + 1)  # a window (1 s) after the last one
    assert later.num_chunks_all_past == 2 and later.num_all_past_window == 0
    assert later.all_past_cause == ''


@pytest.mark.parametrize(
    ('names', 'placeholders'),
    [(('a0', 'a1', 'a2'), ('a0', 'a1', 'a2')), (('shoulder', 'elbow', 'a2'), ())],
)
def test_a_trajectory_with_placeholder_joint_names_is_reported(names, placeholders):
    slot = _slot(
        action_space='joint_position', action_joint_names=names, publish_joint_trajectory=True
    )
    assert slot.view(0).placeholder_joint_names == placeholders
    # the same names without a trajectory go to no controller
    no_trajectory = _slot(action_space='joint_position', action_joint_names=names)
    assert no_trajectory.view(0).placeholder_joint_names == ()


def test_silence_counts_from_start_up_when_no_image_ever_came():
    view = _slot().view(4 * S)
    assert not view.seen_image and view.silent_s == pytest.approx(4.0)
    assert math.isnan(view.stamp_to_publish_ms_p99) and not view.rate_judged


def test_a_result_after_the_deadline_is_late_and_counted():
    slot = _slot(trigger='on_image')
    slot.offer_image(_obs(0))
    step = _send(slot, 0)
    assert slot.owns(step.step_seq) and not slot.owns(step.step_seq + 1)
    assert not slot.is_late(_result(step), BUDGET)
    assert slot.is_late(_result(step), BUDGET + 1)
    assert slot.is_late(_result(step, late=True), 1)  # the engine's word counts too
    assert slot.finish(_result(step), BUDGET + 1, late=True)
    assert slot.num_deadline_misses == 1 and slot.num_chunks == 1


def test_dropping_a_late_result_counts_a_deadline_miss_not_a_chunk():
    slot = _slot(trigger='on_image')
    slot.offer_image(_obs(0))
    step = _send(slot, 0)
    refusal = slot.abandon(FailureReason.DEADLINE_MISSED, 'done 3.0 ms late', BUDGET + 3 * MS)
    assert refusal is not None and refusal.step_seq == step.step_seq
    assert slot.num_deadline_misses == 1 and slot.num_chunks == 0
    assert not slot.finish(_result(step), BUDGET + 4 * MS)


def _refuse(slot: RobotSlot, reason: FailureReason, detail: str, now: int) -> Refusal:
    return slot.refuse(Refusal('r1', 0, now, reason, detail), now)


def test_the_last_error_says_when_and_clears_after_a_window_without_refusals():
    slot = _slot()  # window 1 s
    _refuse(slot, FailureReason.MALFORMED_IMAGE, "encoding '16UC1'", 2 * S)
    view = slot.view(2 * S + 250 * MS)
    assert view.last_error == "malformed_image: encoding '16UC1'"
    assert view.last_error_age_s == pytest.approx(0.25) and view.num_refused_window == 1
    view = slot.view(3 * S)
    assert view.last_error == '' and math.isnan(view.last_error_age_s)
    assert view.num_refused_window == 0
    assert view.refused_by_reason == {'malformed_image': 1}  # the total stays


def test_when_the_engine_is_back_its_refusals_and_downtime_are_forgotten():
    slot = _slot(trigger='on_image')
    for k in range(5):  # a healthy robot at 10 Hz
        slot.offer_image(_obs(k * 100 * MS))
        slot.finish(_result(_send(slot, k * 100 * MS)), k * 100 * MS + 10 * MS)
    down = 2 * S
    slot.offer_image(_obs(down))
    _refuse(slot, FailureReason.MALFORMED_IMAGE, 'bad frame', down)
    _refuse(slot, FailureReason.ENGINE_UNAVAILABLE, 'engine dead: exited', down + 1)
    assert slot.view(down + 2).num_refused_window == 2
    slot.engine_back(down + 100 * MS)
    view = slot.view(down + 100 * MS)
    assert view.num_refused_window == 1  # the bad frame still counts
    assert view.last_error == ''  # its cause has passed
    assert not view.rate_judged  # judged again a whole window after the engine came back
    assert slot.view(down + 1100 * MS).rate_judged
    slot2 = _slot()
    _refuse(slot2, FailureReason.ENGINE_UNAVAILABLE, 'engine starting', 1)
    slot2.engine_back(2)
    assert slot2.view(3).last_error == '' and slot2.view(3).num_refused_window == 0


def test_image_rate_and_time_since_the_last_chunk_tell_camera_from_node():
    slot = _slot(trigger='on_image')
    for k in range(13):  # a camera at 4 Hz for 3 s
        slot.offer_image(_obs(k * 250 * MS))
    view = slot.view(3 * S)
    assert view.image_rate_hz == pytest.approx(4.0) and math.isnan(view.since_last_chunk_s)
    slot.finish(_result(_send(slot, 3 * S)), 3 * S + 100 * MS)
    assert slot.view(4 * S).since_last_chunk_s == pytest.approx(0.9)


def test_an_over_long_detail_is_bounded_with_a_marker():
    slot = _slot()
    detail = 'joint_states lacks configured joints; it has unknown joints ' + ', '.join(
        f'joint_{i}' for i in range(10_000)
    )
    refusal = _refuse(slot, FailureReason.INVALID_STATE, detail, 1)
    assert len(refusal.detail) <= MAX_DETAIL_CHARS and f'{len(detail)} chars' in refusal.detail
    assert refusal.detail.startswith('joint_states lacks configured joints')
    assert len(slot.last_error) <= MAX_DETAIL_CHARS + len('invalid_state: ')


@pytest.mark.parametrize(
    ('stamp_ns', 'problem'),
    [(0, 'zero'), (10 * S + 1500 * MS, '1.500 s ahead'), (10 * S + 999 * MS, None), (1, None)],
)
def test_zero_and_future_stamps_are_refused(stamp_ns, problem):
    found = stamp_problem(stamp_ns, 10 * S, max_future_ns=1 * S)
    assert found is None if problem is None else problem in found


def test_only_a_changed_instruction_counts_as_a_change():
    slot = _slot()
    assert not slot.set_instruction('pick it up')
    assert slot.set_instruction('open the drawer')


def test_instruction_changes_are_reported_at_most_once_per_interval_with_their_count():
    throttle = CountingThrottle(5 * S)
    reported = [throttle.add(k * 10 * MS) for k in range(300)]  # 100 Hz for 3 s
    assert reported[0] == 1 and sum(1 for r in reported if r) == 1
    assert throttle.due(4 * S) == 0
    assert throttle.due(5 * S) == 299  # the rest, in one report
    assert throttle.due(11 * S) == 0


TWO_CAMERAS = ('camera/image_raw', 'wrist/image_raw')


def test_a_two_camera_robot_is_due_once_both_images_are_in_and_sends_both_primary_first():
    slot = _slot(
        trigger='on_image',
        camera_topics=TWO_CAMERAS,
        max_camera_skew_s=0.05,
        max_camera_wait_s=0.05,
    )
    slot.offer_image(_obs(100 * MS, value=1))
    assert not slot.is_due(101 * MS)
    assert slot.due_at_ns() == 150 * MS  # the end of the wait for the wrist camera
    slot.offer_image(_obs(110 * MS, value=2), camera=1)
    assert slot.is_due(111 * MS) and slot.due_at_ns() is None
    step = _take(slot, 111 * MS)
    assert isinstance(step, StepRequest) and step.stamp_ns == 100 * MS
    assert [int(image[0, 0, 0]) for image in step.images] == [1, 2]


def test_a_step_whose_second_camera_is_silent_is_refused_once_its_wait_is_over():
    slot = _slot(
        trigger='on_image',
        camera_topics=TWO_CAMERAS,
        max_camera_skew_s=0.05,
        max_camera_wait_s=0.05,
    )
    slot.offer_image(_obs(100 * MS))
    assert not slot.is_due(149 * MS) and slot.is_due(150 * MS)
    refusal = _take(slot, 150 * MS)
    assert isinstance(refusal, Refusal) and refusal.reason is FailureReason.CAMERAS_INCOMPLETE
    assert refusal.stamp_ns == 100 * MS
    assert refusal.detail == (
        "no image within robots.r1.max_camera_skew_s = 0.05 s of the primary camera's stamp "
        'arrived in robots.r1.max_camera_wait_s = 0.05 s from wrist/image_raw (none received '
        'yet)'
    )
    assert slot.view(150 * MS).refused_by_reason == {'cameras_incomplete': 1}


def test_a_periodic_robot_waiting_for_a_camera_is_due_at_the_later_of_period_and_wait():
    slot = _slot(
        camera_topics=TWO_CAMERAS, max_camera_skew_s=0.05, max_camera_wait_s=0.05, period_s=0.1
    )
    slot.offer_image(_obs(0))
    slot.offer_image(_obs(0), camera=1)
    slot.finish(_result(_send(slot, 0)), 1 * MS)  # the next period starts at 100 ms
    slot.offer_image(_obs(60 * MS))  # the wrist's image (at 0) is too far: wait to 110 ms
    assert slot.due_at_ns() == 110 * MS
    slot.offer_image(_obs(90 * MS))  # replaces an incomplete observation: keeps its wait
    assert slot.due_at_ns() == 110 * MS and not slot.is_due(109 * MS)
    refusal = _take(slot, 110 * MS)
    assert isinstance(refusal, Refusal) and refusal.reason is FailureReason.CAMERAS_INCOMPLETE
    assert 'wrist/image_raw (its newest is stamped 0.090 s before)' in refusal.detail


def test_a_robot_whose_camera_count_is_not_the_checkpoints_is_refused_naming_both():
    slot = _slot(trigger='on_image', camera_topics=TWO_CAMERAS)
    slot.offer_image(_obs(0))
    slot.offer_image(_obs(0), camera=1)
    refusal = _take(slot, 1 * MS, num_images=1)
    assert isinstance(refusal, Refusal) and refusal.reason is FailureReason.MALFORMED_IMAGE
    assert refusal.detail == (
        'the checkpoint takes 1 image per step but robots.r1.camera_topics lists 2 cameras'
    )


def test_only_the_primary_camera_supersedes_observations_and_counts_as_input():
    slot = _slot(trigger='on_image', camera_topics=TWO_CAMERAS)
    slot.offer_image(_obs(0), camera=1)
    slot.offer_image(_obs(1 * MS), camera=1)
    assert slot.pending is None and slot.num_superseded == 0
    assert not slot.view(2 * MS).seen_image
