"""Action tokens: OpenVLA's exact binning, edges and clip; un-normalization; chunks."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from vla_sched.model.config.action_space import (
    ActionStatistics,
    ActionStatisticsError,
    ActionTokenizerConfig,
    load_action_statistics,
    select_statistics,
)
from vla_sched.model.families.openvla.action_tokenizer import ActionChunkDecoder, ActionTokenizer

OPENVLA = ActionTokenizer(ActionTokenizerConfig(vocab_end=32000))
HALF_BIN = 1.0 / 255.0  # half the width of one of OpenVLA's 255 bins on [-1, 1]


def test_openvla_token_range_is_the_last_256_ids_below_32000():
    assert (OPENVLA.token_start, OPENVLA.token_end) == (31744, 32000)


def test_minus_one_is_the_highest_token_and_plus_one_the_lowest():
    assert OPENVLA.encode([-1.0, 1.0]).tolist() == [31999, 31744]


def test_out_of_range_actions_are_clipped_before_binning():
    assert OPENVLA.encode([-7.5, 3.0]).tolist() == [31999, 31744]


def test_zero_lands_on_bin_128_whose_decoded_centre_is_zero():
    assert OPENVLA.encode([0.0]).tolist() == [31872]
    assert OPENVLA.decode([31872]).tolist() == [0.0]


def test_decode_of_the_extreme_tokens_gives_the_outer_bin_centres():
    low, high = OPENVLA.decode([31999, 31744])
    assert low == pytest.approx(-1.0 + HALF_BIN, abs=1e-12)
    assert high == pytest.approx(1.0 - HALF_BIN, abs=1e-12)


def test_the_lowest_token_is_clipped_onto_the_same_centre_as_its_neighbour():
    # +1 digitizes to bin 256, which has no centre: OpenVLA clips it onto centre 254.
    assert OPENVLA.decode([31744]).tolist() == OPENVLA.decode([31745]).tolist()
    assert len(set(OPENVLA.decode(np.arange(31744, 32000)).tolist())) == 255


def test_every_bin_centre_round_trips_exactly():
    centres = OPENVLA.bin_centers
    assert np.array_equal(OPENVLA.decode(OPENVLA.encode(centres)), centres)


@given(st.floats(min_value=-1.0, max_value=1.0, allow_nan=False))
def test_round_trip_error_is_at_most_one_bin(value):
    decoded = OPENVLA.decode(OPENVLA.encode([value]))[0]
    assert abs(decoded - value) <= HALF_BIN + 1e-12


def test_configurable_bins_and_range_keep_the_scheme():
    tokenizer = ActionTokenizer(ActionTokenizerConfig(vocab_end=1000, num_bins=64))
    assert (tokenizer.token_start, tokenizer.token_end) == (936, 1000)
    assert tokenizer.encode([-1.0, 1.0]).tolist() == [999, 936]
    assert len(set(tokenizer.decode(np.arange(936, 1000)).tolist())) == 63


def test_decoding_a_non_action_token_names_it():
    with pytest.raises(ValueError, match='token id 31743 is not an action token'):
        OPENVLA.decode([31800, 31743])


def test_nan_actions_are_rejected():
    with pytest.raises(ValueError, match='NaN'):
        OPENVLA.encode([0.1, float('nan')])


def test_bad_tokenizer_configs_are_rejected():
    with pytest.raises(ValueError, match='leaves no room'):
        ActionTokenizerConfig(vocab_end=100, num_bins=256)
    with pytest.raises(ValueError, match='num_bins'):
        ActionTokenizerConfig(vocab_end=100, num_bins=1)


STATS = ActionStatistics(
    q01=np.array([-0.2, 0.0, 1.0]), q99=np.array([0.2, 4.0, 3.0]), mask=np.array([1, 1, 0], bool)
)


def test_unnormalize_maps_minus_one_to_q01_and_plus_one_to_q99():
    out = STATS.unnormalize(np.array([[-1.0, -1.0, -1.0], [1.0, 1.0, 1.0], [0.0, 0.0, 0.5]]))
    assert out.tolist() == [[-0.2, 0.0, -1.0], [0.2, 4.0, 1.0], [0.0, 2.0, 0.5]]


def test_masked_dimensions_pass_through_still_normalized():
    assert STATS.unnormalize(np.array([0.3, 0.3, 0.3]))[2] == 0.3


def test_chunk_decoder_reads_tokens_time_major_into_h_by_d():
    decoder = ActionChunkDecoder(tokenizer=OPENVLA, statistics=STATS, horizon=2)
    tokens = OPENVLA.encode([-1.0, 1.0, 0.0, 1.0, -1.0, 0.0])
    actions = decoder.decode(tokens)
    assert actions.shape == (2, 3)
    expected = STATS.unnormalize(OPENVLA.decode(tokens).reshape(2, 3))
    assert np.array_equal(actions, expected)
    assert actions[0, 0] == pytest.approx(-0.2 + 0.2 * HALF_BIN, abs=1e-12)


def test_chunk_decoder_round_trips_actions_within_a_bin():
    decoder = ActionChunkDecoder(tokenizer=OPENVLA, statistics=STATS, horizon=2)
    actions = np.array([[0.1, 1.0, 0.25], [-0.15, 3.5, -0.5]])
    back = decoder.decode(decoder.encode(actions))
    span = np.where(STATS.mask, STATS.q99 - STATS.q01, 2.0)
    assert np.all(np.abs(back - actions) <= span * HALF_BIN + 1e-9)


def _openvla_predict_action_values(token_ids: np.ndarray) -> np.ndarray:
    """OpenVLA's predict_action, written out: vocab_size = 32064 - 64, then
    clip(vocab_size - id - 1, 0, 254) indexes the 255 centres of 256 edges on [-1, 1]."""
    edges = np.linspace(-1, 1, 256)
    centers = (edges[:-1] + edges[1:]) / 2.0
    vocab_size = 32064 - 64
    return centers[np.clip(vocab_size - token_ids - 1, a_min=0, a_max=centers.shape[0] - 1)]


def test_clipping_decode_equals_openvla_on_every_id_around_the_action_range():
    ids = np.arange(31700, 32065)
    assert np.array_equal(OPENVLA.decode_clipped(ids), _openvla_predict_action_values(ids))
    assert OPENVLA.decode_clipped([32063])[0] == OPENVLA.bin_centers[0]  # above: first bin
    assert OPENVLA.decode_clipped([0])[0] == OPENVLA.bin_centers[-1]  # below: last bin


def test_clipping_decode_equals_the_strict_one_inside_the_range():
    ids = np.arange(31744, 32000)
    assert np.array_equal(OPENVLA.decode_clipped(ids), OPENVLA.decode(ids))


def test_chunk_decoder_clips_any_id_only_when_asked():
    decoder = ActionChunkDecoder(tokenizer=OPENVLA, statistics=STATS, horizon=2)
    tokens = [32010, 31000, 31800, 2, 32000, 31999]
    clipped = decoder.decode(tokens, clip_to_bins=True)
    expected = STATS.unnormalize(_openvla_predict_action_values(np.array(tokens)).reshape(2, 3))
    assert np.array_equal(clipped, expected)
    with pytest.raises(ValueError, match='token id 32010 is not an action token'):
        decoder.decode(tokens)


def test_chunk_decoder_rejects_the_wrong_token_count():
    decoder = ActionChunkDecoder(tokenizer=OPENVLA, statistics=STATS, horizon=2)
    with pytest.raises(ValueError, match='needs 6 tokens'):
        decoder.decode([31800] * 5)


def test_statistics_load_from_openvla_json(tmp_path):
    path = tmp_path / 'dataset_statistics.json'
    entry = {'action': {'q01': [0.0, 1.0], 'q99': [1.0, 2.0]}, 'proprio': {}}
    path.write_text(json.dumps({'bridge_orig': entry, 'other': entry}))
    stats = load_action_statistics(path)
    assert sorted(stats) == ['bridge_orig', 'other']
    assert stats['bridge_orig'].mask.tolist() == [True, True]  # no mask: all un-normalized
    with pytest.raises(ActionStatisticsError, match='pass an unnorm_key'):
        select_statistics(stats, None)
    assert select_statistics(stats, 'other').action_dim == 2


def test_missing_or_malformed_statistics_raise_clear_errors(tmp_path):
    with pytest.raises(ActionStatisticsError, match='missing action statistics file'):
        load_action_statistics(tmp_path / 'dataset_statistics.json')
    with pytest.raises(ActionStatisticsError, match='lack'):
        load_action_statistics({'d': {'action': {'q01': [0.0]}}})
    with pytest.raises(ActionStatisticsError, match="no dataset 'x'"):
        load_action_statistics({'d': {'action': {'q01': [0.0], 'q99': [1.0]}}}, unnorm_key='x')
    with pytest.raises(ActionStatisticsError, match='mask must be a vector of'):
        load_action_statistics(
            {'d': {'action': {'q01': [0.0], 'q99': [1.0], 'mask': [True, True]}}}
        )
