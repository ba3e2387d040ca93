"""The pi0 / pi0.5 reference itself: what LeRobot's computation says, checked piece by piece.

The folders are the tiny writer's (``write_pi0_checkpoint``, float32 weights); tests that need
particular weights build the reference from ``pi0_random_weights`` with some tensors replaced.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import numpy as np
import pytest
import torch
from pi0_reference import (
    EXPERT,
    MASK_VALUE,
    TIED_EMBEDDING,
    FlowSettings,
    ReferencePi0,
    ada_rms_norm,
    additive,
    gemma_config,
    rms_normalize,
)
from torch.nn import functional as F

from vla_sched.model.families.pi0.checkpoint import TINY_PI0_SIZES, read_pi0_spec
from vla_sched.testing.pi0_writer import pi0_random_weights, write_pi0_checkpoint

TOLERANCE = 1e-5
MUTATION_EFFECT = 1e-4
SIZES = TINY_PI0_SIZES
SETTINGS = FlowSettings(
    chunk_size=4,
    max_state_dim=32,
    max_action_dim=32,
    num_inference_steps=3,
    min_period=4e-3,
    max_period=4.0,
)
NUM_IMAGE_TOKENS = SIZES.vision.num_patches
HEAD_DIM = SIZES.paligemma.head_dim
STATE_DIM = 8  # padded to max_state_dim by the reference


def tiny_tensors(policy_type: str, seed: int = 0) -> dict[str, torch.Tensor]:
    return pi0_random_weights(
        policy_type,
        SIZES,
        max_state_dim=SETTINGS.max_state_dim,
        max_action_dim=SETTINGS.max_action_dim,
        seed=seed,
        weights_dtype='float32',
    )


def build(policy_type: str, tensors: dict[str, torch.Tensor]) -> ReferencePi0:
    return ReferencePi0(tensors, policy_type=policy_type, sizes=SIZES, settings=SETTINGS)


class Inputs(NamedTuple):
    pixels: list[torch.Tensor]
    lang_ids: torch.Tensor
    lang_valid: torch.Tensor
    state: torch.Tensor
    noise: torch.Tensor


def make_inputs(seed: int, *, valid_lens=(5, 3), lang_len: int = 7) -> Inputs:
    """Two cameras, right-padded language of ``valid_lens`` tokens in ``lang_len`` slots."""
    g = torch.Generator().manual_seed(seed)
    batch, size = len(valid_lens), SIZES.vision.image_size
    pixels = [torch.rand(batch, 3, size, size, generator=g) * 2 - 1 for _ in range(2)]
    lang_valid = torch.arange(lang_len)[None] < torch.tensor(valid_lens)[:, None]
    lang_ids = torch.randint(1, SIZES.vocab_size, (batch, lang_len), generator=g) * lang_valid
    state = torch.randn(batch, STATE_DIM, generator=g)
    noise = torch.randn(batch, SETTINGS.chunk_size, SETTINGS.max_action_dim, generator=g)
    return Inputs(pixels, lang_ids, lang_valid, state, noise)


def run(ref: ReferencePi0, inputs: Inputs, *, num_steps: int = 3):
    return ref.sample_actions(
        pixels=inputs.pixels,
        lang_ids=inputs.lang_ids,
        lang_valid=inputs.lang_valid,
        state=inputs.state,
        noise=inputs.noise,
        num_steps=num_steps,
    )


def prefix_of(ref: ReferencePi0, inputs: Inputs, **kwargs):
    return ref.prefix(
        pixels=inputs.pixels, lang_ids=inputs.lang_ids, lang_valid=inputs.lang_valid, **kwargs
    )


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    assert a.shape == b.shape
    return float((a - b).abs().max())


@pytest.fixture(scope='module')
def refs(tmp_path_factory) -> dict[str, ReferencePi0]:
    made = {}
    for kind in ('pi0', 'pi05'):
        folder = write_pi0_checkpoint(
            tmp_path_factory.mktemp(kind),
            policy_type=kind,
            seed=1,
            chunk_size=SETTINGS.chunk_size,
            n_action_steps=SETTINGS.chunk_size,
            num_inference_steps=SETTINGS.num_inference_steps,
            weights_dtype='float32',
        )
        made[kind] = ReferencePi0.from_folder(folder, sizes=read_pi0_spec(folder))
    return made


BOTH = pytest.mark.parametrize('kind', ['pi0', 'pi05'])


# -- loading ----------------------------------------------------------------------------------


@BOTH
def test_folder_settings_and_sizes_are_read(refs, kind):
    ref = refs[kind]
    assert ref.policy_type == kind
    assert ref.settings == SETTINGS
    assert ref.expert_width == SIZES.expert.width
    assert len(ref.expert_layers) == len(ref.language_model.layers) == SIZES.paligemma.depth


@BOTH
def test_loading_uses_every_tensor_and_refuses_unknown_or_missing_ones(kind):
    tensors = tiny_tensors(kind)
    ref = build(kind, tensors)
    assert ref.policy_type == kind
    # the tied embedding is the file's lm_head
    assert torch.equal(ref.language_model.embed_tokens.weight, tensors[TIED_EMBEDDING])
    with pytest.raises(ValueError, match='does not use'):
        build(kind, {**tensors, 'model.unknown.weight': torch.zeros(1)})
    missing = dict(tensors)
    del missing[f'{EXPERT}layers.1.mlp.up_proj.weight']
    with pytest.raises(RuntimeError, match='up_proj'):
        build(kind, missing)
    other = 'pi05' if kind == 'pi0' else 'pi0'
    with pytest.raises((KeyError, RuntimeError)):
        build(other, tensors)  # the other type's heads and norms


# -- prefix -----------------------------------------------------------------------------------


def test_prefix_mask_is_bidirectional_over_valid_tokens_and_masks_padding(refs):
    inputs = make_inputs(0)
    prefix = prefix_of(refs['pi0'], inputs)
    length = 2 * NUM_IMAGE_TOKENS + 7
    assert prefix.mask.shape == (2, length, length)
    assert prefix.valid.sum(dim=1).tolist() == [2 * NUM_IMAGE_TOKENS + 5, 2 * NUM_IMAGE_TOKENS + 3]
    for b in range(2):
        valid = prefix.valid[b]
        assert torch.equal(prefix.mask[b], valid[:, None] & valid[None, :])
    first, last_word = 0, 2 * NUM_IMAGE_TOKENS + 4
    assert prefix.mask[0, first, last_word] and prefix.mask[0, last_word, first]
    assert not prefix.mask[1, :, 2 * NUM_IMAGE_TOKENS + 3 :].any()  # row 1's padding keys
    causal = prefix_of(refs['pi0'].mutated(causal_prefix=True), inputs)
    for b in range(2):
        valid = causal.valid[b]
        assert torch.equal(causal.mask[b], torch.tril(valid[:, None] & valid[None, :]))


def test_prefix_positions_are_cumsum_of_valid_minus_one(refs):
    inputs = make_inputs(0, valid_lens=(4,), lang_len=6)
    prefix = prefix_of(refs['pi0'], inputs, image_valid=[True, False])
    n = NUM_IMAGE_TOKENS
    expected = [*range(n), *[n - 1] * n, n, n + 1, n + 2, n + 3, n + 3, n + 3]
    assert prefix.positions[0].tolist() == expected
    assert prefix.valid[0].tolist() == [True] * n + [False] * n + [True] * 4 + [False] * 2
    assert prefix.keys[0].shape == (1, SIZES.paligemma.num_kv_heads, 2 * n + 6, HEAD_DIM)


def _rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE with theta 10000, written out: x [B, heads, L, D]."""
    half = x.shape[-1] // 2
    inv_freq = 10000.0 ** (-torch.arange(half, dtype=torch.float32) / half)
    angle = positions[:, None, :, None].float() * inv_freq
    x1, x2 = x[..., :half], x[..., half:]
    cos, sin = angle.cos(), angle.sin()
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def test_prefix_keeps_each_layers_keys_after_rope_and_values(refs):
    ref = refs['pi0']
    inputs = make_inputs(2)
    prefix = prefix_of(ref, inputs)
    layer = ref.language_model.layers[0]
    h = rms_normalize(prefix.embeddings) * (1 + layer.input_layernorm.weight)
    k = layer.self_attn.k_proj(h).view(2, -1, 1, HEAD_DIM).transpose(1, 2)
    v = layer.self_attn.v_proj(h).view(2, -1, 1, HEAD_DIM).transpose(1, 2)
    assert max_diff(prefix.keys[0], _rope(k, prefix.positions)) < TOLERANCE
    assert max_diff(prefix.values[0], v) < TOLERANCE
    assert len(prefix.keys) == SIZES.paligemma.depth


