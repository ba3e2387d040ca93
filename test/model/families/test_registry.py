"""The registry picks a folder's family from its files: an OpenVLA-OFT folder (openvla-7b's
config.json plus OFT's component files) is OFT's, never read as plain OpenVLA, and is refused
without its settings, naming its files and the setting to give; a folder of no known family
is refused naming what it holds and the families known."""

from __future__ import annotations

import json

import pytest

from vla_sched.model.families.protocol import FamilyError, FamilyOptions
from vla_sched.model.families.registry import (
    FAMILY_NAMES,
    family_named,
    family_of,
    foreign_settings,
)
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


def test_every_listed_family_is_found_by_its_name():
    assert [family_named(name).name for name in FAMILY_NAMES] == list(FAMILY_NAMES)
    with pytest.raises(FamilyError, match=r"unknown model family 'pi9'.*openvla_oft"):
        family_named('pi9')


def test_oft_files_make_the_folder_oft_and_without_settings_it_is_refused_naming_them(
    openvla_dir, tmp_path
):
    assert family_of(openvla_dir).name == 'openvla'
    oft = _linked_copy(openvla_dir, tmp_path / 'oft')
    (oft / 'action_head--150000_checkpoint.pt').touch()
    (oft / 'proprio_projector--150000_checkpoint.pt').touch()
    family = family_of(oft)
    assert family.name == 'openvla_oft'
    with pytest.raises(FamilyError) as refused:
        family.check_folder(oft, FamilyOptions(settings={}))
    message = str(refused.value)
    assert 'action_head--150000_checkpoint.pt, proprio_projector--150000_checkpoint.pt' in message
    assert 'OpenVLA-OFT' in message and 'engine.oft_preset' in message


def test_a_file_merely_named_like_a_component_is_no_oft_marker(openvla_dir, tmp_path):
    folder = _linked_copy(openvla_dir, tmp_path / 'plain')
    (folder / 'action_head.md').touch()  # no '--': not what OFT training writes
    (folder / 'action_head--notes.txt').touch()  # no 'checkpoint' in the name
    family = family_of(folder)
    assert family.name == 'openvla'
    names, own_key = family.check_folder(folder, FamilyOptions(settings={}))
    assert (names, own_key) == (tuple(sorted(DATASETS)), None)


def test_the_settings_of_another_family_are_named(openvla_dir):
    plain = family_of(openvla_dir)
    assert foreign_settings(plain, {'oft_preset': 'libero', 'unnorm_key': 'x'}) == (
        'engine.oft_preset',
    )
    assert foreign_settings(plain, {'oft_preset': '', 'oft_chunk_len': 0}) == ()
    assert foreign_settings(family_named('openvla_oft'), {'oft_preset': 'libero'}) == ()


@pytest.mark.parametrize(
    ('config', 'named'),
    [
        ({'type': 'act'}, "'type': 'act'"),
        ({'model_type': 'mamba'}, "'model_type': 'mamba'"),
        ({}, 'no model_type, type or architectures'),
        (None, 'no config.json'),
    ],
)
def test_a_folder_of_no_known_family_is_refused_naming_what_it_holds(tmp_path, config, named):
    if config is not None:
        (tmp_path / 'config.json').write_text(json.dumps(config))
    with pytest.raises(FamilyError) as refused:
        family_of(tmp_path)
    message = str(refused.value)
    assert named in message
    assert all(f'{name}:' in message for name in FAMILY_NAMES)
