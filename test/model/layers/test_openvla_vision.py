"""OpenVLA's vision path: transformers towers loaded from timm names equal a plain-torch timm
reference; six-channel preprocessing; refusal of bad tower tensors."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from timm_vit_reference import (
    reference_image_embeddings,
    reference_patch_features,
    reference_projector,
)

from vla_sched.model.config.action_space import ActionTokenizerConfig, load_action_statistics
from vla_sched.model.config.architecture import DecoderSpec
from vla_sched.model.config.checkpoint_spec import (
    CheckpointError,
    CheckpointSpec,
    ImagePreprocessing,
    PromptTemplate,
)
from vla_sched.model.config.openvla_towers import OpenVLAVisionSpec, openvla_vision_spec
from vla_sched.model.layers.vision import preprocess_image
from vla_sched.model.loading.checkpoint import load_checkpoint
from vla_sched.model.loading.openvla_weights import hf_tower_state, match_module_names
from vla_sched.model.loading.vla_model import assemble_openvla_vision
from vla_sched.model.loading.weights import canonical_name, decoder_shapes, split_names

DINO_ID = 'vit_large_patch14_reg4_dinov2.lvd142m'
SIGLIP_ID = 'vit_so400m_patch14_siglip_224'
DINO_ARGS = {'embed_dim': 48, 'depth': 3, 'num_heads': 3}
SIGLIP_ARGS = {'embed_dim': 40, 'depth': 3, 'num_heads': 2, 'mlp_ratio': 3.0}
TEXT_HIDDEN = 64
FEATURIZER, FUSED = 'vision_backbone.featurizer.', 'vision_backbone.fused_featurizer.'
TOWER_PREFIXES = (FEATURIZER, FUSED)
RTOL, ATOL = 1e-4, 1e-5


def vision_spec(*towers: str) -> OpenVLAVisionSpec:
    args = {DINO_ID: DINO_ARGS, SIGLIP_ID: SIGLIP_ARGS}
    config = {'timm_model_ids': list(towers), 'timm_model_args': [args[t] for t in towers]}
    return openvla_vision_spec(config, text_hidden_size=TEXT_HIDDEN)


def timm_tower_tensors(kind: str, gen: torch.Generator, *, attn_pool: bool = False) -> dict:
    """A random timm ``VisionTransformer`` state dict with OpenVLA's names (tiny widths)."""
    dim, depth, inner = (48, 3, 192) if kind == 'dinov2_reg' else (40, 3, 120)
    patches, patch = 256, 14

    def rand(*shape, scale=1.0, offset=0.0):
        return torch.randn(*shape, generator=gen) * scale + offset

    sd = {
        'pos_embed': rand(1, patches, dim, scale=0.5),
        'patch_embed.proj.weight': rand(dim, 3, patch, patch, scale=(3 * patch * patch) ** -0.5),
        'patch_embed.proj.bias': rand(dim, scale=0.1),
        'norm.weight': rand(dim, scale=0.1, offset=1.0),
        'norm.bias': rand(dim, scale=0.1),
    }
    if kind == 'dinov2_reg':
        sd['cls_token'] = rand(1, 1, dim)
        sd['reg_token'] = rand(1, 4, dim)
    for i in range(depth):
        p = f'blocks.{i}.'
        for norm in ('norm1', 'norm2'):
            sd[f'{p}{norm}.weight'] = rand(dim, scale=0.1, offset=1.0)
            sd[f'{p}{norm}.bias'] = rand(dim, scale=0.1)
        for name, (w_out, w_in) in {
            'attn.qkv': (3 * dim, dim),
            'attn.proj': (dim, dim),
            'mlp.fc1': (inner, dim),
            'mlp.fc2': (dim, inner),
        }.items():
            sd[f'{p}{name}.weight'] = rand(w_out, w_in, scale=w_in**-0.5)
            sd[f'{p}{name}.bias'] = rand(w_out, scale=0.1)
        if kind == 'dinov2_reg':
            sd[f'{p}ls1.scale_factor'] = rand(dim, scale=0.3, offset=1.0)
            sd[f'{p}ls2.scale_factor'] = rand(dim, scale=0.3, offset=1.0)
    if attn_pool:
        sd['attn_pool.latent'] = rand(1, 1, dim)
        sd['attn_pool.q.weight'] = rand(dim, dim)
        sd['attn_pool.kv.weight'] = rand(2 * dim, dim)
        sd['attn_pool.mlp.fc1.weight'] = rand(inner, dim)
    return sd


