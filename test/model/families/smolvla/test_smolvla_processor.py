"""SmolVLA's processing as LeRobot does it: images padded on the left and the top to the
tower's size, the task with a newline tokenized by the VLM's tokenizer without special tokens,
the state normalized, the VLM files found or refused with the download command; and
LeRobot's RoPE as our tables build it."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from vla_sched.model.config.architecture import RopeSpec
from vla_sched.model.families.smolvla.checkpoint import read_smolvla_spec
from vla_sched.model.families.smolvla.model import pixel_shuffle, smolvla_rope_tables
from vla_sched.model.families.smolvla.processor import (
    SmolVLAProcessor,
    VLMFilesMissingError,
    load_vlm_tokenizer,
    vlm_folder,
)
from vla_sched.model.layers.rope import rope_inv_freq, rope_tables
from vla_sched.testing.smolvla_writer import write_smolvla_checkpoint


@pytest.fixture(scope='module')
def processor(tmp_path_factory):
    folder = write_smolvla_checkpoint(tmp_path_factory.mktemp('smolvla') / 'tiny', seed=5)
    spec = read_smolvla_spec(folder, vlm_folder=folder / 'vlm')
    return SmolVLAProcessor(spec, load_vlm_tokenizer(folder / 'vlm'))


def test_a_wide_frame_is_padded_on_the_top_and_keeps_its_aspect(processor):
    frame = np.full((16, 32, 3), 255, dtype=np.uint8)  # half as tall as wide
    pixels = processor.pixels([frame])
    assert pixels.shape == (1, 3, 32, 32)
    assert torch.all(pixels[0, :, :16] == -1.0)  # the padding (0) after x * 2 - 1
    assert torch.allclose(pixels[0, :, 16:], torch.ones(1))


def test_a_tall_frame_is_padded_on_the_left(processor):
    pixels = processor.pixels([np.full((32, 16, 3), 255, dtype=np.uint8)])
    assert torch.all(pixels[0, :, :, :16] == -1.0)
    assert torch.allclose(pixels[0, :, :, 16:], torch.ones(1))


def test_the_prompt_is_the_task_and_a_newline_without_special_tokens(processor):
    ids = processor.prompt_ids('pick up the red block', np.zeros(6, np.float32))
    again = processor.prompt_ids('pick up the red block\n', np.zeros(6, np.float32))
    assert ids == again
    assert processor.tokenizer.decode(list(ids)) == 'pick up the red block\n'
    assert processor.instruction_tokens('pick up the red block') == len(ids) - 1


def test_the_state_is_normalized_with_mean_and_std_and_padded(processor):
    spec = processor.spec
    state = spec.state_statistics['mean'] + spec.state_statistics['std']
    normalized = processor.normalize_state(state).numpy()
    assert normalized.shape == (spec.max_state_dim,)
    np.testing.assert_allclose(normalized[:6], 1.0, atol=1e-6)
    assert not normalized[6:].any()


def test_missing_vlm_files_are_refused_with_the_download_command(tmp_path):
    with pytest.raises(VLMFilesMissingError, match=r'hf download org/vlm config\.json'):
        vlm_folder(tmp_path, repo='org/vlm')
    with pytest.raises(VLMFilesMissingError, match=r'not in the Hugging Face cache'):
        vlm_folder(None, repo='org/vlm', cache_dir=tmp_path)


def test_the_vlm_files_are_found_in_the_hub_cache_layout(tmp_path):
    snapshot = tmp_path / 'models--org--vlm' / 'snapshots' / 'abc'
    write_smolvla_checkpoint(tmp_path / 'policy')
    snapshot.mkdir(parents=True)
    for name in ('config.json', 'tokenizer.json'):
        (snapshot / name).write_bytes((tmp_path / 'policy' / 'vlm' / name).read_bytes())
    (tmp_path / 'models--org--vlm' / 'refs').mkdir()
    (tmp_path / 'models--org--vlm' / 'refs' / 'main').write_text('abc')
    assert vlm_folder(None, repo='org/vlm', cache_dir=tmp_path) == snapshot


def test_the_pixel_shuffle_groups_blocks_as_smolvlms_connector_does():
    from transformers import SmolVLMConfig
    from transformers.models.smolvlm.modeling_smolvlm import SmolVLMConnector

    hidden = torch.randn(2, 64, 5)
    config = SmolVLMConfig(scale_factor=2)
    want = SmolVLMConnector(config).pixel_shuffle(hidden, 2)
    torch.testing.assert_close(pixel_shuffle(hidden, 2), want, rtol=0, atol=0)


def test_lerobots_rope_and_the_shared_rope_of_theta_10000_agree_to_float32_rounding():
    positions = torch.arange(600)
    ours = smolvla_rope_tables(positions, 64, torch.float32)
    shared = rope_tables(positions, rope_inv_freq(RopeSpec(theta=10000.0), 64), torch.float32)
    difference = (ours.cos - shared.cos).abs().max().item()
    assert 0 < difference < 1e-4  # the same angles, rounded differently: we build LeRobot's
