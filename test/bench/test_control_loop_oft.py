"""``python -m bench.control_loop --oft``: the plan serves a tiny OpenVLA folder and a tiny
OpenVLA-OFT folder on the same base weights, the OFT server with its preset and robots that
publish two cameras and eight joint states."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import control_loop as loop
from bench.control_loop_report import OFT_SYSTEM, LoopPlan
from vla_sched.engine.checkpoints import check_model_path
from vla_sched.engine.config import EngineConfig


def test_the_oft_option_writes_two_folders_the_engine_accepts_and_serves_both(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(loop.tempfile, 'tempdir', str(tmp_path))  # where mkdtemp writes
    plan = loop.plan_from_args(loop.parse_args(['--oft', '--robots', '2']))
    assert plan.systems == ('scheduled', OFT_SYSTEM)
    plain, oft = Path(plan.model_path), Path(plan.oft_model_path)
    assert plain.parent == oft.parent and plain.parent.parent == tmp_path
    check_model_path(EngineConfig(model_path=str(plain)))
    check_model_path(EngineConfig(model_path=str(oft), oft_preset=loop.OFT_PRESET))
    params = loop.node_params(plan, 2, OFT_SYSTEM)['vla_sched']['ros__parameters']
    assert params['engine']['core'] == 'scheduled'
    assert params['engine']['model_path'] == str(oft)
    assert params['engine']['oft_preset'] == 'libero'
    assert params['robot_defaults']['camera_topics'] == list(loop.OFT_CAMERAS)
    assert len(params['robot_defaults']['state_joint_names']) == 8
    plain_params = loop.node_params(plan, 2, 'scheduled')['vla_sched']['ros__parameters']
    assert plain_params['engine']['model_path'] == str(plain)
    assert 'oft_preset' not in plain_params['engine']
    assert 'camera_topics' not in plain_params['robot_defaults']


def test_the_oft_system_needs_an_oft_folder():
    with pytest.raises(ValueError, match='scheduled_oft and oft_model_path go together'):
        LoopPlan(systems=('scheduled', OFT_SYSTEM))
    with pytest.raises(ValueError, match='go together'):
        LoopPlan(oft_model_path='/somewhere')