def vision_tensors(spec: OpenVLAVisionSpec, seed: int = 0, *, attn_pool: bool = False) -> dict:
    """Random tower and projector tensors under OpenVLA's checkpoint names."""
    gen = torch.Generator().manual_seed(seed)
    tensors = {}
    for prefix, tower in zip(TOWER_PREFIXES, spec.towers, strict=False):
        pool = attn_pool and tower.kind == 'siglip'
        for name, t in timm_tower_tensors(tower.kind, gen, attn_pool=pool).items():
            tensors[prefix + name] = t
    f, h = spec.feature_dim, TEXT_HIDDEN
    widths = [(f, 4 * f), (4 * f, h), (h, h)] if spec.fused else [(f, h), (h, h)]
    for i, (w_in, w_out) in enumerate(widths, start=1):
        tensors[f'projector.fc{i}.weight'] = torch.randn(w_out, w_in, generator=gen) * w_in**-0.5
        tensors[f'projector.fc{i}.bias'] = torch.randn(w_out, generator=gen) * 0.1
    return tensors


def load_vision(spec: OpenVLAVisionSpec, tensors: dict):
    return assemble_openvla_vision(
        spec,
        list(tensors),
        shape_of=lambda name: tuple(tensors[name].shape),
        read=tensors.__getitem__,
    )


def random_pixels(n: int, channels: int, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, channels, 224, 224, generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope='module')
def fused_spec():
    return vision_spec(DINO_ID, SIGLIP_ID)


@pytest.fixture(scope='module')
def fused_tensors(fused_spec):
    return vision_tensors(fused_spec)


@pytest.fixture(scope='module')
def fused_encoder(fused_spec, fused_tensors):
    return load_vision(fused_spec, fused_tensors)


@pytest.mark.parametrize('tower_id', [DINO_ID, SIGLIP_ID])
def test_each_tower_gives_the_timm_second_to_last_block_patch_features(tower_id):
    spec = vision_spec(tower_id)
    tensors = vision_tensors(spec, seed=3)
    encoder = load_vision(spec, tensors)
    pixels = random_pixels(2, 3)
    ours = encoder.patch_features(pixels)
    ref = reference_patch_features(tensors, spec.towers[0], pixels, prefix=TOWER_PREFIXES[0])
    assert ours.shape == ref.shape == (2, 256, spec.towers[0].embed_dim)
    torch.testing.assert_close(ours, ref, rtol=RTOL, atol=ATOL)
    embeddings = encoder(pixels)
    torch.testing.assert_close(
        embeddings, reference_projector(tensors, ref, fused=False, prefix='projector.'),
        rtol=RTOL, atol=ATOL,
    )  # fmt: skip


def test_fused_backbone_and_projector_equal_the_reference(
    fused_spec, fused_tensors, fused_encoder
):
    pixels = random_pixels(3, 6)
    ours = fused_encoder(pixels)
    ref = reference_image_embeddings(fused_tensors, fused_spec.towers, pixels)
    assert ours.shape == (3, 256, TEXT_HIDDEN)
    torch.testing.assert_close(ours, ref, rtol=RTOL, atol=ATOL)


