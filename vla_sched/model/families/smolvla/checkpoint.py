"""SmolVLA checkpoints as LeRobot saves them: sizes, tensor names, and the folder's spec.

A SmolVLA folder holds ``config.json`` (``type`` ``smolvla``), ``model.safetensors`` (keys
prefixed ``model.``), ``policy_preprocessor.json`` / ``policy_postprocessor.json`` and the
normalizer statistics each names in its ``state_file``. It holds neither its VLM's sizes nor
its tokenizer: both come from ``vlm_model_name``'s folder (``HuggingFaceTB/SmolVLM2-500M-Video-
Instruct``), whose ``config.json`` gives the vision tower (``vision_config``), the pixel
shuffle (``scale_factor``) and the text model (``text_config``); the policy keeps only the
first ``num_vlm_layers`` text layers. The action expert is the text config with the width
``int(hidden * expert_width_multiplier)`` and LeRobot's ``get_intermediate_size`` of it (same
heads and head_dim); its layer ``i`` is a cross-attention layer when ``attention_mode``
contains ``cross`` and ``i`` is not a multiple of ``self_attn_every_n_layers``, and then its
``k_proj`` / ``v_proj`` take the VLM's K/V width.

Whichever sizes are used are checked against the tensor shapes in the safetensors header.
This module reads JSON and the safetensors header only (no torch).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.config.lerobot_policy import (
    NORMALIZATION_STATS,
    check_weight_shapes,
    feature_dim,
    normalization_mode,
    processor_step,
    read_json,
    read_safetensors_header,
    read_statistics,
    selected_statistics,
)
from vla_sched.model.families.pi0.checkpoint import (
    GemmaSize,
    SiglipSize,
    gemma_shapes,
    linear_shapes,
    siglip_shapes,
)

POLICY_TYPE = 'smolvla'
WEIGHTS_PREFIX = 'model.'
VLM_PREFIX = 'vlm_with_expert.vlm.model.'
VISION_PREFIX = VLM_PREFIX + 'vision_model.'
CONNECTOR_NAME = VLM_PREFIX + 'connector.modality_projection.proj.weight'
TEXT_PREFIX = VLM_PREFIX + 'text_model.'
EMBEDDING_NAME = TEXT_PREFIX + 'embed_tokens.weight'
EXPERT_PREFIX = 'vlm_with_expert.lm_expert.'
# Stored by some exports and never used by the policy: tolerated when present.
UNUSED_NAMES = ('vlm_with_expert.vlm.lm_head.weight',)
HEAD_NAMES = (
    'state_proj',
    'action_in_proj',
    'action_out_proj',
    'action_time_mlp_in',
    'action_time_mlp_out',
)
CONFIG_FILE = 'config.json'
WEIGHTS_FILE = 'model.safetensors'
PREPROCESSOR_FILE = 'policy_preprocessor.json'
POSTPROCESSOR_FILE = 'policy_postprocessor.json'
VLM_CONFIG_FILE = 'config.json'
STATE_KEY = 'observation.state'
ACTION_KEY = 'action'
DEFAULT_VLM_NAME = 'HuggingFaceTB/SmolVLM2-500M-Video-Instruct'
TEXT_RMS_EPS = 1e-5  # SmolVLM2's text rms_norm_eps when its config omits it
VISION_LAYER_NORM_EPS = 1e-6


def expert_intermediate_size(width: int, *, multiplier: int = 4, multiple_of: int = 256) -> int:
    """LeRobot's ``get_intermediate_size``: ``int(2 w / 3) * 4`` rounded up to 256."""
    hidden = int(multiplier * int(2 * width / 3))
    return multiple_of * ((hidden + multiple_of - 1) // multiple_of)


@dataclass(frozen=True, slots=True)
class SmolVLASizes:
    """Every size a SmolVLA folder's weights have.

    ``text`` is the VLM's text model cut to ``num_vlm_layers`` (its ``depth``); ``expert``
    shares its depth, heads and head_dim; ``vision`` is the SmolVLM vision tower and
    ``scale_factor`` the connector's pixel shuffle; ``cross_layers`` the expert layers that
    cross-attend to the prefix.
    """

    text: GemmaSize
    expert: GemmaSize
    vision: SiglipSize
    scale_factor: int
    vocab_size: int
    cross_layers: tuple[int, ...]
    rms_norm_eps: float = TEXT_RMS_EPS

    def __post_init__(self) -> None:
        for name in ('scale_factor', 'vocab_size'):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f'SmolVLASizes {name} must be a positive integer, got {value!r}')
        side = self.vision.image_size // self.vision.patch_size
        if side % self.scale_factor:
            raise ValueError(
                f'{side} patches per side are not a multiple of scale_factor {self.scale_factor}'
            )
        for name in ('depth', 'num_heads', 'num_kv_heads', 'head_dim'):
            a, b = getattr(self.text, name), getattr(self.expert, name)
            if a != b:
                raise ValueError(f'the action expert must share {name} with the VLM: {b} != {a}')
        if any(not 0 <= i < self.text.depth for i in self.cross_layers):
            raise ValueError(f'cross_layers {self.cross_layers} outside 0..{self.text.depth - 1}')
        if not self.rms_norm_eps > 0:
            raise ValueError(f'rms_norm_eps must be positive, got {self.rms_norm_eps}')

    @property
    def num_image_tokens(self) -> int:
        """Prefix tokens of one camera: the patches over ``scale_factor ** 2``."""
        return self.vision.num_patches // self.scale_factor**2


