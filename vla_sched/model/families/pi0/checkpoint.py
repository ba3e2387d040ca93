"""pi0 / pi0.5 checkpoints as LeRobot saves them: sizes, tensor names, and the folder's spec.

A folder holds ``config.json`` (``type`` ``pi0`` or ``pi05``), ``model.safetensors`` (keys
prefixed ``model.``, the tied token embedding stored once as ``paligemma.lm_head.weight``),
``policy_preprocessor.json`` / ``policy_postprocessor.json`` and the normalizer statistics file
each names in its ``state_file``. The config names its sizes only by variant
(``paligemma_variant`` / ``action_expert_variant``: ``gemma_2b``, ``gemma_300m``; the vision
tower is always SigLIP So400m/14). A folder of other sizes (a test folder) declares them in
``model_sizes.json`` beside ``config.json``::

    {"paligemma": {"width": 64, "depth": 2, "mlp_dim": 128, "num_heads": 4,
                   "num_kv_heads": 1, "head_dim": 16},
     "action_expert": {...same fields...},
     "vision": {"hidden_size": 32, "num_layers": 2, "intermediate_size": 64,
                "num_heads": 4, "patch_size": 14, "image_size": 56},
     "vocab_size": 512}

Whichever sizes are used are checked against the tensor shapes in the safetensors header.
This module reads JSON and the safetensors header only (no torch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.config.lerobot_policy import (
    ACTION_KEY,
    CONFIG_FILE,
    NORMALIZATION_STATS,
    POSTPROCESSOR_FILE,
    PREPROCESSOR_FILE,
    STATE_KEY,
    WEIGHTS_FILE,
    check_weight_shapes,
    feature_dim,
    normalization_mode,
    processor_step,
    read_json,
    read_safetensors_header,
    read_statistics,
    selected_statistics,
)

POLICY_TYPES = ('pi0', 'pi05')
PALIGEMMA = 'paligemma_with_expert.paligemma.'
VISION_PREFIX = PALIGEMMA + 'model.vision_tower.vision_model.'
PROJECTOR_PREFIX = PALIGEMMA + 'model.multi_modal_projector.linear.'
LANGUAGE_PREFIX = PALIGEMMA + 'model.language_model.'
EMBEDDING_NAME = PALIGEMMA + 'lm_head.weight'  # the tied token embedding, stored once
EXPERT_PREFIX = 'paligemma_with_expert.gemma_expert.model.'
EXPERT_HEAD_NAME = 'paligemma_with_expert.gemma_expert.lm_head.weight'  # stored, unused
# The matrices LeRobot casts to bfloat16 under dtype "bfloat16" (Gemma's and the expert's
# projections and the token embeddings); everything else (the SigLIP tower, the projector,
# every norm, the action/state/time projections) stays float32.
BF16_SUFFIXES = (
    'q_proj.weight',
    'k_proj.weight',
    'v_proj.weight',
    'o_proj.weight',
    'gate_proj.weight',
    'up_proj.weight',
    'down_proj.weight',
    'lm_head.weight',
)


@dataclass(frozen=True, slots=True)
class GemmaSize:
    """One Gemma stack's sizes (openpi's ``gemma.Config``)."""

    width: int
    depth: int
    mlp_dim: int
    num_heads: int
    num_kv_heads: int
    head_dim: int

    def __post_init__(self) -> None:
        _check_positive(self, 'GemmaSize')
        if self.num_heads % self.num_kv_heads:
            raise ValueError(
                f'GemmaSize num_heads {self.num_heads} is not a multiple of num_kv_heads '
                f'{self.num_kv_heads}'
            )


@dataclass(frozen=True, slots=True)
class SiglipSize:
    """The SigLIP vision tower's sizes; ``image_size`` is the square input side in pixels."""

    hidden_size: int
    num_layers: int
    intermediate_size: int
    num_heads: int
    patch_size: int
    image_size: int

    def __post_init__(self) -> None:
        _check_positive(self, 'SiglipSize')
        if self.image_size % self.patch_size:
            raise ValueError(
                f'SiglipSize image_size {self.image_size} is not a multiple of patch_size '
                f'{self.patch_size}'
            )
        if self.hidden_size % self.num_heads:
            raise ValueError(
                f'SiglipSize hidden_size {self.hidden_size} is not a multiple of num_heads '
                f'{self.num_heads}'
            )

    @property
    def num_patches(self) -> int:
        """Image tokens of one camera: ``(image_size / patch_size) ** 2``."""
        return (self.image_size // self.patch_size) ** 2


@dataclass(frozen=True, slots=True)
class Pi0Sizes:
    """Every size a pi folder's weights have; the expert shares depth, heads and head_dim."""

    paligemma: GemmaSize
    expert: GemmaSize
    vision: SiglipSize
    vocab_size: int

    def __post_init__(self) -> None:
        if isinstance(self.vocab_size, bool) or not isinstance(self.vocab_size, int):
            raise ValueError(f'Pi0Sizes vocab_size must be an integer, got {self.vocab_size!r}')
        if self.vocab_size < 3:
            raise ValueError(
                f'Pi0Sizes vocab_size must hold <pad> <eos> <bos>, got {self.vocab_size}'
            )
        for name in ('depth', 'num_heads', 'num_kv_heads', 'head_dim'):
            a, b = getattr(self.paligemma, name), getattr(self.expert, name)
            if a != b:
                raise ValueError(
                    f'the action expert must share {name} with PaliGemma (joint attention): '
                    f'{b} != {a}'
                )

    def with_image_size(self, image_size: int) -> Pi0Sizes:
        vision = SiglipSize(
            hidden_size=self.vision.hidden_size,
            num_layers=self.vision.num_layers,
            intermediate_size=self.vision.intermediate_size,
            num_heads=self.vision.num_heads,
            patch_size=self.vision.patch_size,
            image_size=image_size,
        )
        return Pi0Sizes(self.paligemma, self.expert, vision, self.vocab_size)


def _check_positive(sizes: Any, kind: str) -> None:
    for name in sizes.__slots__:
        value = getattr(sizes, name)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f'{kind} {name} must be a positive integer, got {value!r}')


