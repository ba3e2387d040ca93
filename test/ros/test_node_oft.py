"""The node in a process of its own serves a tiny OpenVLA-OFT folder (engine.oft_preset
libero): a simulated robot with two camera topics and joint_states gets ActionChunks of the
preset's chunk length from real DDS."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from ros_harness import NodeProcess

from vla_sched.msg import StepRejected
from vla_sched.testing.openvla_oft_writer import write_openvla_oft_checkpoint

pytestmark = [pytest.mark.ros, pytest.mark.slow]

ROBOT = 'oft_robot'
CAMERAS = ['camera/image_raw', 'wrist/image_raw']
# LIBERO's state: end-effector position (3), axis-angle (3), gripper fingers (2).
JOINTS = ['eef_x', 'eef_y', 'eef_z', 'eef_ax', 'eef_ay', 'eef_az', 'finger_l', 'finger_r']
WAIT_S = 90.0  # the engine loads the model first; only a hang reaches this


def test_a_robot_with_two_cameras_and_joint_states_gets_chunks_of_the_presets_length(tmp_path):
    folder = write_openvla_oft_checkpoint(tmp_path / 'tiny-oft')
    params = {
        'robot_ids': [ROBOT],
        'robots': {
            ROBOT: {
                'trigger': 'on_image',
                'instruction': 'put the bowl on the plate',
                'camera_topics': CAMERAS,
                'max_camera_skew_s': 5.0,
                'state_joint_names': JOINTS,
            }
        },
        'engine': {'model_path': str(folder), 'oft_preset': 'libero'},
        'deadlines': {'step_budget_s': 30.0},
    }
    node = NodeProcess(tmp_path, params)
    try:
        cmd = [sys.executable, '-m', 'vla_sched.ros.sim_robot', '--robot-id', ROBOT]
        cmd += ['--rate', '5', '--duration', str(WAIT_S), '--stop-after-chunks', '2']
        cmd += ['--camera-topics', *CAMERAS, '--joint-names', *JOINTS]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=WAIT_S + 30)
        summary = json.loads(done.stdout.splitlines()[-1])
        assert done.returncode == 0 and summary['num_chunks'] >= 2, (summary, node.log()[-3000:])
        first = summary['first_chunk']
        assert (first['horizon'], first['dof'], first['num_actions']) == (8, 7, 56)
        # steps sent while the engine loads are refused as such, and only those
        starting = {str(StepRejected.REASON_ENGINE_UNAVAILABLE)}
        assert set(summary['rejected']) <= starting, node.log()[-3000:]
    finally:
        assert node.stop() == 0, node.log()[-3000:]
    assert 'actions 8x7, 2 image(s)' in node.log()
