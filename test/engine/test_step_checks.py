"""Every malformed step is refused with the reason and the offending field named."""

from __future__ import annotations

import numpy as np
import pytest

from vla_sched.engine.config import EngineConfig, EngineConfigError
from vla_sched.engine.core_stats import new_metrics
from vla_sched.engine.step_checks import (
    InstructionTokenLimit,
    check_step_request,
    refuse_malformed,
)
from vla_sched.ipc.messages import EngineInfo, FailureReason, StepRequest


def _request(**overrides) -> StepRequest:
    fields = dict(
        robot_id='arm', step_seq=3, stamp_ns=100, deadline_ns=200, received_ns=110,
        images=(np.zeros((8, 6, 3), np.uint8),), state=np.zeros(7, np.float32),
        instruction='stack the cups', instruction_version=1,
    )  # fmt: skip
    fields.update(overrides)
    return StepRequest(**fields)


def _check(request, *, num_images: int = 1):
    return check_step_request(
        request, num_state=7, max_instruction_bytes=64, num_images=num_images
    )


def test_a_well_formed_step_passes():
    assert _check(_request()) is None


@pytest.mark.parametrize(
    ('overrides', 'reason', 'detail'),
    [
        ({'images': (np.zeros((8, 6), np.uint8),)}, FailureReason.MALFORMED_IMAGE, '[8, 6]'),
        (
            {'images': (np.zeros((8, 6, 3), np.float32),)},
            FailureReason.MALFORMED_IMAGE,
            'float32',
        ),
        ({'images': (np.zeros((0, 6, 3), np.uint8),)}, FailureReason.MALFORMED_IMAGE, 'range'),
        ({'state': np.zeros(6, np.float32)}, FailureReason.INVALID_STATE, 'must have 7'),
        (
            {'state': np.array([0, np.nan, 0, 0, np.inf, 0, 0], np.float32)},
            FailureReason.INVALID_STATE,
            'NaN or inf at [1, 4]',
        ),
        ({'instruction': '   '}, FailureReason.INVALID_INSTRUCTION, 'empty'),
        ({'instruction': '\x01\x02\u200b'}, FailureReason.INVALID_INSTRUCTION, 'no printable'),
        ({'instruction': 'x' * 65}, FailureReason.INVALID_INSTRUCTION, '65 bytes, limit 64'),
        ({'deadline_ns': 50}, FailureReason.DEADLINE_MISSED, 'before the observation'),
    ],
)
def test_malformed_steps_are_refused_with_reason_and_detail(overrides, reason, detail):
    failure = _check(_request(**overrides))
    assert failure is not None
    assert (failure.robot_id, failure.step_seq, failure.stamp_ns) == ('arm', 3, 100)
    assert failure.reason is reason
    assert detail in failure.detail


def _cameras(*shapes, dtype=np.uint8) -> tuple[np.ndarray, ...]:
    return tuple(np.zeros(shape, dtype) for shape in shapes)


def test_a_step_with_one_image_per_camera_passes():
    assert _check(_request(images=_cameras((8, 6, 3), (4, 4, 3))), num_images=2) is None


@pytest.mark.parametrize(
    ('images', 'num_images', 'detail'),
    [
        (_cameras((8, 6, 3)), 2, 'step has 1 image; the checkpoint takes 2 per step'),
        (_cameras((8, 6, 3), (8, 6, 3)), 1, 'step has 2 images; the checkpoint takes 1'),
        (
            _cameras((8, 6, 3), (8, 6, 3), (8, 6, 3)),
            2,
            'step has 3 images; the checkpoint takes 2',
        ),
        (_cameras((8, 6, 3), (8, 6)), 2, 'image 1 must be uint8 [H, W, 3], got uint8 [8, 6]'),
        (
            (np.zeros((8, 6, 3), np.uint8), np.zeros((8, 6, 3), np.float32)),
            2,
            'image 1 must be uint8 [H, W, 3], got float32 [8, 6, 3]',
        ),
        (_cameras((8, 6, 3), (8, 0, 3)), 2, 'image 1 side out of range 1..4096: [8, 0]'),
    ],
)
def test_a_step_whose_images_do_not_fit_the_checkpoint_is_refused_naming_both(
    images, num_images, detail
):
    failure = _check(_request(images=images), num_images=num_images)
    assert failure is not None and failure.reason is FailureReason.MALFORMED_IMAGE
    assert detail in failure.detail


