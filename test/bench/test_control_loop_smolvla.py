"""``python -m bench.control_loop --smolvla``: the plan serves a tiny SmolVLA folder batched and
one step at a time, both with its VLM folder and robots that publish two cameras and an
SO-100 arm's six joint states."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import control_loop as loop
from bench.control_loop_report import SMOLVLA_ONE_AT_A_TIME, SMOLVLA_SYSTEM, LoopPlan
from vla_sched.engine.checkpoints import check_model_path
from vla_sched.engine.config import EngineConfig
from vla_sched.testing.smolvla_writer import VLM_SUBFOLDER


def test_the_smolvla_option_writes_a_folder_the_engine_accepts_and_serves_it_both_ways(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(loop.tempfile, 'tempdir', str(tmp_path))  # where mkdtemp writes
    plan = loop.plan_from_args(loop.parse_args(['--smolvla', '--robots', '2']))
    assert plan.systems == (SMOLVLA_SYSTEM, SMOLVLA_ONE_AT_A_TIME)
    folder = Path(plan.smolvla_model_path)
    assert folder.parent.parent == tmp_path
    assert loop.SMOLVLA_VLM_FOLDER == VLM_SUBFOLDER
    batched = loop.node_params(plan, 2, SMOLVLA_SYSTEM)['vla_sched']['ros__parameters']
    engine = batched['engine']
    check_model_path(
        EngineConfig(model_path=engine['model_path'], smolvla_vlm_path=engine['smolvla_vlm_path'])
    )
    assert engine['core'] == 'scheduled' and engine['model_path'] == str(folder)
    assert engine['smolvla_vlm_path'] == str(folder / VLM_SUBFOLDER)
    assert batched['robot_defaults']['camera_topics'] == list(loop.SMOLVLA_CAMERAS)
    assert len(batched['robot_defaults']['state_joint_names']) == 6
    assert 'scheduler' not in batched
    one = loop.node_params(plan, 2, SMOLVLA_ONE_AT_A_TIME)['vla_sched']['ros__parameters']
    assert one['scheduler'] == {'max_running_requests': 1}
    assert one['engine'] == engine
    for system in (SMOLVLA_SYSTEM, SMOLVLA_ONE_AT_A_TIME):  # the robots publish what it reads
        fleet = loop.fleet_config(system, plan)
        assert list(fleet.camera_topics) == batched['robot_defaults']['camera_topics']
        assert list(fleet.joint_names) == batched['robot_defaults']['state_joint_names']


def test_the_smolvla_systems_need_a_smolvla_folder():
    with pytest.raises(ValueError, match='smolvla_model_path go together'):
        LoopPlan(systems=(SMOLVLA_SYSTEM,))
    with pytest.raises(ValueError, match='go together'):
        LoopPlan(smolvla_model_path='/somewhere')
