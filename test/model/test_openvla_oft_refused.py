"""An OpenVLA-OFT folder (openvla-7b's config.json plus OFT's component files) is read as OFT
only with OFT settings; without them it is refused naming its files and the setting to give,
never read as plain OpenVLA."""

from __future__ import annotations

import pytest

from vla_sched.model.config.architecture import UnsupportedArchitectureError
from vla_sched.model.config.checkpoint_spec import CheckpointError, CheckpointSpec
from vla_sched.model.config.formats import read_checkpoint_spec, read_dataset_choice
from vla_sched.model.config.openvla_oft import oft_preset
from vla_sched.testing.openvla_writer import write_openvla_checkpoint

DATASETS = ('libero_spatial_no_noops', 'libero_object_no_noops')


@pytest.fixture(scope='module')
def openvla_dir(tmp_path_factory):
    return write_openvla_checkpoint(
        tmp_path_factory.mktemp('openvla'), datasets=DATASETS, statistics_file=True
    )


def _linked_copy(source, target):
    target.mkdir()
    for path in source.iterdir():
        (target / path.name).symlink_to(path)
    return target


@pytest.mark.parametrize('read', [read_checkpoint_spec, read_dataset_choice])
def test_oft_files_without_oft_settings_are_refused_naming_them_and_the_setting(
    openvla_dir, read, tmp_path
):
    assert read(openvla_dir)  # the plain OpenVLA folder reads
    oft = _linked_copy(openvla_dir, tmp_path / 'oft')
    (oft / 'action_head--150000_checkpoint.pt').touch()
    with pytest.raises(UnsupportedArchitectureError) as refused:
        read(oft)
    message = str(refused.value)
    assert 'action_head--150000_checkpoint.pt' in message
    assert 'OpenVLA-OFT' in message and 'OFT settings' in message and 'oft_preset' in message
    (oft / 'proprio_projector--150000_checkpoint.pt').touch()
    with pytest.raises(
        UnsupportedArchitectureError,
        match=r'action_head--150000_checkpoint\.pt, proprio_projector--150000_checkpoint\.pt',
    ):
        read(oft)


@pytest.mark.parametrize('read', [read_checkpoint_spec, read_dataset_choice])
def test_oft_settings_for_a_plain_openvla_folder_are_refused(openvla_dir, read):
    with pytest.raises(CheckpointError, match='holds no OpenVLA-OFT component files'):
        read(openvla_dir, oft_settings=oft_preset('libero'))


def test_a_file_merely_named_like_a_component_is_no_oft_marker(openvla_dir, tmp_path):
    folder = _linked_copy(openvla_dir, tmp_path / 'plain')
    (folder / 'action_head.md').touch()  # no '--': not what OFT training writes
    (folder / 'action_head--notes.txt').touch()  # no 'checkpoint' in the name
    spec = read_checkpoint_spec(folder)
    assert isinstance(spec, CheckpointSpec)
    assert spec.decoder == read_checkpoint_spec(openvla_dir).decoder
    assert read_dataset_choice(folder) == (tuple(sorted(DATASETS)), None)