def test_refuse_malformed_checks_the_image_count_the_engine_announced():
    info = EngineInfo(
        model_name='m', num_state=7, action_horizon=8, action_dim=7, image_size=224,
        max_instruction_bytes=64, random_weights=True, num_images=2,
    )  # fmt: skip
    metrics = new_metrics()
    assert refuse_malformed(_request(images=_cameras((8, 6, 3), (8, 6, 3))), info, metrics) == []
    (failure,) = refuse_malformed(_request(), info, metrics)
    assert 'step has 1 image; the checkpoint takes 2 per step' in failure.detail
    assert metrics.aborts_by_reason == {'malformed_image': 1}


def test_a_refused_step_is_counted_as_an_abort_and_a_served_one_is_not():
    info = EngineInfo(
        model_name='m', num_state=7, action_horizon=1, action_dim=7, image_size=0,
        max_instruction_bytes=64, random_weights=True, prompt_layout='',
    )  # fmt: skip
    metrics = new_metrics()
    assert refuse_malformed(_request(), info, metrics) == []
    late = _request(deadline_ns=50)
    (failure,) = refuse_malformed(late, info, metrics)
    assert failure.reason is FailureReason.DEADLINE_MISSED
    assert metrics.aborts_by_reason == {'deadline_missed': 1}
    assert metrics.robot('arm').num_deadline_misses == 1


def test_engine_config_names_the_bad_setting():
    with pytest.raises(EngineConfigError, match='policy must be one of'):
        EngineConfig(policy='random')
    with pytest.raises(EngineConfigError, match='page_size must be a positive integer'):
        EngineConfig(page_size=0)
    with pytest.raises(EngineConfigError, match=r"unknown engine settings \['pagesize'\]"):
        EngineConfig.from_mapping({'pagesize': 16})
    with pytest.raises(EngineConfigError, match='smaller than one page'):
        EngineConfig(kv_pool_tokens=8, page_size=16)
    with pytest.raises(EngineConfigError, match=r"robots\.arm: unknown keys \['prio'\]"):
        EngineConfig(robots={'arm': {'prio': 1}})
    with pytest.raises(EngineConfigError, match=r'robots\.arm\.center_crop must be a boolean'):
        EngineConfig(robots={'arm': {'center_crop': 1}})
    config = EngineConfig.from_mapping(
        {'robots': {'arm': {'priority': 2}, 'cam': {'center_crop': True}}}
    )
    assert config.robot_priority('arm') == 2 and config.robot_priority('other') == 0
    assert config.robot_center_crop('cam') and not config.robot_center_crop('arm')
    assert not config.robot_center_crop('other')
    assert EngineConfig.from_mapping(config.to_mapping()) == config


def _words(text: str) -> int:
    return len(text.split())


def test_an_instruction_beyond_the_token_limit_is_refused_naming_the_count_and_the_limit():
    limit = InstructionTokenLimit(3, _words)
    assert check_step_request(
        _request(instruction='stack the cups'), num_state=7, max_instruction_bytes=64,
        num_images=1, token_limit=limit,
    ) is None  # fmt: skip
    failure = check_step_request(
        _request(instruction='stack all the cups'), num_state=7, max_instruction_bytes=64,
        num_images=1, token_limit=limit,
    )  # fmt: skip
    assert failure is not None and failure.reason is FailureReason.INVALID_INSTRUCTION
    assert failure.detail == 'instruction is 4 tokens, limit 3'


def test_the_byte_bound_is_checked_before_any_token_is_counted():
    counted: list[str] = []
    limit = InstructionTokenLimit(1000, lambda text: counted.append(text) or 1)
    failure = check_step_request(
        _request(instruction='x' * 65), num_state=7, max_instruction_bytes=64, num_images=1,
        token_limit=limit,
    )  # fmt: skip
    assert failure is not None and 'bytes' in failure.detail
    assert counted == []


def test_a_repeated_instruction_is_counted_once():
    counted: list[str] = []
    limit = InstructionTokenLimit(10, lambda text: counted.append(text) or _words(text))
    for _ in range(5):
        assert limit.problem('stack the cups') is None
    assert counted == ['stack the cups']
