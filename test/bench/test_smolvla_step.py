"""``python -m bench.smolvla_step --tiny``: the dry run of the real-size SmolVLA step serves
one robot and a batch of four through the scheduled core and records the times; the real
sizes are SmolVLM2-500M's and read back as the spec LeRobot derives."""

from __future__ import annotations

import json

import pytest

from bench import smolvla_step
from vla_sched.model.families.smolvla.checkpoint import read_vlm_sizes
from vla_sched.testing.smolvlm_files import smolvlm_config

pytestmark = pytest.mark.slow


def test_the_tiny_dry_run_times_one_robot_and_four(tmp_path):
    out = tmp_path / 'step.json'
    assert smolvla_step.main(['--tiny', '--repeats', '1', '--json', str(out)]) == 0
    record = json.loads(out.read_text())
    assert record['tiny'] and set(record['median_ms']) == {'1', '4'}
    assert all(t > 0 for t in record['median_ms'].values())


def test_the_real_sizes_are_smolvlm2_500ms(tmp_path):
    (tmp_path / 'config.json').write_text(json.dumps(smolvlm_config(smolvla_step.SMOLVLM2_500M)))
    sizes = read_vlm_sizes(
        tmp_path, num_vlm_layers=smolvla_step.REAL_NUM_VLM_LAYERS, expert_width_multiplier=0.75,
        attention_mode='cross_attn', self_attn_every_n_layers=2, image_size=512,
    )  # fmt: skip
    text, expert = sizes.text, sizes.expert
    assert (text.width, text.depth, text.num_heads, text.num_kv_heads) == (960, 16, 15, 5)
    assert (expert.width, expert.mlp_dim, expert.head_dim) == (720, 2048, 64)
    assert sizes.vision.hidden_size == 768 and sizes.vision.image_size == 512
    assert (sizes.vision.image_size // sizes.vision.patch_size // sizes.scale_factor) ** 2 == 64
    assert sizes.cross_layers == tuple(range(1, 16, 2))
