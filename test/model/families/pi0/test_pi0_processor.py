"""pi0 / pi0.5 step inputs and outputs as LeRobot's processors make them."""

from __future__ import annotations

import math
import shutil

import numpy as np
import pytest
import torch

from vla_sched.model.families.pi0.checkpoint import read_pi0_spec
from vla_sched.model.families.pi0.processor import (
    Pi0Processor,
    TokenizerMissingError,
    discretize_state,
    hub_cache_dir,
    load_paligemma_tokenizer,
    resize_with_pad,
)
from vla_sched.testing.pi0_writer import write_pi0_checkpoint

INSTRUCTION = 'pick up the red block'


@pytest.fixture(scope='module')
def folders(tmp_path_factory):
    return {
        policy_type: write_pi0_checkpoint(
            tmp_path_factory.mktemp(policy_type), policy_type=policy_type, tokenizer=True
        )
        for policy_type in ('pi0', 'pi05')
    }


@pytest.fixture(scope='module')
def processors(folders):
    return {
        policy_type: Pi0Processor(
            read_pi0_spec(path), load_paligemma_tokenizer(path / 'tokenizer')
        )
        for policy_type, path in folders.items()
    }


@pytest.fixture(params=['pi0', 'pi05'])
def processor(request, processors):
    return processors[request.param]


def _bilinear_reference(image: np.ndarray, out_h: int, out_w: int) -> np.ndarray:
    """Half-pixel bilinear sampling of a ``[C, H, W]`` float64 image, written per pixel
    (source index clamped at 0, neighbour clamped at the edge), without antialiasing."""
    channels, height, width = image.shape

    def taps(size_in, size_out, i):
        src = max((i + 0.5) * size_in / size_out - 0.5, 0.0)
        lo = min(math.floor(src), size_in - 1)
        return lo, min(lo + 1, size_in - 1), src - lo

    out = np.zeros((channels, out_h, out_w))
    for y in range(out_h):
        y0, y1, wy = taps(height, out_h, y)
        for x in range(out_w):
            x0, x1, wx = taps(width, out_w, x)
            top = image[:, y0, x0] * (1 - wx) + image[:, y0, x1] * wx
            bottom = image[:, y1, x0] * (1 - wx) + image[:, y1, x1] * wx
            out[:, y, x] = top * (1 - wy) + bottom * wy
    return out


@pytest.mark.parametrize(('height', 'width'), [(30, 45), (80, 41), (112, 112), (21, 28)])
def test_resize_with_pad_matches_a_bilinear_written_out_and_centres_it(height, width):
    rng = np.random.default_rng(height * width)
    image = rng.random((3, height, width))
    size = 56
    got = resize_with_pad(torch.from_numpy(image).float()[None], size)[0].double().numpy()
    ratio = max(width / size, height / size)
    new_h, new_w = int(height / ratio), int(width / ratio)
    top, left = (size - new_h) // 2, (size - new_w) // 2
    expected = np.zeros((3, size, size))
    expected[:, top : top + new_h, left : left + new_w] = _bilinear_reference(image, new_h, new_w)
    np.testing.assert_allclose(got, expected, atol=1e-5)


def test_pixels_map_to_minus_one_one_with_padding_at_minus_one(processor):
    image = np.full((28, 56, 3), 255, dtype=np.uint8)
    image[:, :, 1] = 0
    pixels = processor.pixels([image, np.zeros((56, 56, 3), dtype=np.uint8)])
    assert pixels.shape == (2, 3, 56, 56) and pixels.dtype == torch.float32
    top_pad, body = pixels[0, :, :14], pixels[0, :, 14:42]
    assert torch.all(top_pad == -1.0) and torch.all(pixels[0, :, 42:] == -1.0)
    assert torch.all(body[0] == 1.0) and torch.all(body[1] == -1.0)
    assert torch.all(pixels[1] == -1.0)


def test_pixels_of_the_model_size_are_not_resampled(processor):
    image = np.random.default_rng(1).integers(0, 256, (56, 56, 3), dtype=np.uint8)
    expected = torch.from_numpy(image).permute(2, 0, 1).float() / 255.0 * 2.0 - 1.0
    assert torch.equal(processor.pixels([image])[0], expected)


def test_state_bins_follow_lerobots_digitize():
    values = np.array([-1.5, -1.0, -0.99, 0.0, 0.51, 0.999, 1.0, 2.0], dtype=np.float32)
    assert discretize_state(values).tolist() == [-1, 0, 1, 128, 193, 255, 255, 255]


def _normalize(values, stats, mode):
    if mode == 'MEAN_STD':
        return (values - stats['mean']) / (stats['std'] + 1e-8)
    return 2.0 * (values - stats['q01']) / (stats['q99'] - stats['q01']) - 1.0


def test_state_is_normalized_by_the_mode_and_zero_padded(processor):
    spec = processor.spec
    state = np.random.default_rng(2).normal(size=spec.state_dim).astype(np.float32)
    got = processor.normalize_state(state)
    assert got.shape == (32,) and got.dtype == torch.float32
    expected = _normalize(state.astype(np.float64), spec.state_statistics, spec.state_mode)
    np.testing.assert_allclose(got[: spec.state_dim].numpy(), expected, rtol=1e-5, atol=1e-6)
    assert torch.all(got[spec.state_dim :] == 0)


