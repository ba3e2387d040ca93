"""The assembled VLA model: decoder on paged KV plus optional vision encoder.

``assemble_model`` builds it from a mapping of canonical tensor names (see ``weights``) to
tensors, checking every name and shape first so a bad checkpoint fails with the tensor's
name instead of a torch traceback. The vision encoder follows the spec's vision type: a
LLaVA tower and projector (``VisionSpec``) or OpenVLA's timm towers and projector
(``OpenVLAVisionSpec``, tensors mapped by ``openvla_weights``).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping

import torch
from torch import nn

from vla_sched.model.config.checkpoint_spec import CheckpointError, CheckpointSpec
from vla_sched.model.config.openvla_towers import OpenVLAVisionSpec
from vla_sched.model.layers.decoder import PagedDecoder
from vla_sched.model.loading.weights import (
    LM_HEAD,
    decoder_merge_plan,
    decoder_shapes,
    match_tower_names,
    projector_shapes,
    split_names,
)

TensorSource = Callable[[str], torch.Tensor]
EMBEDDING = 'embed_tokens.weight'

logger = logging.getLogger(__name__)


class VLAModel(nn.Module):
    """Decoder (paged KV) and, for a VLA, the vision encoder feeding its image tokens."""

    def __init__(
        self, spec: CheckpointSpec, decoder: PagedDecoder, vision: nn.Module | None
    ) -> None:
        super().__init__()
        if (vision is None) != (spec.vision is None):
            raise ValueError('the spec and the given vision encoder disagree')
        self.spec = spec
        self.decoder = decoder
        self.vision = vision

    @property
    def device(self) -> torch.device:
        return self.decoder.device

    @property
    def dtype(self) -> torch.dtype:
        return self.decoder.dtype

    @torch.no_grad()
    def encode_images(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[N, C, S, S]`` normalized pixels -> ``[N, image_tokens, hidden]`` embeddings.

        ``C`` is 3 per tower (``preprocess_image`` builds them): 3 for LLaVA, 6 for
        OpenVLA's fused backbone.
        """
        if self.vision is None:
            raise ValueError('this model has no vision tower')
        return self.vision(pixel_values.to(self.device)).to(self.dtype)


def _check_part(
    part: str,
    found: Mapping[str, str],
    expected: Mapping[str, tuple[int, ...]],
    shape_of: Callable[[str], tuple[int, ...]],
) -> None:
    missing = sorted(set(expected) - set(found))
    if missing:
        raise CheckpointError(
            f'{part}: checkpoint lacks {len(missing)} tensors, e.g. {missing[:3]}'
        )
    unexpected = sorted(set(found) - set(expected))
    if unexpected:
        raise CheckpointError(
            f'{part}: checkpoint has {len(unexpected)} tensors the config does not describe, '
            f'e.g. {[found[n] for n in unexpected[:3]]}'
        )
    for name, shape in expected.items():
        actual = shape_of(found[name])
        if tuple(actual) != tuple(shape):
            raise CheckpointError(
                f'shape mismatch for {found[name]}: checkpoint has {tuple(actual)}, '
                f'config.json implies {tuple(shape)}'
            )


def _load(module: nn.Module, found: Mapping[str, str], read: TensorSource, device, dtype) -> None:
    state = {
        name: read(canonical).to(device=device, dtype=dtype) for name, canonical in found.items()
    }
    module.load_state_dict(state, strict=True, assign=True)


def _load_decoder(
    decoder: PagedDecoder, found: Mapping[str, str], read: TensorSource, device, dtype
) -> None:
    """Load the decoder, concatenating the checkpoint's q/k/v and gate/up tensors into its
    merged projections: each part is copied (and cast) into its rows of one tensor made on
    ``device``, so no part is held there twice."""
    state = {}
    for name, parts in decoder_merge_plan(found).items():
        if len(parts) == 1:
            state[name] = read(found[parts[0]]).to(device=device, dtype=dtype)
            continue
        tensors = [read(found[part]) for part in parts]
        rows = sum(t.shape[0] for t in tensors)
        merged = torch.empty((rows, *tensors[0].shape[1:]), device=device, dtype=dtype)
        start = 0
        for tensor in tensors:
            merged[start : start + tensor.shape[0]].copy_(tensor)
            start += tensor.shape[0]
        state[name] = merged
    decoder.load_state_dict(state, strict=True, assign=True)


def assemble_model(
    spec: CheckpointSpec,
    names: list[str],
    *,
    shape_of: Callable[[str], tuple[int, ...]],
    read: TensorSource,
    device: torch.device | str = 'cpu',
    dtype: torch.dtype = torch.float32,
) -> VLAModel:
    """Check and load every tensor of a checkpoint into a ``VLAModel``.

    Args:
        spec: The checkpoint's spec.
        names: Canonical tensor names present in the checkpoint.
        shape_of: Shape of a tensor by canonical name (without reading it).
        read: Reads a tensor by canonical name.
        device: Where the model lives.
        dtype: Parameter dtype.

    Raises:
        CheckpointError: for a missing, unexpected or wrongly shaped tensor.
    """
    parts = split_names(names)
    if parts['unknown']:
        raise CheckpointError(
            f'checkpoint has tensors outside the LLaVA and OpenVLA layouts, e.g. '
            f'{sorted(parts["unknown"])[:3]}'
        )
    spec = _with_stored_head(spec, parts['decoder'], read)
    decoder_found = {
        name: canonical
        for name, canonical in parts['decoder'].items()
        if not (name == LM_HEAD and spec.decoder.tie_word_embeddings)
    }
    _check_part('decoder', decoder_found, decoder_shapes(spec.decoder), shape_of)
    decoder = PagedDecoder(spec.decoder, device='meta', dtype=dtype)
    _load_decoder(decoder, decoder_found, read, device, dtype)
    decoder.init_rope(torch.device(device))
    vision = None
    if isinstance(spec.vision, OpenVLAVisionSpec):
        vision = _assemble_openvla_vision(spec.vision, parts, shape_of, read, device, dtype)
    elif spec.vision is not None:
        vision = _assemble_vision(spec, parts, shape_of, read, device, dtype)
    elif parts['projector'] or parts['tower']:
        raise CheckpointError('checkpoint has vision tensors but config.json has no vision tower')
    model = VLAModel(spec, decoder, vision).eval()
    model.requires_grad_(False)
    return model


