"""OpenVLA-OFT's L1-regression action head and its proprio projector.

Parameter names are those of openvla-oft's files after the ``module.`` prefix is stripped
(``L1RegressionActionHead`` holds an ``MLPResNet`` as ``model``; ``ProprioProjector`` has
``fc1``/``fc2``), so a component file loads by name.

The head maps the decoder's final hidden states at a chunk's ``A*K`` read positions,
``[B, A*K, D]``, to ``[B, K, A]``: each chunk step concatenates its ``A`` states (``[B, K,
A*D]``), then LayerNorm -> Linear(A*D -> D) -> ReLU -> ``num_blocks`` pre-LN residual
blocks ``x + ReLU(Linear(LayerNorm(x)))`` -> LayerNorm -> Linear(D -> A). No squashing: the
values are unbounded. The projector is fc1 -> GELU (exact) -> fc2, one ``[D]`` token per
state.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

OFT_HEAD_NUM_BLOCKS = 2  # upstream's L1RegressionActionHead builds MLPResNet(num_blocks=2)


class MLPResNetBlock(nn.Module):
    """``x + ReLU(Linear(LayerNorm(x)))`` (``ffn.0`` LayerNorm, ``ffn.1`` Linear)."""

    def __init__(self, dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        factory = {'device': device, 'dtype': dtype}
        self.ffn = nn.Sequential(nn.LayerNorm(dim, **factory), nn.Linear(dim, dim, **factory))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + F.relu(self.ffn(x))


class MLPResNet(nn.Module):
    """LayerNorm -> fc1 -> ReLU -> residual blocks -> LayerNorm -> fc2."""

    def __init__(
        self,
        *,
        input_dim: int,
        hidden_dim: int,
        output_dim: int,
        num_blocks: int,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        factory = {'device': device, 'dtype': dtype}
        self.layer_norm1 = nn.LayerNorm(input_dim, **factory)
        self.fc1 = nn.Linear(input_dim, hidden_dim, **factory)
        self.mlp_resnet_blocks = nn.ModuleList(
            MLPResNetBlock(hidden_dim, **factory) for _ in range(num_blocks)
        )
        self.layer_norm2 = nn.LayerNorm(hidden_dim, **factory)
        self.fc2 = nn.Linear(hidden_dim, output_dim, **factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.fc1(self.layer_norm1(x)))
        for block in self.mlp_resnet_blocks:
            x = block(x)
        return self.fc2(self.layer_norm2(x))


class L1ActionHead(nn.Module):
    """The L1-regression head: ``[B, A*K, D]`` hidden states -> ``[B, K, A]`` actions.

    Args:
        hidden_size: The decoder's width ``D``.
        action_dim: Values per action ``A``.
        num_blocks: Residual blocks of the MLP (2 in every upstream checkpoint).
    """

    def __init__(
        self,
        hidden_size: int,
        action_dim: int,
        *,
        num_blocks: int = OFT_HEAD_NUM_BLOCKS,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        self.hidden_size = hidden_size
        self.action_dim = action_dim
        self.model = MLPResNet(
            input_dim=hidden_size * action_dim,
            hidden_dim=hidden_size,
            output_dim=action_dim,
            num_blocks=num_blocks,
            device=device,
            dtype=dtype,
        )

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """``hidden [B, A*K, D]`` (action token ``j`` of chunk step ``k`` at row ``k*A + j``)
        -> ``[B, K, A]`` in the head's dtype."""
        batch, num_tokens, width = hidden.shape
        if width != self.hidden_size or num_tokens % self.action_dim:
            raise ValueError(
                f'the head reads [B, K * {self.action_dim}, {self.hidden_size}] hidden states, '
                f'got {tuple(hidden.shape)}'
            )
        chunk_len = num_tokens // self.action_dim
        steps = hidden.reshape(batch, chunk_len, self.action_dim * self.hidden_size)
        return self.model(steps)


class ProprioProjector(nn.Module):
    """The robot state ``[B, P]`` (normalized) -> one ``[B, D]`` token: fc1, GELU, fc2."""

    def __init__(self, hidden_size: int, proprio_dim: int, *, device=None, dtype=None) -> None:
        super().__init__()
        factory = {'device': device, 'dtype': dtype}
        self.proprio_dim = proprio_dim
        self.fc1 = nn.Linear(proprio_dim, hidden_size, **factory)
        self.fc2 = nn.Linear(hidden_size, hidden_size, **factory)

    def forward(self, state: torch.Tensor) -> torch.Tensor:
        if state.shape[-1] != self.proprio_dim:
            raise ValueError(
                f'state has {state.shape[-1]} values, the projector {self.proprio_dim}'
            )
        return self.fc2(F.gelu(self.fc1(state)))