def cross_layer_indices(depth: int, *, attention_mode: str, every_n: int) -> tuple[int, ...]:
    """The expert layers LeRobot runs as cross-attention (``forward_cross_attn_layer``)."""
    if 'cross' not in attention_mode:
        return ()
    return tuple(i for i in range(depth) if not (every_n > 0 and i % every_n == 0))


def smolvla_weight_shapes(
    sizes: SmolVLASizes, *, max_state_dim: int, max_action_dim: int
) -> dict[str, tuple[int, ...]]:
    """Every tensor of a SmolVLA ``model.safetensors`` (names without ``model.``) and its
    shape."""
    text, ex, vision = sizes.text, sizes.expert, sizes.vision
    shapes = {VISION_PREFIX + k: s for k, s in siglip_shapes(vision).items()}
    shapes[CONNECTOR_NAME] = (text.width, vision.hidden_size * sizes.scale_factor**2)
    shapes[EMBEDDING_NAME] = (sizes.vocab_size, text.width)
    shapes.update({TEXT_PREFIX + k: s for k, s in gemma_shapes(text, adaptive=False).items()})
    expert = gemma_shapes(ex, adaptive=False)
    kv = text.num_kv_heads * text.head_dim
    for i in sizes.cross_layers:
        for proj in ('k_proj', 'v_proj'):
            expert[f'layers.{i}.self_attn.{proj}.weight'] = (ex.num_kv_heads * ex.head_dim, kv)
    shapes.update({EXPERT_PREFIX + k: s for k, s in expert.items()})
    w = ex.width
    shapes.update(linear_shapes('state_proj', text.width, max_state_dim, bias=True))
    shapes.update(linear_shapes('action_in_proj', w, max_action_dim, bias=True))
    shapes.update(linear_shapes('action_out_proj', max_action_dim, w, bias=True))
    shapes.update(linear_shapes('action_time_mlp_in', w, 2 * w, bias=True))
    shapes.update(linear_shapes('action_time_mlp_out', w, w, bias=True))
    return shapes


# ---------------------------------------------------------------------------------------------
# The VLM's config.json
# ---------------------------------------------------------------------------------------------


def _int_field(section: Mapping[str, Any], name: str, where: str) -> int:
    value = section.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise CheckpointError(f'{where} {name} must be a positive integer, got {value!r}')
    return value