# openpi's / LeRobot's variants (``get_gemma_config``) and the tower PaliGemma-3B uses.
GEMMA_VARIANTS: Mapping[str, GemmaSize] = {
    'gemma_2b': GemmaSize(
        width=2048, depth=18, mlp_dim=16384, num_heads=8, num_kv_heads=1, head_dim=256
    ),
    'gemma_300m': GemmaSize(
        width=1024, depth=18, mlp_dim=4096, num_heads=8, num_kv_heads=1, head_dim=256
    ),
}
SIGLIP_SO400M_224 = SiglipSize(
    hidden_size=1152, num_layers=27, intermediate_size=4304, num_heads=16, patch_size=14,
    image_size=224,
)  # fmt: skip
PALIGEMMA_VOCAB_SIZE = 257152
PI0_REAL_SIZES = Pi0Sizes(
    paligemma=GEMMA_VARIANTS['gemma_2b'],
    expert=GEMMA_VARIANTS['gemma_300m'],
    vision=SIGLIP_SO400M_224,
    vocab_size=PALIGEMMA_VOCAB_SIZE,
)
# Tiny sizes for test folders: image 56 -> 16 patches of 14 pixels.
TINY_PI0_SIZES = Pi0Sizes(
    paligemma=GemmaSize(width=64, depth=2, mlp_dim=128, num_heads=4, num_kv_heads=1, head_dim=16),
    expert=GemmaSize(width=32, depth=2, mlp_dim=64, num_heads=4, num_kv_heads=1, head_dim=16),
    vision=SiglipSize(
        hidden_size=32, num_layers=2, intermediate_size=64, num_heads=4, patch_size=14,
        image_size=56,
    ),
    vocab_size=512,
)  # fmt: skip


