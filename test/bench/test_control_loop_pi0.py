"""``python -m bench.control_loop --pi0``: the plan serves a tiny pi0 folder batched and one
step at a time, both with its tokenizer and robots that publish two cameras and eight joint
states."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import control_loop as loop
from bench.control_loop_report import PI0_ONE_AT_A_TIME, PI0_SYSTEM, LoopPlan
from vla_sched.engine.checkpoints import check_model_path
from vla_sched.engine.config import EngineConfig


def test_the_pi0_option_writes_a_folder_the_engine_accepts_and_serves_it_both_ways(
    tmp_path, monkeypatch
):
    monkeypatch.setattr(loop.tempfile, 'tempdir', str(tmp_path))  # where mkdtemp writes
    plan = loop.plan_from_args(loop.parse_args(['--pi0', '--robots', '2']))
    assert plan.systems == (PI0_SYSTEM, PI0_ONE_AT_A_TIME)
    folder = Path(plan.pi0_model_path)
    assert folder.parent.parent == tmp_path
    batched = loop.node_params(plan, 2, PI0_SYSTEM)['vla_sched']['ros__parameters']
    engine = batched['engine']
    check_model_path(
        EngineConfig(
            model_path=engine['model_path'], pi0_tokenizer_path=engine['pi0_tokenizer_path']
        )
    )
    assert engine['core'] == 'scheduled' and engine['model_path'] == str(folder)
    assert batched['robot_defaults']['camera_topics'] == list(loop.OFT_CAMERAS)
    assert len(batched['robot_defaults']['state_joint_names']) == 8
    assert 'scheduler' not in batched
    one = loop.node_params(plan, 2, PI0_ONE_AT_A_TIME)['vla_sched']['ros__parameters']
    assert one['scheduler'] == {'max_running_requests': 1}
    assert one['engine'] == engine


def test_the_pi0_systems_need_a_pi0_folder():
    with pytest.raises(ValueError, match='pi0_model_path go together'):
        LoopPlan(systems=(PI0_SYSTEM,))
    with pytest.raises(ValueError, match='go together'):
        LoopPlan(pi0_model_path='/somewhere')