def read_vlm_sizes(
    vlm_folder: Path, *, num_vlm_layers: int, expert_width_multiplier: float,
    attention_mode: str, self_attn_every_n_layers: int, image_size: int,
) -> SmolVLASizes:  # fmt: skip
    """The sizes from the VLM's ``config.json`` and the policy config's fields.

    Raises:
        CheckpointError: naming the missing file or the field that disagrees.
    """
    data = read_json(
        vlm_folder / VLM_CONFIG_FILE, f"the VLM's config (download {DEFAULT_VLM_NAME}'s)"
    )
    text, vision = data.get('text_config'), data.get('vision_config')
    if not isinstance(text, Mapping) or not isinstance(vision, Mapping):
        raise CheckpointError(
            f'{vlm_folder / VLM_CONFIG_FILE} has no text_config and vision_config: it is not a '
            'SmolVLM config'
        )
    where_t, where_v = f'{vlm_folder.name}/config.json text_config', 'vision_config'
    width = _int_field(text, 'hidden_size', where_t)
    heads = _int_field(text, 'num_attention_heads', where_t)
    depth = _int_field(text, 'num_hidden_layers', where_t)
    if not 1 <= num_vlm_layers <= depth:
        raise CheckpointError(
            f'{CONFIG_FILE} num_vlm_layers {num_vlm_layers} is not 1..{depth}, the layers of the '
            "VLM's text_config"
        )
    head_dim = text.get('head_dim') or width // heads
    text_size = GemmaSize(
        width=width, depth=num_vlm_layers,
        mlp_dim=_int_field(text, 'intermediate_size', where_t), num_heads=heads,
        num_kv_heads=text.get('num_key_value_heads') or heads, head_dim=head_dim,
    )  # fmt: skip
    expert_width = int(width * expert_width_multiplier)
    expert = GemmaSize(
        width=expert_width, depth=num_vlm_layers,
        mlp_dim=expert_intermediate_size(expert_width), num_heads=heads,
        num_kv_heads=text_size.num_kv_heads, head_dim=head_dim,
    )  # fmt: skip
    vision_image = _int_field(vision, 'image_size', where_v)
    if vision_image != image_size:
        raise CheckpointError(
            f'{CONFIG_FILE} resize_imgs_with_padding {image_size} disagrees with the VLM '
            f'vision_config image_size {vision_image}'
        )
    vision_size = SiglipSize(
        hidden_size=_int_field(vision, 'hidden_size', where_v),
        num_layers=_int_field(vision, 'num_hidden_layers', where_v),
        intermediate_size=_int_field(vision, 'intermediate_size', where_v),
        num_heads=_int_field(vision, 'num_attention_heads', where_v),
        patch_size=_int_field(vision, 'patch_size', where_v),
        image_size=vision_image,
    )
    return SmolVLASizes(
        text=text_size,
        expert=expert,
        vision=vision_size,
        scale_factor=_int_field(data, 'scale_factor', 'config.json'),
        vocab_size=_int_field(text, 'vocab_size', where_t),
        cross_layers=cross_layer_indices(
            num_vlm_layers, attention_mode=attention_mode, every_n=self_attn_every_n_layers
        ),
        rms_norm_eps=float(text.get('rms_norm_eps', TEXT_RMS_EPS)),
    )


# ---------------------------------------------------------------------------------------------
# The folder's spec
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, eq=False)
class SmolVLASpec:
    """What the runner, the processor and the engine agree on about a SmolVLA folder.

    ``camera_keys`` are the config's VISUAL input features in order; ``state_mode`` /
    ``action_mode`` the normalizer's modes from the processor files and ``state_statistics`` /
    ``action_statistics`` the float32 statistics those modes use. ``num_inference_steps`` is
    the config's ``num_steps``. ``vlm_model_name`` names the repository of the VLM's config and
    tokenizer.
    """

    sizes: SmolVLASizes
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
    vlm_model_name: str
    state_mode: str
    action_mode: str
    state_statistics: Mapping[str, Any]
    action_statistics: Mapping[str, Any]
    weights_file: str = WEIGHTS_FILE
    policy_type: str = POLICY_TYPE

    def __post_init__(self) -> None:
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
        if self.image_size != self.sizes.vision.image_size:
            raise ValueError(
                f'image_size {self.image_size} != vision {self.sizes.vision.image_size}'
            )
        if not self.camera_keys:
            raise ValueError('a SmolVLA folder needs at least one camera feature')
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
    def num_image_tokens(self) -> int:
        """Prefix tokens of one camera."""
        return self.sizes.num_image_tokens

    @property
    def vocab_size(self) -> int:
        return self.sizes.vocab_size