def linear_shapes(name: str, n_out: int, n_in: int, *, bias: bool) -> dict[str, tuple[int, ...]]:
    shapes: dict[str, tuple[int, ...]] = {f'{name}.weight': (n_out, n_in)}
    if bias:
        shapes[f'{name}.bias'] = (n_out,)
    return shapes


def siglip_shapes(v: SiglipSize) -> dict[str, tuple[int, ...]]:
    """transformers' ``SiglipVisionModel`` names (no pooling head, as PaliGemma's)."""
    h, p = v.hidden_size, v.patch_size
    shapes: dict[str, tuple[int, ...]] = {
        'embeddings.patch_embedding.weight': (h, 3, p, p),
        'embeddings.patch_embedding.bias': (h,),
        'embeddings.position_embedding.weight': (v.num_patches, h),
    }
    for i in range(v.num_layers):
        layer = f'encoder.layers.{i}.'
        for norm in ('layer_norm1', 'layer_norm2'):
            shapes.update({f'{layer}{norm}.weight': (h,), f'{layer}{norm}.bias': (h,)})
        for proj in ('q_proj', 'k_proj', 'v_proj', 'out_proj'):
            shapes.update(linear_shapes(f'{layer}self_attn.{proj}', h, h, bias=True))
        shapes.update(linear_shapes(f'{layer}mlp.fc1', v.intermediate_size, h, bias=True))
        shapes.update(linear_shapes(f'{layer}mlp.fc2', h, v.intermediate_size, bias=True))
    shapes.update({'post_layernorm.weight': (h,), 'post_layernorm.bias': (h,)})
    return shapes


def norm_shapes(name: str, width: int, *, adaptive: bool) -> dict[str, tuple[int, ...]]:
    """A Gemma RMSNorm's weight, or pi0.5's adaptive norm ``dense`` (scale, shift, gate)."""
    if adaptive:
        return {f'{name}.dense.weight': (3 * width, width), f'{name}.dense.bias': (3 * width,)}
    return {f'{name}.weight': (width,)}


def gemma_shapes(g: GemmaSize, *, adaptive: bool) -> dict[str, tuple[int, ...]]:
    """A Gemma decoder's layers and final norm (no embedding), as transformers names them."""
    w, q, kv = g.width, g.num_heads * g.head_dim, g.num_kv_heads * g.head_dim
    shapes: dict[str, tuple[int, ...]] = {}
    for i in range(g.depth):
        layer = f'layers.{i}.'
        shapes.update(norm_shapes(f'{layer}input_layernorm', w, adaptive=adaptive))
        shapes.update(linear_shapes(f'{layer}self_attn.q_proj', q, w, bias=False))
        shapes.update(linear_shapes(f'{layer}self_attn.k_proj', kv, w, bias=False))
        shapes.update(linear_shapes(f'{layer}self_attn.v_proj', kv, w, bias=False))
        shapes.update(linear_shapes(f'{layer}self_attn.o_proj', w, q, bias=False))
        shapes.update(norm_shapes(f'{layer}post_attention_layernorm', w, adaptive=adaptive))
        shapes.update(linear_shapes(f'{layer}mlp.gate_proj', g.mlp_dim, w, bias=False))
        shapes.update(linear_shapes(f'{layer}mlp.up_proj', g.mlp_dim, w, bias=False))
        shapes.update(linear_shapes(f'{layer}mlp.down_proj', w, g.mlp_dim, bias=False))
    shapes.update(norm_shapes('norm', w, adaptive=adaptive))
    return shapes


