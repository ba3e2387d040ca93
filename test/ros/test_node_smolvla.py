"""The node in a process of its own serves a tiny SmolVLA folder (LeRobot format, two cameras,
a six-joint state, the VLM's config and tokenizer in a folder of their own): a simulated robot
with two camera topics and joint_states gets ActionChunks of the folder's n_action_steps from
real DDS."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from ros_harness import NodeProcess

from vla_sched.msg import StepRejected
from vla_sched.testing.smolvla_writer import VLM_SUBFOLDER, write_smolvla_checkpoint

pytestmark = [pytest.mark.ros, pytest.mark.slow]

ROBOT = 'so100_robot'
CAMERAS = ['front/image_raw', 'wrist/image_raw']
JOINTS = ['shoulder_pan', 'shoulder_lift', 'elbow_flex', 'wrist_flex', 'wrist_roll', 'gripper']
WAIT_S = 90.0  # the engine loads the model first; only a hang reaches this


def test_a_two_camera_robot_gets_chunks_of_the_folders_length(tmp_path):
    folder = write_smolvla_checkpoint(
        tmp_path / 'tiny-smolvla', action_dim=5, chunk_size=4, n_action_steps=3
    )
    params = {
        'robot_ids': [ROBOT],
        'robots': {
            ROBOT: {
                'trigger': 'on_image',
                'instruction': 'pick up the red block',
                'camera_topics': CAMERAS,
                'max_camera_skew_s': 5.0,
                'state_joint_names': JOINTS,
            }
        },
        'engine': {
            'model_path': str(folder),
            'smolvla_vlm_path': str(folder / VLM_SUBFOLDER),
        },
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
        assert (first['horizon'], first['dof'], first['num_actions']) == (3, 5, 15)
        starting = {str(StepRejected.REASON_ENGINE_UNAVAILABLE)}
        assert set(summary['rejected']) <= starting, node.log()[-3000:]
    finally:
        assert node.stop() == 0, node.log()[-3000:]
    assert 'actions 3x5, 2 image(s)' in node.log()
