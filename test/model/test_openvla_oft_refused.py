"""An OpenVLA-OFT folder (openvla-7b's config.json plus OFT's component files) is refused by
name, never read as plain OpenVLA."""

from __future__ import annotations

import pytest

from vla_sched.model.config.architecture import UnsupportedArchitectureError
from vla_sched.model.config.formats import read_checkpoint_spec, read_dataset_choice
from vla_sched.testing.openvla_writer import write_openvla_checkpoint

DATASETS = ('libero_spatial_no_noops', 'libero_object_no_noops')


@pytest.fixture(scope='module')
def openvla_dir(tmp_path_factory):
    return write_openvla_checkpoint(
        tmp_path_factory.mktemp('openvla'), datasets=DATASETS, statistics_file=True
    )


@pytest.mark.parametrize('read', [read_checkpoint_spec, read_dataset_choice])
def test_an_oft_action_head_file_makes_the_folder_refused_naming_it(openvla_dir, read, tmp_path):
    assert read(openvla_dir)  # the plain OpenVLA folder reads
    oft = tmp_path / 'oft'
    oft.mkdir()
    for path in openvla_dir.iterdir():
        (oft / path.name).symlink_to(path)
    (oft / 'action_head--150000_checkpoint.pt').touch()
    with pytest.raises(UnsupportedArchitectureError) as refused:
        read(oft)
    message = str(refused.value)
    assert 'action_head--150000_checkpoint.pt' in message
    assert 'OpenVLA-OFT' in message and 'not served yet' in message
    (oft / 'proprio_projector--150000_checkpoint.pt').touch()
    with pytest.raises(
        UnsupportedArchitectureError,
        match=r'action_head--150000_checkpoint\.pt, proprio_projector--150000_checkpoint\.pt',
    ):
        read(oft)


def test_a_file_merely_named_like_a_component_is_no_oft_marker(openvla_dir, tmp_path):
    folder = tmp_path / 'plain'
    folder.mkdir()
    for path in openvla_dir.iterdir():
        (folder / path.name).symlink_to(path)
    (folder / 'action_head.md').touch()  # no '--': not what OFT training writes
    assert read_checkpoint_spec(folder).decoder == read_checkpoint_spec(openvla_dir).decoder
    assert read_dataset_choice(folder) == (tuple(sorted(DATASETS)), None)