def test_fused_features_concatenate_dinov2_then_siglip(fused_spec, fused_tensors, fused_encoder):
    pixels = random_pixels(1, 6, seed=5)
    features = fused_encoder.patch_features(pixels)
    dino = reference_patch_features(
        fused_tensors, fused_spec.towers[0], pixels[:, :3], prefix=TOWER_PREFIXES[0]
    )
    siglip = reference_patch_features(
        fused_tensors, fused_spec.towers[1], pixels[:, 3:], prefix=TOWER_PREFIXES[1]
    )
    assert features.shape == (1, 256, 48 + 40)
    torch.testing.assert_close(features[..., :48], dino, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(features[..., 48:], siglip, rtol=RTOL, atol=ATOL)


def test_a_batch_of_images_encodes_like_each_image_alone(fused_encoder):
    pixels = random_pixels(3, 6, seed=7)
    batched = fused_encoder(pixels)
    for i in range(3):
        torch.testing.assert_close(
            batched[i], fused_encoder(pixels[i : i + 1])[0], rtol=RTOL, atol=ATOL
        )


def test_three_channel_pixels_are_refused_by_the_fused_backbone(fused_encoder):
    with pytest.raises(ValueError, match=r'pixel_values must be \[N, 6, 224, 224\]'):
        fused_encoder(random_pixels(1, 3))


def test_siglip_pooling_head_is_ignored(fused_spec, fused_tensors, fused_encoder):
    pool = vision_tensors(fused_spec, attn_pool=True)
    pool = {n: t for n, t in pool.items() if 'attn_pool' in n}
    assert pool and all(n.startswith(FUSED + 'attn_pool.') for n in pool)
    with_pool = {**fused_tensors, **pool}
    encoder = load_vision(fused_spec, with_pool)
    pixels = random_pixels(1, 6, seed=9)
    torch.testing.assert_close(encoder(pixels), fused_encoder(pixels), rtol=0, atol=0)


def test_split_names_sorts_openvla_tensors_into_projector_and_towers(fused_tensors):
    names = [*fused_tensors, 'language_model.model.norm.weight', 'language_model.lm_head.weight']
    parts = split_names(canonical_name(n) for n in names)
    assert not parts['unknown']
    assert set(parts['projector']) == {f'fc{i}.{k}' for i in (1, 2, 3) for k in ('weight', 'bias')}
    assert 'featurizer.blocks.0.attn.qkv.weight' in parts['tower']
    assert 'fused_featurizer.pos_embed' in parts['tower']
    assert set(parts['decoder']) == {'norm.weight', 'lm_head.weight'}


@pytest.mark.parametrize(
    ('name', 'shape', 'message'),
    [
        (
            FEATURIZER + 'blocks.1.ls2.scale_factor',
            None,
            r'vision_backbone\.featurizer\.\*: checkpoint lacks 1 tensors, e\.g\. '
            r"\['blocks\.1\.ls2\.scale_factor'\]",
        ),
        (
            FEATURIZER + 'blocks.3.norm1.weight',
            (48,),
            r'tensors the config does not describe, e\.g\. '
            r"\['vision_backbone\.featurizer\.blocks\.3\.norm1\.weight'\]",
        ),
        (
            FEATURIZER + 'attn_pool.latent',
            (1, 1, 48),
            r"\['vision_backbone\.featurizer\.attn_pool\.latent'\]",
        ),
        (
            FUSED + 'pos_embed',
            (1, 255, 40),
            r'shape mismatch for vision_backbone\.fused_featurizer\.pos_embed: checkpoint has '
            r'\(1, 255, 40\), config\.json implies \(1, 256, 40\)',
        ),
        (
            FEATURIZER + 'blocks.0.attn.qkv.weight',
            (48, 48),
            r'shape mismatch for vision_backbone\.featurizer\.blocks\.0\.attn\.qkv\.weight',
        ),
        (
            'vision_backbone.third_featurizer.pos_embed',
            (1,),
            r"outside the 2 towers .*\['vision_backbone\.third_featurizer\.pos_embed'\]",
        ),
        (
            'projector.fc3.bias',
            None,
            r"projector: checkpoint lacks 1 tensors, e\.g\. \['fc3\.bias'\]",
        ),
    ],
    ids=['missing', 'extra-block', 'dinov2-pool', 'pos-shape', 'qkv-shape', 'third-tower', 'fc3'],
)
def test_bad_tower_tensors_are_refused_by_name(fused_spec, fused_tensors, name, shape, message):
    """``shape`` None removes the tensor; otherwise the tensor is added or replaced."""
    tensors = dict(fused_tensors)
    if shape is None:
        del tensors[name]
    else:
        tensors[name] = torch.ones(shape)
    with pytest.raises(CheckpointError, match=message):
        load_vision(fused_spec, tensors)


def test_single_siglip_backbone_refuses_fused_tower_tensors():
    spec = vision_spec(SIGLIP_ID)
    tensors = vision_tensors(spec)
    tensors['vision_backbone.fused_featurizer.pos_embed'] = torch.ones(1, 256, 40)
    with pytest.raises(CheckpointError, match=r'outside the 1 towers'):
        load_vision(spec, tensors)


# --- preprocessing -----------------------------------------------------------------------

DINO_MEAN, DINO_STD = (0.485, 0.456, 0.406), (0.229, 0.224, 0.225)
SIGLIP_MEAN, SIGLIP_STD = (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)
FUSED_PREP = ImagePreprocessing(
    image_size=224, mean=DINO_MEAN + SIGLIP_MEAN, std=DINO_STD + SIGLIP_STD
)


def smooth_image(height: int, width: int) -> np.ndarray:
    rows, cols = np.mgrid[0:height, 0:width]
    channels = [127 + 120 * np.sin(cols / 9 + c) * np.cos(rows / 6) for c in range(3)]
    return np.stack(channels, axis=-1).astype(np.uint8)


@pytest.mark.parametrize('shape', [(480, 640), (224, 224), (120, 160)])
def test_six_channels_are_a_pil_bicubic_resize_normalized_twice(shape):
    image_module = pytest.importorskip('PIL.Image')
    frame = smooth_image(*shape)
    resized = image_module.fromarray(frame).resize((224, 224), image_module.Resampling.BICUBIC)
    expected = torch.from_numpy(np.asarray(resized).copy()).permute(2, 0, 1).float() / 255.0
    pixels = preprocess_image(frame, FUSED_PREP)
    assert pixels.shape == (6, 224, 224) and pixels.dtype == torch.float32
    for group, (mean, std) in enumerate([(DINO_MEAN, DINO_STD), (SIGLIP_MEAN, SIGLIP_STD)]):
        channels = pixels[3 * group : 3 * group + 3]
        restored = channels * torch.tensor(std)[:, None, None] + torch.tensor(mean)[:, None, None]
        assert float((restored - expected).abs().max()) <= 1.0 / 255.0 + 1e-6


def test_each_channel_group_is_the_same_image_with_its_own_normalization():
    frame = smooth_image(100, 150)
    pixels = preprocess_image(frame, FUSED_PREP)
    dino = (
        pixels[:3] * torch.tensor(DINO_STD)[:, None, None] + torch.tensor(DINO_MEAN)[:, None, None]
    )
    siglip = pixels[3:] * 0.5 + 0.5
    torch.testing.assert_close(dino, siglip, rtol=0, atol=1e-6)
    single = preprocess_image(frame, ImagePreprocessing(224, DINO_MEAN, DINO_STD))
    torch.testing.assert_close(pixels[:3], single, rtol=0, atol=0)


# --- loading a folder ----------------------------------------------------------------------

TEXT_CONFIG = {
    'model_type': 'llama', 'vocab_size': 320, 'hidden_size': TEXT_HIDDEN,
    'intermediate_size': 128, 'num_hidden_layers': 1, 'num_attention_heads': 4,
    'num_key_value_heads': 4,
}  # fmt: skip


def openvla_spec(vision: OpenVLAVisionSpec) -> CheckpointSpec:
    statistics = {'bridge_orig': {'action': {'q01': [-1.0] * 7, 'q99': [1.0] * 7}}}
    return CheckpointSpec(
        decoder=DecoderSpec.from_hf_config(TEXT_CONFIG),
        vision=vision,
        image_token_id=256,
        preprocessing=FUSED_PREP,
        action_tokens=ActionTokenizerConfig(vocab_end=256),
        action_horizon=1,
        action_statistics=load_action_statistics(statistics),
        prompt=PromptTemplate(),
    )


def write_sharded_folder(folder, tensors: dict, num_shards: int) -> None:
    from safetensors.torch import save_file

    names = sorted(tensors)
    weight_map = {}
    for shard in range(num_shards):
        file = f'model-{shard + 1:05d}-of-{num_shards:05d}.safetensors'
        part = {n: tensors[n].contiguous() for n in names[shard::num_shards]}
        save_file(part, str(folder / file))
        weight_map.update(dict.fromkeys(part, file))
    (folder / 'model.safetensors.index.json').write_text(json.dumps({'weight_map': weight_map}))


def test_sharded_openvla_folder_loads_decoder_and_vision(tmp_path, fused_spec, fused_tensors):
    spec = openvla_spec(fused_spec)
    gen = torch.Generator().manual_seed(11)
    tensors = {
        'vision_backbone.fused_featurizer.attn_pool.latent': torch.zeros(1, 1, 40),
        **fused_tensors,
    }
    for name, shape in decoder_shapes(spec.decoder).items():
        stored = 'language_model.' if name == 'lm_head.weight' else 'language_model.model.'
        tensors[stored + name] = torch.randn(*shape, generator=gen) * 0.1
    write_sharded_folder(tmp_path, tensors, num_shards=2)
    model = load_checkpoint(tmp_path, spec=spec)
    pixels = random_pixels(2, 6, seed=13)
    ref = reference_image_embeddings(fused_tensors, fused_spec.towers, pixels)
    torch.testing.assert_close(model.encode_images(pixels), ref, rtol=RTOL, atol=ATOL)
    torch.testing.assert_close(
        model.decoder.embed(torch.tensor([3])),
        tensors['language_model.model.embed_tokens.weight'][3:4],
        rtol=0, atol=0,
    )  # fmt: skip


# --- names of older transformers releases --------------------------------------------------

LEGACY = {
    '.attention.q_proj.': '.attention.attention.query.',
    '.attention.k_proj.': '.attention.attention.key.',
    '.attention.v_proj.': '.attention.attention.value.',
    '.attention.o_proj.': '.attention.output.dense.',
}


def legacy_spelling(name: str) -> str:
    for new, old in LEGACY.items():
        name = name.replace(new, old)
    return name


def test_older_transformers_tower_names_are_matched(fused_spec, fused_tensors):
    dino, siglip = fused_spec.towers
    timm = [
        {n[len(p) :]: t for n, t in fused_tensors.items() if n.startswith(p)}
        for p in TOWER_PREFIXES
    ]
    dino_state = hf_tower_state(dino, timm[0])
    legacy = {legacy_spelling(n) for n in dino_state} - {'embeddings.mask_token'}
    matched = match_module_names(dino_state, legacy)
    assert set(matched) == legacy
    assert 'encoder.layer.0.attention.attention.query.weight' in matched
    siglip_state = hf_tower_state(siglip, timm[1])
    wrapped = {'vision_model.' + n for n in siglip_state}
    assert set(match_module_names(siglip_state, wrapped)) == wrapped


def test_an_unknown_transformers_layout_is_reported(fused_spec, fused_tensors):
    timm = {n[len(FUSED) :]: t for n, t in fused_tensors.items() if n.startswith(FUSED)}
    state = hf_tower_state(fused_spec.towers[1], timm)
    renamed = {n.replace('self_attn.', 'attn.') for n in state}
    with pytest.raises(RuntimeError, match=r'installed transformers tower has no tensor for'):
        match_module_names(state, renamed)
