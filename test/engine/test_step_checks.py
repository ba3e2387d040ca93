"""Every malformed step is refused with the reason and the offending field named."""

from __future__ import annotations

import numpy as np
import pytest

from vla_sched.engine.config import EngineConfig, EngineConfigError
from vla_sched.engine.core_stats import new_metrics
from vla_sched.engine.step_checks import check_step_request, refuse_malformed
from vla_sched.ipc.messages import EngineInfo, FailureReason, StepRequest


def _request(**overrides) -> StepRequest:
    fields = dict(
        robot_id='arm', step_seq=3, stamp_ns=100, deadline_ns=200, received_ns=110,
        image=np.zeros((8, 6, 3), np.uint8), state=np.zeros(7, np.float32),
        instruction='stack the cups', instruction_version=1,
    )  # fmt: skip
    fields.update(overrides)
    return StepRequest(**fields)


def _check(request):
    return check_step_request(request, num_state=7, max_instruction_bytes=64)


def test_a_well_formed_step_passes():
    assert _check(_request()) is None


@pytest.mark.parametrize(
    ('overrides', 'reason', 'detail'),
    [
        ({'image': np.zeros((8, 6), np.uint8)}, FailureReason.MALFORMED_IMAGE, '[8, 6]'),
        ({'image': np.zeros((8, 6, 3), np.float32)}, FailureReason.MALFORMED_IMAGE, 'float32'),
        ({'image': np.zeros((0, 6, 3), np.uint8)}, FailureReason.MALFORMED_IMAGE, 'range'),
        ({'state': np.zeros(6, np.float32)}, FailureReason.INVALID_STATE, 'must have 7'),
        (
            {'state': np.array([0, np.nan, 0, 0, np.inf, 0, 0], np.float32)},
            FailureReason.INVALID_STATE,
            'NaN or inf at [1, 4]',
        ),
        ({'instruction': '   '}, FailureReason.INVALID_INSTRUCTION, 'empty'),
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
