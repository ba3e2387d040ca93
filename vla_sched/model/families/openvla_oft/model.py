"""The assembled OpenVLA-OFT model: the merged OpenVLA model, the action head and the
proprio projector, loaded from one folder."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from vla_sched.model.families.openvla_oft.action_head import L1ActionHead, ProprioProjector
from vla_sched.model.families.openvla_oft.checkpoint import (
    OFTCheckpointSpec,
    OFTSettings,
    read_oft_spec,
)
from vla_sched.model.families.openvla_oft.weights import (
    check_action_head,
    check_proprio_projector,
    load_component_state,
)
from vla_sched.model.loading.checkpoint import load_checkpoint
from vla_sched.model.loading.vla_model import VLAModel


class OFTModel(nn.Module):
    """The merged OpenVLA model (decoder on paged KV, towers, projector) with OFT's head and,
    when the settings use the state, its proprio projector."""

    def __init__(
        self,
        spec: OFTCheckpointSpec,
        vla: VLAModel,
        action_head: L1ActionHead,
        proprio_projector: ProprioProjector | None,
    ) -> None:
        super().__init__()
        if (proprio_projector is None) == spec.settings.use_proprio:
            raise ValueError('the settings and the given proprio projector disagree')
        self.spec = spec
        self.vla = vla
        self.action_head = action_head
        self.proprio_projector = proprio_projector

    @property
    def device(self) -> torch.device:
        return self.vla.device

    @property
    def dtype(self) -> torch.dtype:
        return self.vla.dtype


def load_oft_checkpoint(
    folder: str | Path,
    *,
    settings: OFTSettings | None = None,
    spec: OFTCheckpointSpec | None = None,
    device: torch.device | str = 'cpu',
    dtype: torch.dtype = torch.float32,
) -> OFTModel:
    """Load an OpenVLA-OFT folder with ``settings`` (or its already read ``spec``).

    Raises:
        CheckpointError: for missing files or tensors, or widths the settings disagree with
            (naming the file, the tensor and the setting).
        UnsupportedArchitectureError: for a diffusion head or FiLM backbone.
        ActionStatisticsError: for missing or malformed statistics.
    """
    folder = Path(folder)
    if spec is None:
        if settings is None:
            raise ValueError('load_oft_checkpoint needs the OFT settings or the read spec')
        spec = read_oft_spec(folder, settings)
    hidden = spec.base.decoder.hidden_size
    head_state = load_component_state(folder / spec.files.action_head)
    check_action_head(
        head_state,
        file_name=spec.files.action_head,
        hidden_size=hidden,
        action_dim=spec.action_dim,
    )
    proprio_state = None
    if spec.files.proprio_projector is not None:
        proprio_state = load_component_state(folder / spec.files.proprio_projector)
        check_proprio_projector(
            proprio_state,
            file_name=spec.files.proprio_projector,
            hidden_size=hidden,
            proprio_dim=spec.settings.proprio_dim,
        )
    vla = load_checkpoint(folder, device=device, dtype=dtype, spec=spec.base)
    head = L1ActionHead(hidden, spec.action_dim, device='meta', dtype=dtype)
    _assign(head, head_state, device, dtype)
    projector = None
    if proprio_state is not None:
        projector = ProprioProjector(hidden, spec.settings.proprio_dim, device='meta', dtype=dtype)
        _assign(projector, proprio_state, device, dtype)
    model = OFTModel(spec, vla, head, projector).eval()
    model.requires_grad_(False)
    return model


def _assign(module: nn.Module, state: dict[str, torch.Tensor], device, dtype) -> None:
    moved = {name: t.to(device=device, dtype=dtype) for name, t in state.items()}
    module.load_state_dict(moved, strict=True, assign=True)