# Options whose non-default values change what is computed and are not served.
UNSERVED_OPTIONS: Mapping[str, Any] = {
    'n_obs_steps': 1,
    'empty_cameras': 0,
    'adapt_to_pi_aloha': False,
    'use_delta_joint_actions_aloha': False,
    'add_image_special_tokens': False,
}


def _refuse_unserved(config: Mapping[str, Any]) -> None:
    for name, served in UNSERVED_OPTIONS.items():
        if config.get(name, served) != served:
            raise CheckpointError(
                f'{CONFIG_FILE} {name} {config[name]!r} is not served ({served!r})'
            )
    # rtc_config is LeRobot's inference-time real-time chunking (policies/rtc): it changes no
    # weight, and the engine guides a robot's steps by its own rtc_* settings.
    layers, experts = config.get('num_vlm_layers'), config.get('num_expert_layers', -1)
    if isinstance(experts, int) and experts > 0 and experts != layers:
        raise CheckpointError(
            f'{CONFIG_FILE} num_expert_layers {experts} differs from num_vlm_layers {layers}: an '
            'expert shallower than the VLM is not served'
        )


def _processors(
    folder: Path, config: Mapping[str, Any]
) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
    """The preprocessor's normalizer step and the postprocessor's unnormalizer step, after
    checking the steps the prompt relies on (a newline, then the tokenizer)."""
    pre = read_json(folder / PREPROCESSOR_FILE, 'LeRobot saves the preprocessor pipeline there')
    post = read_json(folder / POSTPROCESSOR_FILE, 'LeRobot saves the postprocessor there')
    _, normalizer = processor_step(pre, 'normalizer_processor', PREPROCESSOR_FILE)
    token_index, tokenizer = processor_step(pre, 'tokenizer_processor', PREPROCESSOR_FILE)
    line_index, _ = processor_step(pre, 'smolvla_new_line_processor', PREPROCESSOR_FILE)
    if line_index > token_index:
        raise CheckpointError(f'{PREPROCESSOR_FILE} appends the newline after tokenizing')
    _, unnormalizer = processor_step(post, 'unnormalizer_processor', POSTPROCESSOR_FILE)
    token_config = tokenizer.get('config') or {}
    if token_config.get('max_length') != config.get('tokenizer_max_length'):
        raise CheckpointError(
            f'{PREPROCESSOR_FILE} tokenizer max_length {token_config.get("max_length")} '
            f'disagrees with {CONFIG_FILE} tokenizer_max_length '
            f'{config.get("tokenizer_max_length")}'
        )
    if token_config.get('padding_side', 'right') != 'right':
        raise CheckpointError(f'{PREPROCESSOR_FILE} tokenizer pads on the left')
    return normalizer, unnormalizer


def read_policy_config(folder: str | Path) -> dict[str, Any]:
    """A SmolVLA folder's ``config.json`` (its type checked)."""
    folder = Path(folder)
    if not folder.is_dir():
        raise CheckpointError(f'checkpoint folder {folder} does not exist')
    config = read_json(folder / CONFIG_FILE, 'a LeRobot policy folder starts there')
    if config.get('type') != POLICY_TYPE:
        raise CheckpointError(f'{CONFIG_FILE} type {config.get("type")!r} is not {POLICY_TYPE!r}')
    return config


