"""The scheduled core serves pi0 and pi0.5 folders: several robots, each with two cameras,
its state and its own instruction, denoise batched; the chunks are un-normalized, repeat
for the same engine.seed and differ for another; the start-up check names what is missing
or refused."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest

from vla_sched.engine.checkpoints import ModelPathError, check_model_path
from vla_sched.engine.config import EngineConfig
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.ipc.messages import FailureReason, StepFailure, StepRequest, StepResult
from vla_sched.testing.pi0_writer import TOKENIZER_SUBFOLDER, write_pi0_checkpoint

INSTRUCTIONS = ('pick up the red block', 'open the drawer', 'stack the cups on the plate')


@pytest.fixture(scope='module', params=['pi0', 'pi05'])
def folder(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return write_pi0_checkpoint(
        root / f'tiny-{request.param}', policy_type=request.param, tokenizer=True, seed=2
    )


def _config(folder, **fields) -> EngineConfig:
    fields.setdefault('pi0_tokenizer_path', str(folder / TOKENIZER_SUBFOLDER))
    return EngineConfig(model_path=str(folder), kv_pool_tokens=2048, page_size=16, **fields)


def _request(robot_id: str, step_seq: int, seed: int, *, instruction: str, num_images: int = 2):
    rng = np.random.default_rng(seed)
    images = tuple(rng.integers(0, 256, (48, 64, 3), dtype=np.uint8) for _ in range(num_images))
    now = time.time_ns()
    return StepRequest(
        robot_id=robot_id, step_seq=step_seq, stamp_ns=now, deadline_ns=now + 120 * 10**9,
        received_ns=now, images=images, state=rng.standard_normal(8).astype(np.float32),
        instruction=instruction, instruction_version=1,
    )  # fmt: skip


def _serve(core: ScheduledCore, requests) -> dict[str, StepResult | StepFailure]:
    out: dict[str, StepResult | StepFailure] = {}
    for request in requests:
        out.update((f.robot_id, f) for f in core.submit(request, time.time_ns()))
    for _ in range(100):
        if not core.has_work():
            return out
        out.update((m.robot_id, m) for m in core.step(time.time_ns()))
        core.check_integrity()
    raise AssertionError('the scheduler did not go idle')


def _robots():
    return [_request(f'arm{i}', 1, seed=i, instruction=INSTRUCTIONS[i]) for i in range(3)]


def test_robots_with_their_own_instructions_get_chunks_that_repeat_for_the_same_seed(folder):
    core = ScheduledCore.from_config(_config(folder))
    again = ScheduledCore.from_config(_config(folder))
    other_seed = ScheduledCore.from_config(_config(folder, seed=7))
    try:
        info = core.info
        assert (info.num_images, info.num_state) == (2, 8)
        assert (info.action_horizon, info.action_dim) == (4, 7)
        first = _serve(core, _robots())
        assert sorted(first) == ['arm0', 'arm1', 'arm2']
        for result in first.values():
            assert isinstance(result, StepResult), result
            assert result.actions.shape == (4, 7) and np.isfinite(result.actions).all()
            assert result.num_cached_prefix_tokens == 0
        assert not np.allclose(first['arm0'].actions, first['arm1'].actions)
        second = _serve(again, _robots())
        for robot, result in first.items():
            np.testing.assert_array_equal(second[robot].actions, result.actions)
        moved = _serve(other_seed, _robots())
        assert not np.allclose(moved['arm0'].actions, first['arm0'].actions)
        assert core.memory.num_free_tokens() + core.memory.evictable_size() > 0
        assert core.memory.evictable_size() == 0  # nothing of a step is cached
    finally:
        for c in (core, again, other_seed):
            c.close()


def test_a_robot_with_the_wrong_camera_count_is_refused_while_the_others_are_served(folder):
    core = ScheduledCore.from_config(_config(folder))
    try:
        bad = _request('one_camera', 1, seed=9, instruction='wave', num_images=1)
        out = _serve(core, [bad, *_robots()[:2]])
        assert isinstance(out['one_camera'], StepFailure)
        assert out['one_camera'].reason is FailureReason.MALFORMED_IMAGE
        assert isinstance(out['arm0'], StepResult) and isinstance(out['arm1'], StepResult)
    finally:
        core.close()


def test_start_up_refuses_a_missing_tokenizer_other_families_settings_and_the_sequential_core(
    folder, tmp_path
):
    check_model_path(_config(folder))
    with pytest.raises(ModelPathError, match=r'hf download google/paligemma-3b-pt-224'):
        check_model_path(_config(folder, pi0_tokenizer_path=str(tmp_path)))
    with pytest.raises(ModelPathError, match=r'engine\.oft_preset set but .* pi0 checkpoint'):
        check_model_path(_config(folder, oft_preset='libero'))
    with pytest.raises(ModelPathError, match=r'engine\.core sequential does not serve pi0'):
        check_model_path(_config(folder, core='sequential'))


def test_a_step_with_its_previous_chunk_is_guided_towards_it_on_the_frozen_actions(folder):
    core = ScheduledCore.from_config(_config(folder, rtc_execution_horizon=3))
    try:
        plain = _serve(core, [_request('arm0', 1, seed=0, instruction=INSTRUCTIONS[0])])
        previous = np.linspace(-0.5, 0.5, 4 * 7, dtype=np.float32).reshape(4, 7)
        request = dataclasses.replace(
            _request('arm0', 2, seed=0, instruction=INSTRUCTIONS[0]),
            previous_actions=previous[:3],
            inference_delay=2,
        )
        guided = _serve(core, [request])['arm0']
        unguided = _serve(core, [_request('arm0', 2, seed=0, instruction=INSTRUCTIONS[0])])
        assert isinstance(guided, StepResult) and isinstance(plain['arm0'], StepResult)
        frozen = slice(0, 2)
        guided_error = np.abs(guided.actions[frozen] - previous[frozen]).mean()
        plain_error = np.abs(unguided['arm0'].actions[frozen] - previous[frozen]).mean()
        assert guided_error < 0.5 * plain_error, (guided_error, plain_error)
    finally:
        core.close()


def test_malformed_previous_actions_are_refused_while_others_are_served(folder):
    core = ScheduledCore.from_config(_config(folder))
    try:
        bad = dataclasses.replace(
            _request('bad', 1, seed=3, instruction='wave'),
            previous_actions=np.full((2, 7), np.nan, np.float32),
        )
        out = _serve(core, [bad, _robots()[0]])
        assert isinstance(out['bad'], StepFailure)
        assert out['bad'].reason is FailureReason.INVALID_STATE
        assert 'previous actions' in out['bad'].detail
        assert isinstance(out['arm0'], StepResult)
    finally:
        core.close()