def test_language_embeddings_are_scaled_by_sqrt_width_and_images_are_not(refs):
    ref = refs['pi0']
    inputs = make_inputs(3)
    prefix = prefix_of(ref, inputs)
    table = ref.language_model.embed_tokens.weight
    n = 2 * NUM_IMAGE_TOKENS
    expected = F.embedding(inputs.lang_ids, table) * math.sqrt(SIZES.paligemma.width)
    assert max_diff(prefix.embeddings[:, n:], expected) < TOLERANCE
    assert (
        max_diff(prefix.embeddings[:, :NUM_IMAGE_TOKENS], ref.embed_image(inputs.pixels[0])) == 0
    )
    plain = prefix_of(ref.mutated(no_embedding_scale=True), inputs)
    assert max_diff(plain.embeddings[:, n:], F.embedding(inputs.lang_ids, table)) == 0


# -- suffix -----------------------------------------------------------------------------------


@BOTH
def test_suffix_positions_continue_from_the_count_of_valid_prefix_tokens(refs, kind):
    ref = refs[kind]
    inputs = make_inputs(0)
    prefix = prefix_of(ref, inputs)
    t = torch.ones(2)
    suffix = ref.embed_suffix(state=inputs.state, x_t=inputs.noise, t=t)
    num_suffix = SETTINGS.chunk_size + (kind == 'pi0')
    assert suffix.embeddings.shape == (2, num_suffix, SIZES.expert.width)
    mask, positions = ref.suffix_layout(prefix, suffix.autoregressive)
    counts = prefix.valid.sum(dim=1)
    assert counts.tolist() == [2 * NUM_IMAGE_TOKENS + 5, 2 * NUM_IMAGE_TOKENS + 3]
    assert torch.equal(positions, counts[:, None] + torch.arange(num_suffix))
    restarted = ref.mutated(suffix_positions_from_zero=True).suffix_layout(
        prefix, suffix.autoregressive
    )[1]
    assert torch.equal(restarted, torch.arange(num_suffix).expand(2, -1))
    # every suffix token sees exactly the valid prefix
    prefix_len = prefix.valid.shape[1]
    assert torch.equal(mask[:, :, :prefix_len], prefix.valid[:, None].expand(-1, num_suffix, -1))
    own = mask[0, :, prefix_len:]
    if kind == 'pi0':  # the state token sees itself only; actions see the state and each other
        assert own[0].tolist() == [True] + [False] * SETTINGS.chunk_size
        assert own[1:].all()
    else:
        assert own.all()