def pi0_weight_shapes(
    policy_type: str, sizes: Pi0Sizes, *, max_state_dim: int, max_action_dim: int
) -> dict[str, tuple[int, ...]]:
    """Every tensor of a pi0 / pi0.5 ``model.safetensors`` (names without the ``model.``
    prefix) and its shape.

    pi0 has ``state_proj`` and ``action_time_mlp_in/out`` (action and time concatenated);
    pi0.5 has ``time_mlp_in/out`` and adaptive expert norms (``*.dense``, [3w, w]).
    """
    if policy_type not in POLICY_TYPES:
        raise ValueError(f'policy type must be one of {POLICY_TYPES}, got {policy_type!r}')
    pi05 = policy_type == 'pi05'
    pg, ex = sizes.paligemma, sizes.expert
    shapes = {VISION_PREFIX + k: s for k, s in siglip_shapes(sizes.vision).items()}
    shapes.update(
        linear_shapes(PROJECTOR_PREFIX[:-1], pg.width, sizes.vision.hidden_size, bias=True)
    )
    shapes.update({LANGUAGE_PREFIX + k: s for k, s in gemma_shapes(pg, adaptive=False).items()})
    shapes[EMBEDDING_NAME] = (sizes.vocab_size, pg.width)
    shapes.update({EXPERT_PREFIX + k: s for k, s in gemma_shapes(ex, adaptive=pi05).items()})
    shapes[EXPERT_HEAD_NAME] = (sizes.vocab_size, ex.width)
    w = ex.width
    if not pi05:
        shapes.update(linear_shapes('state_proj', w, max_state_dim, bias=True))
    shapes.update(linear_shapes('action_in_proj', w, max_action_dim, bias=True))
    shapes.update(linear_shapes('action_out_proj', max_action_dim, w, bias=True))
    if pi05:
        shapes.update(linear_shapes('time_mlp_in', w, w, bias=True))
        shapes.update(linear_shapes('time_mlp_out', w, w, bias=True))
    else:
        shapes.update(linear_shapes('action_time_mlp_in', w, 2 * w, bias=True))
        shapes.update(linear_shapes('action_time_mlp_out', w, w, bias=True))
    return shapes


def is_bf16_weight(name: str) -> bool:
    """Whether LeRobot stores ``name`` in bfloat16 in a ``dtype: bfloat16`` folder."""
    return name.endswith(BF16_SUFFIXES) and 'vision_tower' not in name


# ---------------------------------------------------------------------------------------------
# Reading a folder
# ---------------------------------------------------------------------------------------------

SIZES_FILE = 'model_sizes.json'


@dataclass(frozen=True, slots=True, eq=False)
class Pi0Spec:
    """What the runner, the processor and the engine agree on about a pi0 / pi0.5 folder.

    ``camera_keys`` are the config's VISUAL input features in order (the robot's cameras map to
    them in that order); ``state_mode`` / ``action_mode`` are the normalizer's modes from the
    processor files and ``state_statistics`` / ``action_statistics`` the float32 statistics
    those modes use (``{stat: [dim]}``; the state's from the preprocessor's normalizer, the
    action's from the postprocessor's unnormalizer). ``tokenizer_max_length`` is the
    preprocessor's tokenizer ``max_length`` (prompts are truncated to it, as LeRobot does).
    """

    policy_type: str
    paligemma: GemmaSize
    expert: GemmaSize
    vision: SiglipSize
    vocab_size: int
    chunk_size: int
    n_action_steps: int
    max_state_dim: int
    max_action_dim: int
    num_inference_steps: int
    min_period: float
    max_period: float
    tokenizer_max_length: int
    image_size: int
    camera_keys: tuple[str, ...]
    state_dim: int
    action_dim: int
    dtype: str
    weights_file: str
    state_mode: str
    action_mode: str
    state_statistics: Mapping[str, Any]
    action_statistics: Mapping[str, Any]

    def __post_init__(self) -> None:
        if self.policy_type not in POLICY_TYPES:
            raise ValueError(
                f'policy_type must be one of {POLICY_TYPES}, got {self.policy_type!r}'
            )
        Pi0Sizes(self.paligemma, self.expert, self.vision, self.vocab_size)  # validates
        for name in (
            'chunk_size',
            'n_action_steps',
            'num_inference_steps',
            'tokenizer_max_length',
        ):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f'{name} must be a positive integer, got {value!r}')
        if self.n_action_steps > self.chunk_size:
            raise ValueError(
                f'n_action_steps {self.n_action_steps} > chunk_size {self.chunk_size}'
            )
        if not 1 <= self.state_dim <= self.max_state_dim:
            raise ValueError(
                f'state_dim {self.state_dim} is not 1..max_state_dim {self.max_state_dim}'
            )
        if not 1 <= self.action_dim <= self.max_action_dim:
            raise ValueError(
                f'action_dim {self.action_dim} is not 1..max_action_dim {self.max_action_dim}'
            )
        if self.image_size != self.vision.image_size:
            raise ValueError(f'image_size {self.image_size} != vision {self.vision.image_size}')
        if not self.camera_keys:
            raise ValueError('a pi folder needs at least one camera feature')
        if not 0 < self.min_period < self.max_period:
            raise ValueError(
                f'periods must be 0 < min < max, got {self.min_period}, {self.max_period}'
            )
        for kind, mode, stats, dim in (
            ('state', self.state_mode, self.state_statistics, self.state_dim),
            ('action', self.action_mode, self.action_statistics, self.action_dim),
        ):
            if mode not in NORMALIZATION_STATS:
                raise ValueError(
                    f'{kind} normalization {mode!r} is not one of {list(NORMALIZATION_STATS)}'
                )
            for stat in NORMALIZATION_STATS[mode]:
                if stat not in stats or tuple(stats[stat].shape) != (dim,):
                    raise ValueError(f'{kind} normalization {mode} needs {stat} of shape ({dim},)')

    @property
    def sizes(self) -> Pi0Sizes:
        return Pi0Sizes(self.paligemma, self.expert, self.vision, self.vocab_size)

    @property
    def num_image_tokens(self) -> int:
        """Prefix tokens of one camera."""
        return self.vision.num_patches


