"""Loading OpenVLA-OFT folders: the settings and presets, what a folder must hold, refusals
naming what disagrees, ``module.`` prefixes, tensors-only component files, and the choice of
dataset statistics."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from vla_sched.model.config.action_space import ActionStatisticsError
from vla_sched.model.config.architecture import UnsupportedArchitectureError
from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.config.formats import read_dataset_choice
from vla_sched.model.families.openvla_oft.checkpoint import (
    OFT_PRESETS,
    NormalizationBounds,
    OFTCheckpointSpec,
    OFTSettings,
    oft_preset,
    read_oft_spec,
)
from vla_sched.model.families.openvla_oft.model import load_oft_checkpoint
from vla_sched.model.families.openvla_oft.prompt import OFTPromptBuilder
from vla_sched.testing.openvla_oft_writer import (
    OFT_STEP,
    oft_head_state,
    oft_proprio_state,
    save_component,
    write_openvla_oft_checkpoint,
)

DATASETS = ('libero_spatial_no_noops', 'libero_object_no_noops', 'libero_goal_no_noops')
HEAD_FILE = f'action_head--{OFT_STEP}_checkpoint.pt'
PROPRIO_FILE = f'proprio_projector--{OFT_STEP}_checkpoint.pt'
TINY_HIDDEN = 64


@pytest.fixture(scope='module')
def oft_dir(tmp_path_factory):
    return write_openvla_oft_checkpoint(
        tmp_path_factory.mktemp('oft'), settings=oft_preset('libero'), datasets=DATASETS
    )


def linked_copy(source: Path, target: Path, *, leave_out: tuple[str, ...] = ()) -> Path:
    """The folder's files as links in ``target``, without ``leave_out``."""
    target.mkdir()
    for path in source.iterdir():
        if path.name not in leave_out:
            (target / path.name).symlink_to(path)
    return target


def libero(**overrides) -> OFTSettings:
    return oft_preset('libero', **overrides)


def test_presets_hold_upstreams_platform_constants():
    table = {
        name: (s.chunk_len, s.action_dim, s.proprio_dim, s.normalization)
        for name, s in OFT_PRESETS.items()
    }
    assert table == {
        'libero': (8, 7, 8, 'bounds_q99'),
        'aloha': (25, 14, 14, 'bounds'),
        'bridge': (5, 7, 7, 'bounds_q99'),
    }
    assert [OFT_PRESETS[n].num_images for n in ('libero', 'aloha', 'bridge')] == [2, 3, 1]
    assert all(s.center_crop and s.use_proprio for s in OFT_PRESETS.values())
    assert oft_preset('aloha', chunk_len=50).chunk_len == 50
    assert OFT_PRESETS['aloha'].chunk_len == 25  # a preset is never changed in place