def test_actions_round_trip_through_the_modes_inverse(processor):
    spec = processor.spec
    rng = np.random.default_rng(3)
    actions = rng.normal(size=(spec.n_action_steps, spec.action_dim))
    normalized = rng.normal(size=(spec.chunk_size, spec.max_action_dim)).astype(np.float32)
    stats = {k: v.astype(np.float64) for k, v in spec.action_statistics.items()}
    normalized[: spec.n_action_steps, : spec.action_dim] = _normalize(
        actions, stats, spec.action_mode
    )
    got = processor.unnormalize_actions(torch.from_numpy(normalized))
    assert got.shape == (spec.n_action_steps, spec.action_dim) and got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), actions, rtol=1e-5, atol=1e-5)


def test_actions_are_not_clipped(processor):
    spec = processor.spec
    far = np.full((spec.chunk_size, spec.max_action_dim), 5.0, dtype=np.float32)
    got = processor.unnormalize_actions(far)
    stats = spec.action_statistics
    high = stats['mean'] + 3 * stats['std'] if 'mean' in stats else stats['q99']
    assert torch.all(got > torch.from_numpy(high))


def test_pi0_prompt_is_the_task_with_a_newline_as_the_tokenizer_gives_it(processors):
    processor = processors['pi0']
    tokenizer = processor.tokenizer
    state = np.zeros(8)
    expected = tuple(tokenizer(INSTRUCTION + '\n')['input_ids'])
    assert processor.prompt_ids(INSTRUCTION, state) == expected
    assert processor.prompt_ids(INSTRUCTION + '\n', state) == expected
    assert expected[0] == tokenizer.bos_token_id and expected[-1] != tokenizer.pad_token_id


def test_pi05_prompt_holds_the_task_and_the_state_bins(processors):
    processor = processors['pi05']
    spec = processor.spec
    q01, q99 = spec.state_statistics['q01'], spec.state_statistics['q99']
    wanted = np.array([-1.5, -0.995, 0.003, 0.51, 1.2, 0.003, 0.003, 0.003])
    state = q01 + (q99 - q01) * (wanted + 1.0) / 2.0
    bins = ' '.join(['-1', '0', '128', '193', '255', '128', '128', '128'] + ['128'] * 24)
    text = f'Task: put the cup in the bowl, State: {bins};\nAction: '
    assert processor.prompt_text(' put_the cup\nin the bowl ', state) == text
    expected = tuple(processor.tokenizer(text)['input_ids'])
    assert processor.prompt_ids(' put_the cup\nin the bowl ', state) == expected


def test_long_prompts_are_truncated_to_the_max_length_as_lerobot_does(processor):
    spec = processor.spec
    instruction = ' '.join([INSTRUCTION] * 60)
    ids = processor.prompt_ids(instruction, np.zeros(spec.state_dim))
    text = processor.prompt_text(instruction, np.zeros(spec.state_dim))
    full = processor.tokenizer(text)['input_ids']
    assert len(full) > spec.tokenizer_max_length == len(ids)
    assert ids == tuple(full[: spec.tokenizer_max_length])


def test_ids_outside_the_model_vocabulary_are_refused(processor):
    def other_tokenizer(text, **kwargs):
        return {'input_ids': [2, 70000], 'attention_mask': [1, 1]}

    stranger = Pi0Processor(processor.spec, other_tokenizer)
    with pytest.raises(ValueError, match='70000'):
        stranger.prompt_ids(INSTRUCTION, np.zeros(processor.spec.state_dim))


def test_a_state_of_the_wrong_size_or_not_finite_is_refused(processor):
    with pytest.raises(ValueError, match='shape'):
        processor.normalize_state(np.zeros(3))
    with pytest.raises(ValueError, match='finite'):
        processor.normalize_state(np.full(processor.spec.state_dim, np.nan))


def test_a_named_folder_without_the_tokenizer_is_refused_with_the_download_command(tmp_path):
    with pytest.raises(TokenizerMissingError) as info:
        load_paligemma_tokenizer(tmp_path)
    assert (
        'hf download google/paligemma-3b-pt-224 tokenizer.json tokenizer_config.json '
        f'special_tokens_map.json --local-dir {tmp_path}'
    ) in str(info.value)


def test_an_empty_cache_is_refused_with_the_download_command(tmp_path):
    with pytest.raises(TokenizerMissingError) as info:
        load_paligemma_tokenizer(cache_dir=tmp_path)
    assert '--local-dir <dir>' in str(info.value) and str(tmp_path) in str(info.value)


def test_the_tokenizer_is_found_in_the_hugging_face_cache_layout(folders, tmp_path):
    folder = folders['pi0']
    repo = tmp_path / 'models--google--paligemma-3b-pt-224'
    snapshot = repo / 'snapshots' / ('a' * 40)
    shutil.copytree(folder / 'tokenizer', snapshot)
    (repo / 'refs').mkdir()
    (repo / 'refs' / 'main').write_text('a' * 40)
    tokenizer = load_paligemma_tokenizer(cache_dir=tmp_path)
    assert tokenizer(INSTRUCTION)['input_ids'][0] == 2


def test_the_hub_cache_follows_hf_hub_cache_then_hf_home(monkeypatch, tmp_path):
    monkeypatch.delenv('HF_HUB_CACHE', raising=False)
    monkeypatch.setenv('HF_HOME', str(tmp_path / 'home'))
    assert hub_cache_dir() == tmp_path / 'home' / 'hub'
    monkeypatch.setenv('HF_HUB_CACHE', str(tmp_path / 'cache'))
    assert hub_cache_dir() == tmp_path / 'cache'