def _with_stored_head(
    spec: CheckpointSpec, decoder_names: Mapping[str, str], read: TensorSource
) -> CheckpointSpec:
    """The spec to load with, for a config that ties the LM head to the embedding while
    the checkpoint also stores ``lm_head.weight``.

    A stored head equal to the embedding stays tied. A different one is kept as the head,
    as transformers does (a warning says so): a tied head would silently change every
    logit.
    """
    if not spec.decoder.tie_word_embeddings or LM_HEAD not in decoder_names:
        return spec
    if EMBEDDING in decoder_names:
        head, embedding = read(decoder_names[LM_HEAD]), read(decoder_names[EMBEDDING])
        if head.shape == embedding.shape and torch.equal(head, embedding):
            return spec
    logger.warning(
        'config.json ties the LM head to the embedding, but the checkpoint stores a '
        'different %s: it is used as the head, as transformers does',
        decoder_names[LM_HEAD],
    )
    untied = dataclasses.replace(spec.decoder, tie_word_embeddings=False)
    return dataclasses.replace(spec, decoder=untied)


def _assemble_vision(spec, parts, shape_of, read, device, dtype) -> nn.Module:
    from vla_sched.model.layers.vision import (
        Projector,
        VisionEncoder,
        build_vision_tower,
        materialize_buffers,
    )

    vision_spec = spec.vision
    _check_part('projector', parts['projector'], projector_shapes(vision_spec), shape_of)
    tower = build_vision_tower(vision_spec, dtype=dtype)
    tower_shapes = {name: tuple(t.shape) for name, t in tower.state_dict().items()}
    tower_found = match_tower_names(parts['tower'], tower_shapes)
    _check_part('vision tower', tower_found, tower_shapes, shape_of)
    _load(tower, tower_found, read, device, dtype)
    materialize_buffers(tower, device)
    projector = Projector(vision_spec, device='meta', dtype=dtype)
    _load(projector, parts['projector'], read, device, dtype)
    return VisionEncoder(vision_spec, tower, projector)


def assemble_openvla_vision(
    spec: OpenVLAVisionSpec,
    names: list[str],
    *,
    shape_of: Callable[[str], tuple[int, ...]],
    read: TensorSource,
    device: torch.device | str = 'cpu',
    dtype: torch.dtype = torch.float32,
) -> nn.Module:
    """Check and load OpenVLA's towers and projector alone (``OpenVLAVisionEncoder``).

    ``names`` are canonical names of vision tensors only (``projector.*``,
    ``vision_backbone.*``); ``shape_of`` and ``read`` as for ``assemble_model``.

    Raises:
        CheckpointError: for a missing, unexpected or wrongly shaped tensor, named.
    """
    parts = split_names(names)
    others = sorted({*parts['decoder'].values(), *parts['unknown'].values()})
    if others:
        raise CheckpointError(f'not vision tensors of an OpenVLA backbone: {others[:3]}')
    return _assemble_openvla_vision(spec, parts, shape_of, read, device, dtype)


def _assemble_openvla_vision(vision_spec, parts, shape_of, read, device, dtype) -> nn.Module:
    from vla_sched.model.layers.vision import (
        OpenVLAProjector,
        OpenVLAVisionEncoder,
        build_openvla_tower,
        check_native_positions,
        materialize_buffers,
    )
    from vla_sched.model.loading.openvla_weights import (
        hf_tower_state,
        match_module_names,
        openvla_projector_shapes,
        split_tower_names,
        timm_tower_shapes,
        tower_prefix,
    )

    _check_part('projector', parts['projector'], openvla_projector_shapes(vision_spec), shape_of)
    towers = []
    for index, found in enumerate(split_tower_names(parts['tower'], vision_spec)):
        tower_spec = vision_spec.towers[index]
        part = f'vision tower {tower_prefix(index)}*'
        _check_part(part, found, timm_tower_shapes(tower_spec), shape_of)
        tower = build_openvla_tower(tower_spec, dtype=dtype)
        timm_tensors = {
            name: read(canonical).to(device=device, dtype=dtype)
            for name, canonical in found.items()
        }
        state = match_module_names(hf_tower_state(tower_spec, timm_tensors), tower.state_dict())
        tower.load_state_dict(state, strict=True, assign=True)
        materialize_buffers(tower, device)
        check_native_positions(tower, tower_spec)
        towers.append(tower)
    projector = OpenVLAProjector(vision_spec, device='meta', dtype=dtype)
    _load(projector, parts['projector'], read, device, dtype)
    return OpenVLAVisionEncoder(vision_spec, towers, projector)
