"""The generated messages cross a process boundary over DDS with every field intact."""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from vla_sched.ros.roundtrip import chunk_to_dict, example_chunk

pytestmark = pytest.mark.ros

ROUNDTRIP = [sys.executable, '-m', 'vla_sched.ros.roundtrip']


@pytest.mark.slow
def test_action_chunk_published_in_one_process_arrives_intact_in_another():
    count = 3
    args = ['--count', str(count), '--timeout', '60']
    sub = subprocess.Popen([*ROUNDTRIP, 'sub', *args], stdout=subprocess.PIPE, text=True)
    try:
        assert sub.stdout.readline().strip() == 'ready'
        pub = subprocess.Popen([*ROUNDTRIP, 'pub', *args])
        out, _ = sub.communicate(timeout=90)
        assert pub.wait(timeout=90) == 0
    finally:
        sub.kill()
    assert sub.returncode == 0
    got = [json.loads(line) for line in out.splitlines()]
    assert len(got) == count
    for index, item in enumerate(got):
        sent = example_chunk(index)
        assert item == chunk_to_dict(sent)
        actions = np.asarray(item['actions'], dtype=np.float32).reshape(item['horizon'], -1)
        expected = np.frombuffer(sent.actions, dtype=np.float32).reshape(sent.horizon, sent.dof)
        assert actions.shape == (8, 7)
        np.testing.assert_array_equal(actions, expected)


def test_action_chunk_actions_round_trip_as_float32_rows():
    msg = example_chunk(5, horizon=4, dof=3)
    rows = np.frombuffer(msg.actions, dtype=np.float32).reshape(msg.horizon, msg.dof)
    assert rows.shape == (4, 3)
    assert len(msg.joint_names) == msg.dof
    assert chunk_to_dict(msg)['actions'] == [float(v) for v in rows.ravel()]


def test_step_rejected_names_every_reason_once():
    from vla_sched.msg import StepRejected

    reasons = {
        name: getattr(StepRejected, name)
        for name in dir(StepRejected)
        if name.startswith('REASON_')
    }
    assert len(reasons) == 14
    assert sorted(reasons.values()) == list(range(1, 15))
    msg = StepRejected(
        robot_id='arm',
        reason=StepRejected.REASON_INVALID_STATE,
        detail='joint_states.position[2] is NaN',
    )
    assert msg.reason == 2