@pytest.mark.parametrize(
    ('call', 'message'),
    [
        (lambda: oft_preset('droid'), "unknown OFT preset 'droid'"),
        (lambda: oft_preset('libero', chunk=4), r"no fields \['chunk'\]"),
        (lambda: libero(num_images=4), 'num_images must be 1 to 3'),
        (lambda: libero(chunk_len=0), 'chunk_len must be a positive integer'),
        (lambda: libero(normalization='normal'), 'normalization must be one of'),
    ],
)
def test_settings_refuse_what_upstream_does_not_define(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_an_oft_folder_reads_as_oft_with_settings(oft_dir):
    spec = read_oft_spec(oft_dir, libero())
    assert isinstance(spec, OFTCheckpointSpec)
    assert (spec.files.action_head, spec.files.proprio_projector) == (HEAD_FILE, PROPRIO_FILE)
    assert (spec.chunk_len, spec.action_dim, spec.num_image_tokens) == (8, 7, 256)
    assert sorted(spec.action_bounds) == sorted(DATASETS) == sorted(spec.proprio_bounds)
    names, own_key = read_dataset_choice(oft_dir)
    assert (names, own_key) == (tuple(sorted(DATASETS)), None)


def test_the_normalization_setting_picks_the_bounds(oft_dir):
    statistics = json.loads((oft_dir / 'dataset_statistics.json').read_text())
    entry = statistics['libero_goal_no_noops']
    q99 = read_oft_spec(oft_dir, libero())
    minmax = read_oft_spec(oft_dir, libero(normalization='bounds'))
    for spec, low, high in ((q99, 'q01', 'q99'), (minmax, 'min', 'max')):
        action = spec.action_bounds['libero_goal_no_noops']
        np.testing.assert_array_equal(action.low, entry['action'][low])
        np.testing.assert_array_equal(action.high, entry['action'][high])
        np.testing.assert_array_equal(action.mask, entry['action']['mask'])
        proprio = spec.proprio_bounds['libero_goal_no_noops']
        np.testing.assert_array_equal(proprio.high, entry['proprio'][high])
        assert proprio.mask.all()  # no mask in the file: every dimension


def test_unnorm_key_picks_one_dataset_and_is_needed_with_several(oft_dir):
    spec = read_oft_spec(oft_dir, libero())
    with pytest.raises(ActionStatisticsError, match='several datasets'):
        _ = spec.dataset
    chosen = spec.with_unnorm_key('libero_object_no_noops')
    assert chosen.dataset == chosen.base.unnorm_key == 'libero_object_no_noops'
    assert chosen.selected_action_bounds is spec.action_bounds['libero_object_no_noops']
    assert chosen.selected_proprio_bounds is spec.proprio_bounds['libero_object_no_noops']
    with pytest.raises(ActionStatisticsError, match=r"no action statistics for 'libero_10'"):
        spec.with_unnorm_key('libero_10')


def test_vla_config_unnorm_key_is_the_folders_choice(oft_dir, tmp_path):
    folder = linked_copy(oft_dir, tmp_path / 'keyed')
    (folder / 'vla_config.json').write_text(json.dumps({'unnorm_key': 'libero_goal_no_noops'}))
    assert read_oft_spec(folder, libero()).dataset == 'libero_goal_no_noops'
    assert read_dataset_choice(folder)[1] == 'libero_goal_no_noops'


def test_bounds_round_trip_and_clip_the_state():
    bounds = NormalizationBounds(
        low=np.array([-1.0, 0.0]), high=np.array([1.0, 4.0]), mask=np.array([True, False])
    )
    np.testing.assert_allclose(bounds.unnormalize(np.array([0.5, 0.7])), [0.5, 0.7])
    np.testing.assert_allclose(bounds.normalize(np.array([0.5, 0.7])), [0.5, 0.7])
    np.testing.assert_allclose(bounds.normalize(np.array([3.0, 9.0])), [1.0, 1.0])


@pytest.mark.parametrize(
    ('settings', 'message'),
    [
        (libero(action_dim=6), r"\['action'\] has 7 dimensions but OFT setting action_dim is 6"),
        (libero(proprio_dim=9), r"\['proprio'\] has 8 dimensions but OFT setting proprio_dim"),
        (libero(use_proprio=False), 'use_proprio is false but .* holds proprio_projector--'),
    ],
)
def test_settings_the_statistics_or_files_disagree_with_are_refused(oft_dir, settings, message):
    with pytest.raises(CheckpointError, match=message):
        read_oft_spec(oft_dir, settings)


def test_missing_files_are_named(oft_dir, tmp_path):
    no_proprio = linked_copy(oft_dir, tmp_path / 'no_proprio', leave_out=(PROPRIO_FILE,))
    with pytest.raises(CheckpointError, match=r'use_proprio is true but .* no proprio_projector'):
        read_oft_spec(no_proprio, libero())
    assert read_oft_spec(no_proprio, libero(use_proprio=False))
    no_head = linked_copy(oft_dir, tmp_path / 'no_head', leave_out=(HEAD_FILE,))
    with pytest.raises(CheckpointError, match='no action_head--'):
        read_oft_spec(no_head, libero())
    no_stats = linked_copy(oft_dir, tmp_path / 'no_stats', leave_out=('dataset_statistics.json',))
    with pytest.raises(CheckpointError, match=r'missing dataset_statistics\.json'):
        read_oft_spec(no_stats, libero())
    two_heads = linked_copy(oft_dir, tmp_path / 'two_heads')
    (two_heads / 'action_head--latest_checkpoint.pt').symlink_to(oft_dir / HEAD_FILE)
    with pytest.raises(CheckpointError, match='several action_head files'):
        read_oft_spec(two_heads, libero())


@pytest.mark.parametrize(
    ('component', 'meaning'),
    [('noisy_action_projector', 'diffusion action head'), ('vision_backbone', 'FiLM')],
)
def test_diffusion_and_film_checkpoints_are_refused_naming_them(
    oft_dir, tmp_path, component, meaning
):
    folder = linked_copy(oft_dir, tmp_path / component)
    (folder / f'{component}--{OFT_STEP}_checkpoint.pt').touch()
    with pytest.raises(UnsupportedArchitectureError, match=f'{component}--.*{meaning}'):
        read_oft_spec(folder, libero())


def test_module_prefixes_are_stripped_and_the_weights_loaded(oft_dir, tmp_path):
    stored = torch.load(oft_dir / HEAD_FILE, weights_only=True)
    assert all(name.startswith('module.') for name in stored)
    model = load_oft_checkpoint(oft_dir, settings=libero())
    loaded = model.action_head.state_dict()
    assert sorted(loaded) == sorted(n.removeprefix('module.') for n in stored)
    torch.testing.assert_close(loaded['model.fc1.weight'], stored['module.model.fc1.weight'])
    torch.testing.assert_close(
        model.proprio_projector.fc1.weight,
        torch.load(oft_dir / PROPRIO_FILE, weights_only=True)['module.fc1.weight'],
    )
    folder = linked_copy(oft_dir, tmp_path / 'bare', leave_out=(HEAD_FILE,))
    head = oft_head_state(hidden_size=TINY_HIDDEN, action_dim=7)
    save_component(folder / HEAD_FILE, head, ddp_prefix=False)  # saved without DDP
    bare = load_oft_checkpoint(folder, settings=libero())
    torch.testing.assert_close(bare.action_head.model.fc2.bias, head['model.fc2.bias'])


def _with_component(oft_dir: Path, folder: Path, name: str, state: dict) -> Path:
    linked_copy(oft_dir, folder, leave_out=(name,))
    save_component(folder / name, state)
    return folder


def test_a_head_of_another_width_is_refused_naming_the_tensor_and_setting(oft_dir, tmp_path):
    head = oft_head_state(hidden_size=TINY_HIDDEN, action_dim=6)
    folder = _with_component(oft_dir, tmp_path / 'head6', HEAD_FILE, head)
    with pytest.raises(CheckpointError) as refused:
        load_oft_checkpoint(folder, settings=libero())
    message = str(refused.value)
    assert HEAD_FILE in message and 'model.fc1.weight [64, 384]' in message
    assert 'action_dim 7 is 448' in message


def test_a_projector_of_another_width_is_refused_naming_the_tensor_and_setting(oft_dir, tmp_path):
    projector = oft_proprio_state(hidden_size=TINY_HIDDEN, proprio_dim=7)
    folder = _with_component(oft_dir, tmp_path / 'proprio7', PROPRIO_FILE, projector)
    with pytest.raises(CheckpointError, match=r'fc1\.weight \[64, 7\].*proprio_dim is 8'):
        load_oft_checkpoint(folder, settings=libero())


def test_a_diffusion_head_file_is_refused_at_load(oft_dir, tmp_path):
    head = oft_head_state(hidden_size=TINY_HIDDEN, action_dim=7)
    noise = {f'noise_predictor.mlp_resnet.{k.removeprefix("model.")}': v for k, v in head.items()}
    folder = _with_component(oft_dir, tmp_path / 'diffusion', HEAD_FILE, noise)
    with pytest.raises(UnsupportedArchitectureError, match='diffusion action head'):
        load_oft_checkpoint(folder, settings=libero())


class _Pickled:
    """Any object a tensors-only load must not build."""


def test_a_component_file_holding_objects_is_refused_unopened(oft_dir, tmp_path):
    folder = linked_copy(oft_dir, tmp_path / 'objects', leave_out=(HEAD_FILE,))
    torch.save({'module.model.fc1.weight': _Pickled()}, folder / HEAD_FILE)
    with pytest.raises(CheckpointError, match='not a tensors-only torch file'):
        load_oft_checkpoint(folder, settings=libero())


def test_the_sequence_holds_images_proprio_prompt_action_slots_and_stop(oft_dir):
    spec = read_oft_spec(oft_dir, libero())
    builder = OFTPromptBuilder.from_checkpoint(oft_dir, spec)
    prompt = builder.build('Pick up the Bowl')
    ids, layout = prompt.token_ids, prompt.layout
    image_id = spec.base.image_token_id
    assert (layout.image_offset(0), layout.image_offset(1)) == (1, 257)
    assert layout.proprio_offset == 513 and layout.prompt_offset == 514
    assert ids[0] == 1 and set(ids[1:514]) == {image_id}
    text = builder._prompts.encode_text(
        'In: What action should the robot take to pick up the bowl?\nOut:'
    )
    assert list(ids[514 : layout.action_offset]) == [*text, 29871]
    assert layout.prompt_len == len(text) + 1
    assert ids[layout.head_offset] == 29871
    assert ids[layout.action_offset : layout.stop_offset] == (1,) * 56
    assert ids[-1] == 2 and len(ids) == layout.seq_len == 1 + 512 + 1 + len(text) + 1 + 56 + 1