def _sizes_from_file(data: Mapping[str, Any], image_size: int) -> Pi0Sizes:
    try:
        vision = dict(data['vision'])
        if vision.get('image_size', image_size) != image_size:
            raise CheckpointError(
                f'{SIZES_FILE} vision image_size {vision["image_size"]} disagrees with '
                f'{CONFIG_FILE} image_resolution {image_size}'
            )
        vision['image_size'] = image_size
        return Pi0Sizes(
            paligemma=GemmaSize(**data['paligemma']),
            expert=GemmaSize(**data['action_expert']),
            vision=SiglipSize(**vision),
            vocab_size=data['vocab_size'],
        )
    except (KeyError, TypeError, ValueError) as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(
            f'{SIZES_FILE} must hold paligemma, action_expert (GemmaSize fields), vision '
            f'(SiglipSize fields) and vocab_size: {exc!r}'
        ) from None


def _sizes_from_variants(config: Mapping[str, Any], image_size: int) -> Pi0Sizes:
    found = []
    for field_name in ('paligemma_variant', 'action_expert_variant'):
        name = config.get(field_name)
        if name not in GEMMA_VARIANTS:
            raise CheckpointError(
                f'{CONFIG_FILE} {field_name} {name!r} is not one of {sorted(GEMMA_VARIANTS)}; '
                f'a folder of other sizes declares them in {SIZES_FILE}'
            )
        found.append(GEMMA_VARIANTS[name])
    vision = SiglipSize(**{**_size_fields(SIGLIP_SO400M_224), 'image_size': image_size})
    return Pi0Sizes(found[0], found[1], vision, PALIGEMMA_VOCAB_SIZE)


def _size_fields(size: Any) -> dict[str, int]:
    return {name: getattr(size, name) for name in size.__slots__}


def _refuse_unserved_options(
    config: Mapping[str, Any], steps: Sequence[Mapping[str, Any]]
) -> None:
    """Relative actions and training-time real-time chunking change what a chunk means;
    neither is served."""
    if config.get('use_relative_actions'):
        raise CheckpointError(
            f'{CONFIG_FILE} use_relative_actions is true: relative actions are not served'
        )
    for step in steps:
        name = str(step.get('registry_name', ''))
        enabled = (step.get('config') or {}).get('enabled', True)
        if ('relative_action' in name or 'absolute_action' in name) and enabled:
            raise CheckpointError(
                f'the processor step {name!r} converts relative actions, which are not served'
            )
    # LeRobot's rtc_config is inference-time guidance: served per robot (robots.<id>.rtc
    # and the engine.rtc_* settings), whatever the folder says. A model trained for
    # real-time chunking conditions on the committed prefix instead: not served.
    trained = sorted(k for k, v in config.items() if k.startswith('training_time_rtc') and v)
    if trained:
        raise CheckpointError(
            f'{CONFIG_FILE} {trained[0]} is set: a model trained for real-time chunking is not '
            'served'
        )


