"""The engine's checkpoint settings: the start-up check of model_path and unnorm_key, and
how action_decoding picks and reads action tokens."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from vla_sched.engine.checkpoints import (
    ModelPathError,
    check_model_path,
    family_options,
)
from vla_sched.engine.config import EngineConfig, EngineConfigError
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.engine.sequential_core import SequentialCore
from vla_sched.ipc.messages import StepRequest, StepResult
from vla_sched.model.config.formats import read_checkpoint_spec
from vla_sched.model.families.openvla.action_tokenizer import ActionChunkDecoder
from vla_sched.model.families.openvla.family import decodes_whole_vocab, read_spec


def _openvla_folder(folder, datasets):
    """An OpenVLA-format folder's JSON files (no weights: the check reads JSON only)."""
    from vla_sched.model.config.presets import openvla_config, openvla_norm_stats

    folder.mkdir(parents=True, exist_ok=True)
    config = openvla_config('fused', tiny=True, norm_stats=openvla_norm_stats(datasets))
    (folder / 'config.json').write_text(json.dumps(config))
    (folder / 'tokenizer.json').write_text('{}')
    return folder


@pytest.fixture(scope='module')
def several(tmp_path_factory):
    return _openvla_folder(tmp_path_factory.mktemp('several'), ('bridge_orig', 'fractal', 'kuka'))


def test_several_datasets_without_unnorm_key_are_refused_with_their_names(several):
    with pytest.raises(ModelPathError, match=r'engine\.unnorm_key') as info:
        check_model_path(EngineConfig(model_path=str(several)))
    assert "['bridge_orig', 'fractal', 'kuka']" in str(info.value)


def test_an_unknown_unnorm_key_is_refused_with_the_dataset_names(several):
    with pytest.raises(ModelPathError, match=r"'libero' .*\['bridge_orig', 'fractal', 'kuka'\]"):
        check_model_path(EngineConfig(model_path=str(several), unnorm_key='libero'))


def test_a_chosen_dataset_or_a_single_one_passes_the_check(several, tmp_path):
    check_model_path(EngineConfig(model_path=str(several), unnorm_key='fractal'))
    check_model_path(EngineConfig(model_path=str(_openvla_folder(tmp_path, ('libero',)))))


def test_a_missing_or_unreadable_folder_is_refused_naming_model_path(tmp_path):
    with pytest.raises(ModelPathError, match=r'engine\.model_path .*does not exist'):
        check_model_path(EngineConfig(model_path=str(tmp_path / 'nowhere')))
    folder = _openvla_folder(tmp_path / 'bad', ('a',))
    (folder / 'tokenizer.json').unlink()
    with pytest.raises(ModelPathError, match=r'engine\.model_path .*tokenizer\.json'):
        check_model_path(EngineConfig(model_path=str(folder)))


def test_the_built_in_checkpoint_is_not_checked():
    check_model_path(EngineConfig(model_path='', unnorm_key='anything'))


@pytest.mark.parametrize('core', [ScheduledCore, SequentialCore])
def test_both_cores_refuse_before_loading_anything(several, core):
    # The folder has no weights: only the start-up check can raise this error.
    with pytest.raises(ModelPathError, match='set it to one of'):
        core.from_config(EngineConfig(model_path=str(several)))


def test_the_unnorm_key_setting_selects_the_statistics(several):
    spec = read_spec(several, family_options(EngineConfig(unnorm_key='kuka')))
    assert spec.unnorm_key == 'kuka'
    assert ActionChunkDecoder.for_checkpoint(spec).statistics is spec.action_statistics['kuka']


def test_auto_decoding_is_the_checkpoints_own_and_the_setting_overrides_it(several, tmp_path):
    from vla_sched.model.loading.tiny_checkpoint import build_tiny_checkpoint

    openvla = read_checkpoint_spec(several)
    llava = read_checkpoint_spec(build_tiny_checkpoint(tmp_path / 'tiny'))
    auto = family_options(EngineConfig())
    assert decodes_whole_vocab(auto, openvla) and not decodes_whole_vocab(auto, llava)
    whole = family_options(EngineConfig(action_decoding='whole_vocab'))
    assert decodes_whole_vocab(whole, llava)
    in_range = family_options(EngineConfig(action_decoding='action_range'))
    assert not decodes_whole_vocab(in_range, openvla)
    with pytest.raises(EngineConfigError, match='action_decoding'):
        EngineConfig(action_decoding='beam')


def _request(step_seq: int) -> StepRequest:
    now = time.time_ns()
    return StepRequest(
        robot_id='r1', step_seq=step_seq, stamp_ns=now, deadline_ns=now + 120 * 10**9,
        received_ns=now, images=(np.full((20, 30, 3), 40 * step_seq, np.uint8),),
        state=np.zeros(0, np.float32), instruction='pick up the cup', instruction_version=1,
    )  # fmt: skip


@pytest.mark.slow
def test_whole_vocab_decoding_samples_every_id_and_clips_into_the_bins():
    core = ScheduledCore.from_config(
        EngineConfig(kv_pool_tokens=1024, page_size=16, action_decoding='whole_vocab')
    )
    try:
        assert core.submit(_request(1), time.time_ns()) == []
        sampling = core.scheduler.waiting_queue[0].sampling
        vocab = core.served.spec.decoder.vocab_size
        assert (sampling.allowed_token_start, sampling.allowed_token_end) == (0, vocab)
        out = []
        for _ in range(200):
            if not core.has_work():
                break
            out += core.step(time.time_ns())
        (result,) = out
        assert isinstance(result, StepResult)
        stats = core.served.decoder.statistics
        low = stats.unnormalize(np.full(stats.action_dim, -1.0))
        high = stats.unnormalize(np.full(stats.action_dim, 1.0))
        assert np.all((result.actions >= low - 1e-6) & (result.actions <= high + 1e-6))
    finally:
        core.close()