def test_time_embedding_is_sin_then_cos_over_geometric_periods_in_float64(refs):
    ref = refs['pi0']
    t = torch.tensor([1.0, 0.7, 0.1], dtype=torch.float32)
    half = SIZES.expert.width // 2
    period = 4e-3 * (4.0 / 4e-3) ** np.linspace(0.0, 1.0, half)
    angle = 2 * np.pi * t.double().numpy()[:, None] / period[None]
    expected = np.concatenate([np.sin(angle), np.cos(angle)], axis=1).astype(np.float32)
    got = ref.time_embedding(t)
    assert got.dtype == torch.float32
    np.testing.assert_allclose(got.numpy(), expected, rtol=0, atol=1e-6)


@BOTH
def test_suffix_tokens_are_lerobots_state_action_and_time_projections(refs, kind):
    """pi0: [state_proj(padded state), action_time_mlp_out(silu(action_time_mlp_in(
    [action_in_proj(x_t), time])))]; pi0.5: action_in_proj(x_t) and the time MLP's cond."""
    ref = refs[kind]
    inputs = make_inputs(5)
    t = torch.tensor([0.9, 0.2])
    suffix = ref.embed_suffix(state=inputs.state, x_t=inputs.noise, t=t)
    w = SIZES.expert.width
    heads = ref.heads
    time = ref.time_embedding(t)[:, None]
    actions = inputs.noise @ heads['action_in_proj'][0].T + heads['action_in_proj'][1]
    if kind == 'pi05':
        assert suffix.autoregressive == [1] + [0] * (SETTINGS.chunk_size - 1)
        assert max_diff(suffix.embeddings, actions) < TOLERANCE
        hidden = F.silu(time[:, 0] @ heads['time_mlp_in'][0].T + heads['time_mlp_in'][1])
        cond = F.silu(hidden @ heads['time_mlp_out'][0].T + heads['time_mlp_out'][1])
        assert max_diff(suffix.cond, cond) < TOLERANCE
        return
    assert suffix.cond is None
    assert suffix.autoregressive == [1, 1] + [0] * (SETTINGS.chunk_size - 1)
    padded = torch.cat([inputs.state, torch.zeros(2, SETTINGS.max_state_dim - STATE_DIM)], 1)
    state_token = padded @ heads['state_proj'][0].T + heads['state_proj'][1]
    assert max_diff(suffix.embeddings[:, 0], state_token) < TOLERANCE
    weight_in, bias_in = heads['action_time_mlp_in']  # [w, 2w]: action columns first
    hidden = F.silu(actions @ weight_in[:, :w].T + time @ weight_in[:, w:].T + bias_in)
    fused = hidden @ heads['action_time_mlp_out'][0].T + heads['action_time_mlp_out'][1]
    assert max_diff(suffix.embeddings[:, 1:], fused) < TOLERANCE