def _processors(
    folder: Path, config: Mapping[str, Any], policy_type: str
) -> tuple[list[Mapping[str, Any]], Mapping[str, Any], Mapping[str, Any]]:
    """Both pipelines' steps, checked for the steps this family's prompt relies on; returns
    (all steps, the preprocessor's normalizer step, the postprocessor's unnormalizer step)."""
    pre = read_json(folder / PREPROCESSOR_FILE, 'LeRobot saves the preprocessor pipeline there')
    post = read_json(folder / POSTPROCESSOR_FILE, 'LeRobot saves the postprocessor there')
    norm_index, normalizer = processor_step(pre, 'normalizer_processor', PREPROCESSOR_FILE)
    token_index, tokenizer = processor_step(pre, 'tokenizer_processor', PREPROCESSOR_FILE)
    _, unnormalizer = processor_step(post, 'unnormalizer_processor', POSTPROCESSOR_FILE)
    if policy_type == 'pi0':
        line_index, _ = processor_step(pre, 'pi0_new_line_processor', PREPROCESSOR_FILE)
        if line_index > token_index:
            raise CheckpointError(f'{PREPROCESSOR_FILE} appends the newline after tokenizing')
    else:
        prompt_index, _ = processor_step(
            pre, 'pi05_prepare_state_tokenizer_processor_step', PREPROCESSOR_FILE
        )
        if not norm_index < prompt_index < token_index:
            raise CheckpointError(
                f'{PREPROCESSOR_FILE} must normalize the state, then write the prompt, then '
                'tokenize'
            )
    token_config = tokenizer.get('config') or {}
    if token_config.get('max_length') != config.get('tokenizer_max_length'):
        raise CheckpointError(
            f'{PREPROCESSOR_FILE} tokenizer max_length {token_config.get("max_length")} '
            f'disagrees with {CONFIG_FILE} tokenizer_max_length '
            f'{config.get("tokenizer_max_length")}'
        )
    if token_config.get('padding_side', 'right') != 'right':
        raise CheckpointError(f'{PREPROCESSOR_FILE} tokenizer pads on the left')
    return [*pre['steps'], *post['steps']], normalizer, unnormalizer