def _square(config: Mapping[str, Any], name: str) -> int:
    value = config.get(name)
    if not isinstance(value, list) or len(value) != 2 or value[0] != value[1]:
        raise CheckpointError(f'{CONFIG_FILE} {name} must be square, got {value}')
    return int(value[0])


def read_smolvla_spec(folder: str | Path, *, vlm_folder: str | Path) -> SmolVLASpec:
    """Read a LeRobot SmolVLA folder's spec with its VLM's ``config.json`` from ``vlm_folder``.

    Raises:
        CheckpointError: naming the file, field, tensor or statistic that disagrees, a missing
            file, or an option not served.
    """
    folder = Path(folder)
    config = read_policy_config(folder)
    if not (folder / WEIGHTS_FILE).is_file():
        raise CheckpointError(f'missing {WEIGHTS_FILE} in {folder}')
    normalizer, unnormalizer = _processors(folder, config)
    _refuse_unserved(config)
    image_size = _square(config, 'resize_imgs_with_padding')
    every_n = config.get('self_attn_every_n_layers', 2)
    mode = config.get('attention_mode', 'cross_attn')
    num_vlm_layers = config.get('num_vlm_layers')
    if isinstance(num_vlm_layers, bool) or not isinstance(num_vlm_layers, int):
        raise CheckpointError(
            f'{CONFIG_FILE} num_vlm_layers must be an integer, got {num_vlm_layers!r}'
        )
    sizes = read_vlm_sizes(
        Path(vlm_folder),
        num_vlm_layers=num_vlm_layers,
        expert_width_multiplier=float(config.get('expert_width_multiplier', 0.75)),
        attention_mode=str(mode),
        self_attn_every_n_layers=int(every_n),
        image_size=image_size,
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
    expected = smolvla_weight_shapes(
        sizes, max_state_dim=max_state_dim, max_action_dim=max_action_dim
    )
    unused = {WEIGHTS_PREFIX + n for n in UNUSED_NAMES}
    check_weight_shapes(
        {n: v for n, v in header.items() if n not in unused},
        expected,
        source=f"the VLM's config.json in {vlm_folder} and {CONFIG_FILE}",
        policy_type=POLICY_TYPE,
    )
    pre_map = (normalizer.get('config') or {}).get('norm_map') or {}
    post_map = (unnormalizer.get('config') or {}).get('norm_map') or {}
    if normalization_mode(pre_map, 'VISUAL', PREPROCESSOR_FILE) != 'IDENTITY':
        raise CheckpointError(f'{PREPROCESSOR_FILE} normalizes images: only IDENTITY is served')
    state_mode = normalization_mode(pre_map, 'STATE', PREPROCESSOR_FILE)
    action_mode = normalization_mode(post_map, 'ACTION', POSTPROCESSOR_FILE)
    config_map = config.get('normalization_mapping') or {}
    for kind, found in (('STATE', state_mode), ('ACTION', action_mode)):
        if config_map.get(kind, found) != found:
            raise CheckpointError(
                f'{CONFIG_FILE} normalization_mapping {kind} {config_map[kind]!r} disagrees '
                f'with the processor files ({found!r})'
            )
    pre_stats = read_statistics(folder, normalizer, PREPROCESSOR_FILE)
    post_stats = read_statistics(folder, unnormalizer, POSTPROCESSOR_FILE)
    try:
        return SmolVLASpec(
            sizes=sizes,
            chunk_size=config.get('chunk_size'),
            n_action_steps=config.get('n_action_steps'),
            max_state_dim=max_state_dim,
            max_action_dim=max_action_dim,
            num_inference_steps=config.get('num_steps'),
            min_period=float(config.get('min_period', 4e-3)),
            max_period=float(config.get('max_period', 4.0)),
            tokenizer_max_length=config.get('tokenizer_max_length'),
            image_size=image_size,
            camera_keys=cameras,
            state_dim=state_dim,
            action_dim=action_dim,
            dtype=str(config.get('dtype', 'float32')),
            vlm_model_name=str(config.get('vlm_model_name', DEFAULT_VLM_NAME)),
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