def _gemma_expert_over_cache(ref: ReferencePi0, prefix, suffix, norm_weights=None):
    """LeRobot's denoise_step path for a plain expert: transformers' GemmaModel over a cache
    holding the prefix K/V, the [suffix, prefix + suffix] mask made additive."""
    from transformers import DynamicCache, GemmaModel

    model = GemmaModel(gemma_config(SIZES.expert, vocab_size=1)).eval()
    state = {f'layers.{k}': v for k, v in ref.expert_layers.state_dict().items()}
    state['norm.weight'] = ref.expert_norm.weight
    state['embed_tokens.weight'] = torch.zeros(1, SIZES.expert.width)
    if norm_weights is not None:
        state |= norm_weights
    model.load_state_dict(state, strict=True)
    mask, positions = ref.suffix_layout(prefix, suffix.autoregressive)
    cache = DynamicCache(
        ddp_cache_data=[
            (k.clone(), v.clone()) for k, v in zip(prefix.keys, prefix.values, strict=True)
        ]
    )
    with torch.no_grad():
        out = model(
            inputs_embeds=suffix.embeddings,
            attention_mask=additive(mask),
            position_ids=positions,
            cache=cache,
            use_cache=False,
        )
    return out.last_hidden_state


def test_pi0_joint_attention_equals_transformers_gemma_over_the_prefix_cache(refs):
    ref = refs['pi0']
    inputs = make_inputs(4)
    prefix = prefix_of(ref, inputs)
    suffix = ref.embed_suffix(state=inputs.state, x_t=inputs.noise, t=torch.full((2,), 0.6))
    with torch.no_grad():
        ours = ref.run_expert(prefix, suffix)
    theirs = _gemma_expert_over_cache(ref, prefix, suffix)
    assert float(ours.std()) > 0.1
    assert max_diff(ours, theirs) < TOLERANCE