def read_pi0_spec(folder: str | Path) -> Pi0Spec:
    """Read a LeRobot pi0 / pi0.5 folder's spec (JSON, the statistics and the weights' header).

    Raises:
        CheckpointError: naming the file, field, tensor or statistic that disagrees, a missing
            file, or an option not served (relative actions, real-time chunking).
    """
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    config = read_json(folder / CONFIG_FILE, 'a LeRobot policy folder starts there')
    policy_type = config.get('type')
    if policy_type not in POLICY_TYPES:
        raise CheckpointError(f'{CONFIG_FILE} type {policy_type!r} is not one of {POLICY_TYPES}')
    if not (folder / WEIGHTS_FILE).is_file():
        raise CheckpointError(f'missing {WEIGHTS_FILE} in {folder}')
    steps, normalizer, unnormalizer = _processors(folder, config, policy_type)
    _refuse_unserved_options(config, steps)
    for name, served in (('n_obs_steps', 1), ('empty_cameras', 0)):
        if config.get(name, served) != served:
            raise CheckpointError(f'{CONFIG_FILE} {name} {config[name]} is not served ({served})')
    resolution = config.get('image_resolution')
    if not isinstance(resolution, list) or len(resolution) != 2 or resolution[0] != resolution[1]:
        raise CheckpointError(f'{CONFIG_FILE} image_resolution must be square, got {resolution}')
    image_size = resolution[0]
    if (folder / SIZES_FILE).is_file():
        sizes = _sizes_from_file(read_json(folder / SIZES_FILE, ''), image_size)
        source = SIZES_FILE
    else:
        sizes = _sizes_from_variants(config, image_size)
        source = (
            f'paligemma_variant {config["paligemma_variant"]!r} / action_expert_variant '
            f'{config["action_expert_variant"]!r}'
        )
    inputs = config.get('input_features') or {}
    outputs = config.get('output_features') or {}
    cameras = tuple(
        k for k, v in inputs.items() if isinstance(v, Mapping) and v.get('type') == 'VISUAL'
    )
    state_dim = feature_dim(inputs, STATE_KEY, 'STATE', 'input_features')
    action_dim = feature_dim(outputs, ACTION_KEY, 'ACTION', 'output_features')
    max_state_dim, max_action_dim = config.get('max_state_dim'), config.get('max_action_dim')
    for name, value in (('max_state_dim', max_state_dim), ('max_action_dim', max_action_dim)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise CheckpointError(
                f'{CONFIG_FILE} {name} must be a positive integer, got {value!r}'
            )
    header = read_safetensors_header(folder / WEIGHTS_FILE)
    check_weight_shapes(
        header,
        pi0_weight_shapes(
            policy_type, sizes, max_state_dim=max_state_dim, max_action_dim=max_action_dim
        ),
        source=source,
        policy_type=policy_type,
    )
    pre_map = (normalizer.get('config') or {}).get('norm_map') or {}
    post_map = (unnormalizer.get('config') or {}).get('norm_map') or {}
    if normalization_mode(pre_map, 'VISUAL', PREPROCESSOR_FILE) != 'IDENTITY':
        raise CheckpointError(f'{PREPROCESSOR_FILE} normalizes images: only IDENTITY is served')
    state_mode = normalization_mode(pre_map, 'STATE', PREPROCESSOR_FILE)
    action_mode = normalization_mode(post_map, 'ACTION', POSTPROCESSOR_FILE)
    config_map = config.get('normalization_mapping') or {}
    for kind, mode in (('STATE', state_mode), ('ACTION', action_mode)):
        if config_map.get(kind, mode) != mode:
            raise CheckpointError(
                f'{CONFIG_FILE} normalization_mapping {kind} {config_map[kind]!r} disagrees '
                f'with the processor files ({mode!r})'
            )
    pre_stats = read_statistics(folder, normalizer, PREPROCESSOR_FILE)
    post_stats = read_statistics(folder, unnormalizer, POSTPROCESSOR_FILE)
    try:
        return Pi0Spec(
            policy_type=policy_type,
            paligemma=sizes.paligemma,
            expert=sizes.expert,
            vision=sizes.vision,
            vocab_size=sizes.vocab_size,
            chunk_size=config.get('chunk_size'),
            n_action_steps=config.get('n_action_steps'),
            max_state_dim=max_state_dim,
            max_action_dim=max_action_dim,
            num_inference_steps=config.get('num_inference_steps'),
            min_period=float(config.get('min_period', 4e-3)),
            max_period=float(config.get('max_period', 4.0)),
            tokenizer_max_length=config.get('tokenizer_max_length'),
            image_size=image_size,
            camera_keys=cameras,
            state_dim=state_dim,
            action_dim=action_dim,
            dtype=str(config.get('dtype')),
            weights_file=WEIGHTS_FILE,
            state_mode=state_mode,
            action_mode=action_mode,
            state_statistics=selected_statistics(
                pre_stats, STATE_KEY, state_mode, state_dim, PREPROCESSOR_FILE
            ),
            action_statistics=selected_statistics(
                post_stats, ACTION_KEY, action_mode, action_dim, POSTPROCESSOR_FILE
            ),
        )
    except ValueError as exc:
        if isinstance(exc, CheckpointError):
            raise
        raise CheckpointError(f'{CONFIG_FILE}: {exc}') from None
