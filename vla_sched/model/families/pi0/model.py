"""pi0 and pi0.5 on the engine's paged KV: PaliGemma's prefix and the action expert's
denoising passes.

The prefix (every camera's SigLIP patches through the projector, then the language
embeddings scaled by sqrt(width)) runs through PaliGemma's Gemma decoder as one extend row
per robot attending both ways over its valid tokens; its per-layer K/V stay in the paged
cache. A denoising pass runs only the suffix through the action expert, whose layer ``i``
attends over the robot's prefix K/V of PaliGemma layer ``i`` and the suffix's own K/V (the
expert shares PaliGemma's depth, heads and head_dim, so both live in one cache per layer),
at positions continuing from the prefix's length:

- pi0: the suffix is the state token ``state_proj(state)`` (it sees the prefix and itself)
  and the action tokens ``action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x),
  time_emb])))`` (they see the prefix, the state token and each other);
- pi0.5: the suffix is the action tokens ``action_in_proj(x)``, and the time conditions every
  expert norm (adaRMS: ``x_hat * (1 + scale) + shift``, the branch added through ``gate``).

The expert's final norm, then ``action_out_proj`` in float32, give the velocity. Gemma's
RMSNorm scales by ``1 + w``: the loaded norm weights hold ``1 + w`` (``weights.py``), so the
shared decoder's norm computes it.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from vla_sched.model.config.architecture import DecoderSpec, RopeSpec
from vla_sched.model.families.pi0.checkpoint import GemmaSize, Pi0Sizes
from vla_sched.model.layers.attention import AttentionMetadata
from vla_sched.model.layers.decoder import KVCache, PagedDecoder, RMSNorm, SelfAttention, SwiGLU
from vla_sched.model.layers.rope import RopeTables, rope_inv_freq, rope_tables

GEMMA_RMS_EPS = 1e-6
GEMMA_ROPE_THETA = 10000.0
SIGLIP_LAYER_NORM_EPS = 1e-6


def gemma_decoder_spec(size: GemmaSize, *, vocab_size: int) -> DecoderSpec:
    """Our decoder spec of one Gemma stack (tied embedding, GELU-tanh MLP)."""
    return DecoderSpec(
        model_type='gemma',
        vocab_size=vocab_size,
        hidden_size=size.width,
        num_layers=size.depth,
        num_heads=size.num_heads,
        num_kv_heads=size.num_kv_heads,
        head_dim=size.head_dim,
        intermediate_size=size.mlp_dim,
        rms_norm_eps=GEMMA_RMS_EPS,
        rope=RopeSpec(theta=GEMMA_ROPE_THETA),
        tie_word_embeddings=True,
        hidden_act='gelu_pytorch_tanh',
    )


def time_embedding(
    t: torch.Tensor, *, dim: int, min_period: float, max_period: float
) -> torch.Tensor:
    """Sin/cos of ``2 * pi * t / period`` over ``dim / 2`` periods spaced geometrically from
    ``min_period`` to ``max_period`` (computed in float64, returned as float32 ``[B, dim]``,
    the sin half first)."""
    if dim % 2:
        raise ValueError(f'time embedding width must be even, got {dim}')
    fraction = torch.linspace(0.0, 1.0, dim // 2, dtype=torch.float64, device=t.device)
    period = min_period * (max_period / min_period) ** fraction
    angle = (2.0 * math.pi / period)[None, :] * t.to(torch.float64)[:, None]
    return torch.cat([torch.sin(angle), torch.cos(angle)], dim=-1).to(torch.float32)


def _rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


class AdaptiveRMSNorm(nn.Module):
    """pi0.5's time-conditioned norm: ``(scale, shift, gate) = dense(cond)``, the output
    ``x_hat * (1 + scale) + shift`` and the ``gate`` its branch is added through."""

    def __init__(self, width: int, eps: float, factory: dict) -> None:
        super().__init__()
        self.dense = nn.Linear(width, 3 * width, bias=True, **factory)
        self.eps = eps

    def forward(self, x: torch.Tensor, cond: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """``x`` ``[T, w]``, ``cond`` ``[T, w]`` (each token its request's); returns the
        normed ``x`` and the gate, both in ``x.dtype``."""
        scale, shift, gate = self.dense.forward(cond).chunk(3, dim=-1)
        normed = _rms(x, self.eps) * (1.0 + scale.float()) + shift.float()
        return normed.to(x.dtype), gate.to(x.dtype)


class ExpertLayer(nn.Module):
    """A Gemma block of the action expert: attention over [prefix K/V ; suffix], then the
    GELU-tanh MLP, each added to the residual stream (through adaRMS gates for pi0.5)."""

    def __init__(self, spec: DecoderSpec, *, adaptive: bool, factory: dict) -> None:
        super().__init__()
        width, eps = spec.hidden_size, spec.rms_norm_eps
        norm = (lambda: AdaptiveRMSNorm(width, eps, factory)) if adaptive else (
            lambda: RMSNorm(width, eps, **factory)
        )  # fmt: skip
        self.adaptive = adaptive
        self.input_layernorm = norm()
        self.self_attn = SelfAttention(spec, factory)
        self.post_attention_layernorm = norm()
        self.mlp = SwiGLU(spec, factory)

    def _norm(
        self, norm: nn.Module, x: torch.Tensor, cond: torch.Tensor | None, backend: str
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.adaptive:
            return norm.forward(x, cond)
        return norm.forward(x, backend=backend), None

    def forward(
        self,
        x: torch.Tensor,
        cond: torch.Tensor | None,
        rope: RopeTables,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        hidden, gate = self._norm(self.input_layernorm, x, cond, meta.backend)
        hidden = self.self_attn.forward(hidden, rope, kv_cache, meta)
        x = x + hidden if gate is None else x + gate * hidden
        hidden, gate = self._norm(self.post_attention_layernorm, x, cond, meta.backend)
        hidden = self.mlp.forward(hidden, backend=meta.backend)
        return x + hidden if gate is None else x + gate * hidden


class ActionExpert(nn.Module):
    """The action expert's layers and final norm (its embedding and LM head are unused)."""

    def __init__(self, spec: DecoderSpec, *, adaptive: bool, factory: dict) -> None:
        super().__init__()
        self.spec = spec
        self.adaptive = adaptive
        self.layers = nn.ModuleList(
            ExpertLayer(spec, adaptive=adaptive, factory=factory) for _ in range(spec.num_layers)
        )
        width, eps = spec.hidden_size, spec.rms_norm_eps
        self.norm = (
            AdaptiveRMSNorm(width, eps, factory) if adaptive else RMSNorm(width, eps, **factory)
        )

    def forward(
        self,
        x: torch.Tensor,
        cond: torch.Tensor | None,
        rope: RopeTables,
        kv_caches: list[KVCache],
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer.forward(x, cond, rope, kv_cache, meta)
        if self.adaptive:
            return self.norm.forward(x, cond)[0]  # the final norm's gate is unused
        return self.norm.forward(x, backend=meta.backend)


class Pi0Model(nn.Module):
    """PaliGemma (SigLIP tower, projector, Gemma on paged KV) with the action expert and
    pi0's or pi0.5's projections (see the module docstring).

    Args:
        policy_type: 'pi0' or 'pi05'.
        sizes: the folder's sizes.
        max_state_dim, max_action_dim: the padded state and action widths.
        min_period, max_period: the time embedding's periods.
        vision_tower: transformers' ``SiglipVisionModel`` (built by the loader).
        device, dtype: where and in which dtype the Gemma stacks live; the tower, the
            projector and the action/state/time projections stay float32, as LeRobot keeps
            them.
    """

    def __init__(
        self,
        *,
        policy_type: str,
        sizes: Pi0Sizes,
        max_state_dim: int,
        max_action_dim: int,
        min_period: float,
        max_period: float,
        vision_tower: nn.Module,
        device: torch.device | str = 'cpu',
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.policy_type = policy_type
        self.sizes = sizes
        self.max_state_dim, self.max_action_dim = max_state_dim, max_action_dim
        self.min_period, self.max_period = min_period, max_period
        factory = {'device': device, 'dtype': dtype}
        f32 = {'device': device, 'dtype': torch.float32}
        pi05 = policy_type == 'pi05'
        self.vision_tower = vision_tower
        self.projector = nn.Linear(sizes.vision.hidden_size, sizes.paligemma.width, **f32)
        self.language = PagedDecoder(
            gemma_decoder_spec(sizes.paligemma, vocab_size=sizes.vocab_size),
            device=device,
            dtype=dtype,
        )
        expert_spec = gemma_decoder_spec(sizes.expert, vocab_size=sizes.vocab_size)
        self.expert = ActionExpert(expert_spec, adaptive=pi05, factory=factory)
        width = sizes.expert.width
        self.state_proj = None if pi05 else nn.Linear(max_state_dim, width, **f32)
        self.action_in_proj = nn.Linear(max_action_dim, width, **f32)
        self.action_out_proj = nn.Linear(width, max_action_dim, **f32)
        if pi05:
            self.time_mlp_in = nn.Linear(width, width, **f32)
            self.time_mlp_out = nn.Linear(width, width, **f32)
        else:
            self.action_time_mlp_in = nn.Linear(2 * width, width, **f32)
            self.action_time_mlp_out = nn.Linear(width, width, **f32)
        self.register_buffer('inv_freq', torch.empty(0), persistent=False)
        self.init_rope(torch.device(device))

    def init_rope(self, device: torch.device) -> None:
        self.inv_freq = rope_inv_freq(RopeSpec(theta=GEMMA_ROPE_THETA), self.head_dim).to(device)

    @property
    def head_dim(self) -> int:
        return self.sizes.paligemma.head_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.language.dtype

    @property
    def device(self) -> torch.device:
        return self.language.device

    @property
    def suffix_len(self) -> int:
        """Suffix tokens of one denoising pass besides the actions (pi0's state token)."""
        return 0 if self.state_proj is None else 1

    def allocate_kv_cache(self, num_slots: int) -> list[KVCache]:
        return self.language.allocate_kv_cache(num_slots)

    # ---- the prefix ---------------------------------------------------------------------

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[N, 3, S, S]`` pixels in [-1, 1] -> ``[N, patches, width]`` in the model dtype
        (the tower's last hidden states through the projector; not scaled)."""
        pixels = pixels.to(device=self.device, dtype=torch.float32)
        hidden = self.vision_tower(pixel_values=pixels).last_hidden_state
        return self.projector.forward(hidden).to(self.dtype)

    def language_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        """Token embeddings scaled by sqrt(width), the scale rounded to the model dtype."""
        scale = torch.tensor(math.sqrt(self.sizes.paligemma.width), dtype=self.dtype)
        return self.language.embed(input_ids.to(self.device)) * scale.to(self.device)

    def run_prefix(
        self, embeds: torch.Tensor, meta: AttentionMetadata, kv_caches: list[KVCache]
    ) -> None:
        """Run PaliGemma's layers over the prefix rows' embeddings; their K/V stay in the
        cache (the hidden states are not needed)."""
        self.language.forward(embeds, meta, kv_caches)

    # ---- a denoising pass ---------------------------------------------------------------

    def time_conditioning(self, t: torch.Tensor) -> torch.Tensor:
        """The float32 sinusoidal embedding of each row's time ``t`` ``[B]``."""
        return time_embedding(
            t,
            dim=self.sizes.expert.width,
            min_period=self.min_period,
            max_period=self.max_period,
        )

    def suffix_embeddings(
        self, x_t: torch.Tensor, t: torch.Tensor, state: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The suffix tokens of ``B`` rows, ``[B, S, width]`` in the model dtype, and pi0.5's
        per-row conditioning ``[B, width]`` (None for pi0)."""
        emb = self.time_conditioning(t.to(self.device))
        actions = self.action_in_proj.forward(x_t.to(self.device, torch.float32))
        if self.state_proj is None:
            cond = F.silu(self.time_mlp_out.forward(F.silu(self.time_mlp_in.forward(emb))))
            return actions.to(self.dtype), cond.to(self.dtype)
        chunk = actions.shape[1]
        mixed = torch.cat([actions, emb[:, None, :].expand(-1, chunk, -1)], dim=-1)
        tokens = self.action_time_mlp_out.forward(F.silu(self.action_time_mlp_in.forward(mixed)))
        state_token = self.state_proj.forward(state.to(self.device, torch.float32))[:, None, :]
        return torch.cat([state_token, tokens], dim=1).to(self.dtype), None

    def velocity(
        self,
        *,
        x_t: torch.Tensor,
        t: torch.Tensor,
        state: torch.Tensor | None,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
    ) -> torch.Tensor:
        """The velocity ``[B, chunk, max_action_dim]`` (float32) of ``B`` rows, each at its
        time ``t[b]`` on its noisy actions ``x_t[b]``; ``meta`` describes the suffixes
        (``S`` tokens each) over their rows' prefixes."""
        suffix, cond = self.suffix_embeddings(x_t, t, state)
        num_rows, suffix_len, width = suffix.shape
        tokens = suffix.reshape(num_rows * suffix_len, width)
        if cond is not None:
            cond = cond.repeat_interleave(suffix_len, dim=0)
        rope = rope_tables(meta.positions, self.inv_freq, self.dtype)
        out = self.expert.forward(tokens, cond, rope, kv_caches, meta)
        out = out.view(num_rows, suffix_len, width)[:, self.suffix_len :]
        return self.action_out_proj.forward(out.float())