def test_pi05_constant_modulation_equals_plain_gemma_norms(refs):
    """Dense weights zero, bias (scale s, shift 0, gate 1): every adaptive norm is Gemma's
    RMSNorm with weight s and every residual ungated, so the expert is transformers' Gemma."""
    tensors = tiny_tensors('pi05', seed=5)
    generator = torch.Generator().manual_seed(6)
    width = SIZES.expert.width
    norm_weights = {}
    for name in [k for k in tensors if k.endswith('.dense.weight')]:
        scale = 0.3 * torch.randn(width, generator=generator)
        bias = torch.cat([scale, torch.zeros(width), torch.ones(width)])
        tensors[name] = torch.zeros_like(tensors[name])
        tensors[name.replace('.weight', '.bias')] = bias
        norm_weights[name.removeprefix(EXPERT).replace('.dense.weight', '.weight')] = scale
    ref = build('pi05', tensors)
    inputs = make_inputs(4)
    prefix = prefix_of(ref, inputs)
    suffix = ref.embed_suffix(state=None, x_t=inputs.noise, t=torch.full((2,), 0.3))
    with torch.no_grad():
        ours = ref.run_expert(prefix, suffix)
    theirs = _gemma_expert_over_cache(ref, prefix, suffix, norm_weights)
    assert max_diff(ours, theirs) < TOLERANCE


def test_pi05_zero_dense_gates_every_branch_off():
    """Dense weights and biases zero: scale = shift = gate = 0, so each layer adds nothing and
    v = action_out_proj(x_hat(action_in_proj(x_t))), whatever the prefix."""
    tensors = tiny_tensors('pi05', seed=7)
    for name in [k for k in tensors if '.dense.' in k]:
        tensors[name] = torch.zeros_like(tensors[name])
    ref = build('pi05', tensors)
    inputs = make_inputs(8)
    t = torch.full((2,), 0.5)
    v = ref.velocity(prefix_of(ref, inputs), state=None, x_t=inputs.noise, t=t)
    hidden = rms_normalize(F.linear(inputs.noise, *ref.heads['action_in_proj']))
    assert max_diff(v, F.linear(hidden, *ref.heads['action_out_proj'])) < TOLERANCE
    other = make_inputs(9)
    v_other = ref.velocity(prefix_of(ref, other), state=None, x_t=inputs.noise, t=t)
    assert max_diff(v, v_other) < TOLERANCE


def test_ada_rms_norm_shift_adds_and_gate_is_returned():
    g = torch.Generator().manual_seed(0)
    x, cond = torch.randn(2, 3, 4, generator=g), torch.randn(2, 5, generator=g)
    weight = torch.zeros(12, 5)
    bias = torch.arange(12, dtype=torch.float32) / 10
    y, gate = ada_rms_norm(x, (weight, bias), cond)
    scale, shift, expected_gate = bias[:4], bias[4:8], bias[8:]
    assert max_diff(y, rms_normalize(x) * (1 + scale) + shift) < 1e-6
    assert torch.equal(gate, expected_gate.expand(2, 1, 4))


@BOTH
def test_pi05_time_conditions_the_expert_and_pi0_the_action_tokens(refs, kind):
    ref = refs[kind]
    inputs = make_inputs(10)
    prefix = prefix_of(ref, inputs)
    v1 = ref.velocity(prefix, state=inputs.state, x_t=inputs.noise, t=torch.full((2,), 1.0))
    v2 = ref.velocity(prefix, state=inputs.state, x_t=inputs.noise, t=torch.full((2,), 0.5))
    assert max_diff(v1, v2) > MUTATION_EFFECT
    other_state = inputs.state + 1.0
    v3 = ref.velocity(prefix, state=other_state, x_t=inputs.noise, t=torch.full((2,), 1.0))
    assert (max_diff(v1, v3) > MUTATION_EFFECT) == (kind == 'pi0')  # pi0.5 has no state token


# -- sampling ---------------------------------------------------------------------------------


@BOTH
def test_more_language_padding_leaves_the_actions_unchanged(refs, kind):
    ref = refs[kind]
    short = make_inputs(11, lang_len=7)
    pad = torch.zeros(2, 5, dtype=short.lang_ids.dtype)
    long = short._replace(
        lang_ids=torch.cat([short.lang_ids, pad], dim=1),
        lang_valid=torch.cat([short.lang_valid, pad.bool()], dim=1),
    )
    actions, velocities = run(ref, short)
    padded, padded_velocities = run(ref, long)
    assert max_diff(actions, padded) < TOLERANCE
    for v, w in zip(velocities, padded_velocities, strict=True):
        assert max_diff(v, w) < TOLERANCE


@BOTH
def test_each_batch_row_equals_that_row_alone(refs, kind):
    ref = refs[kind]
    inputs = make_inputs(12, valid_lens=(6, 2))
    actions, _ = run(ref, inputs)
    for b in range(2):
        row = Inputs(
            [p[b : b + 1] for p in inputs.pixels],
            inputs.lang_ids[b : b + 1],
            inputs.lang_valid[b : b + 1],
            inputs.state[b : b + 1],
            inputs.noise[b : b + 1],
        )
        row_actions, _ = run(ref, row)
        assert max_diff(actions[b : b + 1], row_actions) < TOLERANCE


@BOTH
def test_same_noise_same_actions_other_noise_other_actions(refs, kind):
    ref = refs[kind]
    inputs = make_inputs(13)
    first, _ = run(ref, inputs)
    again, _ = run(ref, inputs)
    assert torch.equal(first, again)
    other, _ = run(ref, inputs._replace(noise=inputs.noise + 0.5))
    assert max_diff(first, other) > MUTATION_EFFECT


@BOTH
def test_one_step_gives_noise_minus_the_velocity_at_t_1(refs, kind):
    ref = refs[kind]
    inputs = make_inputs(14)
    actions, velocities = run(ref, inputs, num_steps=1)
    prefix = prefix_of(ref, inputs)
    v = ref.velocity(prefix, state=inputs.state, x_t=inputs.noise, t=torch.ones(2))
    assert len(velocities) == 1 and max_diff(velocities[0], v) == 0
    assert max_diff(actions, inputs.noise - v) == 0
    assert float(v.abs().max()) > 0.1


@BOTH
def test_euler_steps_run_from_t_1_down_by_one_over_steps(refs, kind):
    ref = refs[kind]
    inputs = make_inputs(15)
    steps = 4
    actions, velocities = run(ref, inputs, num_steps=steps)
    prefix = prefix_of(ref, inputs)
    x = inputs.noise
    for k, t in enumerate([1.0, 0.75, 0.5, 0.25]):
        v = ref.velocity(prefix, state=inputs.state, x_t=x, t=torch.full((2,), t))
        assert max_diff(v, velocities[k]) == 0
        x = x - v / steps
    assert max_diff(actions, x) < 1e-6
    assert actions.shape == (2, SETTINGS.chunk_size, SETTINGS.max_action_dim)


MUTATIONS = ['causal_prefix', 'suffix_positions_from_zero', 'no_embedding_scale', 'causal_actions']


@BOTH
@pytest.mark.parametrize('mutation', MUTATIONS)
def test_each_mutation_moves_the_actions(refs, kind, mutation):
    ref = refs[kind]
    inputs = make_inputs(16)
    actions, _ = run(ref, inputs)
    mutated, _ = run(ref.mutated(**{mutation: True}), inputs)
    assert max_diff(actions, mutated) > 10 * MUTATION_EFFECT
    assert ref.mutations == ref.mutated().mutations  # the original is untouched


def test_masked_scores_use_lerobots_finite_value():
    scores = additive(torch.tensor([[[True, False]]]))
    assert scores.shape == (1, 1, 1, 2) and scores.dtype == torch.float32
    assert float(scores[0, 0, 0, 0]) == 0.0
    assert float(scores[0, 0, 0, 1]) == float(np.float32(MASK_VALUE))
