"""SmolVLA on the engine's paged KV: SmolVLM2's prefix and the action expert's denoising passes.

The prefix is ``[camera 0 tokens | camera 1 tokens | ... | language | state]``: each camera's
image through transformers' SmolVLM vision tower, the pixel shuffle (``scale_factor ** 2``
patches into one token) and the connector's projection, times ``sqrt(text width)`` (the scale a
tensor in the model dtype, as LeRobot multiplies it); the language embeddings times
``math.sqrt(text width)``; the state token ``state_proj(state)``. It runs through the first
``num_vlm_layers`` text layers (Llama: RMSNorm ``w * x_hat``, SiLU MLP) on the shared paged
decoder as one extend row per robot, images and language attending both ways among
themselves (an ``image_spans`` span over all but the last token) and the state token causal at
the end, so nothing before it sees it. Its per-layer K/V stay in the paged cache.

A denoising pass runs the action tokens ``action_time_mlp_out(silu(action_time_mlp_in(
[action_in_proj(x), time_emb])))`` through the expert, causal among themselves. Expert layer
``i`` is either

- joint self-attention (even layers): its own q/k/v over [the prefix K/V of VLM layer ``i``;
  the actions' K/V] at positions ``P ..`` after the prefix's ``P`` tokens; or
- cross-attention (odd layers): its queries at positions ``0 ..`` attend over the whole
  prefix to the expert's ``k_proj`` / ``v_proj`` of VLM layer ``i``'s post-RoPE K and V. Those
  are computed once, at the prefix pass (``store_cross_kv``), into a cross cache at the
  prefix's own slots.

RoPE is LeRobot's (``positions / 10000 ** (2 i / head_dim)`` in float32, the halves rotated;
the VLM config's ``rope_theta`` is not used), built here into the shared kernels' tables. The
expert's final norm, then ``action_out_proj`` in float32, give the velocity.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from vla_sched.kernels.decode_attention import run_decode_attention
from vla_sched.kernels.rotary import run_rotary_embedding
from vla_sched.model.config.architecture import DecoderSpec, RopeSpec
from vla_sched.model.families.pi0.checkpoint import GemmaSize
from vla_sched.model.families.pi0.model import time_embedding
from vla_sched.model.families.smolvla.checkpoint import SmolVLASizes
from vla_sched.model.layers.attention import AttentionMetadata
from vla_sched.model.layers.decoder import KVCache, PagedDecoder, RMSNorm, SelfAttention, SwiGLU
from vla_sched.model.layers.rope import RopeTables

MAX_WAVELENGTH = 10_000.0


def smolvla_rope_tables(positions: torch.Tensor, head_dim: int, dtype: torch.dtype) -> RopeTables:
    """LeRobot's ``apply_rope`` as the shared kernels' tables: the angle of pair ``i`` at
    position ``p`` is ``p / 10000 ** ((2 / head_dim) * i)`` in float32."""
    half = head_dim // 2
    exponents = (2.0 / head_dim) * torch.arange(half, dtype=torch.float32, device=positions.device)
    timescale = MAX_WAVELENGTH**exponents
    radians = positions.to(torch.float32)[:, None] / timescale[None, :]
    cos, sin = torch.cos(radians), torch.sin(radians)
    return RopeTables(
        cos=torch.cat([cos, cos], dim=-1).to(dtype),
        signed_sin=torch.cat([-sin, sin], dim=-1).to(dtype),
    )


def decoder_spec(size: GemmaSize, *, vocab_size: int, eps: float) -> DecoderSpec:
    """Our decoder spec of one Llama stack (the text model or the expert)."""
    return DecoderSpec(
        model_type='llama',
        vocab_size=vocab_size,
        hidden_size=size.width,
        num_layers=size.depth,
        num_heads=size.num_heads,
        num_kv_heads=size.num_kv_heads,
        head_dim=size.head_dim,
        intermediate_size=size.mlp_dim,
        rms_norm_eps=eps,
        rope=RopeSpec(theta=MAX_WAVELENGTH),
        tie_word_embeddings=True,  # no LM head: the prefix's hidden states are not read
        hidden_act='silu',
    )


def pixel_shuffle(hidden: torch.Tensor, scale: int) -> torch.Tensor:
    """``[N, side * side, E]`` patches -> ``[N, (side / scale) ** 2, scale * scale * E]``: each
    ``scale x scale`` block of patches becomes one token, its rows then columns concatenated
    (SmolVLM's connector order)."""
    num, seq, width = hidden.shape
    side = math.isqrt(seq)
    blocks = side // scale
    x = hidden.reshape(num, blocks, scale, blocks, scale, width).permute(0, 1, 3, 2, 4, 5)
    return x.reshape(num, blocks * blocks, scale * scale * width)


class CrossAttention(nn.Module):
    """An expert layer's attention to the prefix: queries from the actions, keys and values
    the expert's projections of the VLM layer's cached K/V (computed once per prefix)."""

    def __init__(self, spec: DecoderSpec, *, kv_width: int, factory: dict) -> None:
        super().__init__()
        self.spec = spec
        self.q_proj = nn.Linear(spec.hidden_size, spec.q_size, bias=False, **factory)
        self.k_proj = nn.Linear(kv_width, spec.kv_size, bias=False, **factory)
        self.v_proj = nn.Linear(kv_width, spec.kv_size, bias=False, **factory)
        self.o_proj = nn.Linear(spec.q_size, spec.hidden_size, bias=False, **factory)

    def project_prefix(
        self, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """The VLM's post-RoPE ``k``, ``v`` ``[N, kv_heads, head_dim]`` -> the expert's."""
        shape = (k.shape[0], self.spec.num_kv_heads, self.spec.head_dim)
        return (
            self.k_proj.forward(k.reshape(k.shape[0], -1)).view(shape),
            self.v_proj.forward(v.reshape(v.shape[0], -1)).view(shape),
        )

    def forward(
        self, x: torch.Tensor, rope: RopeTables, cross_cache: KVCache, reads: CrossReads
    ) -> torch.Tensor:
        spec = self.spec
        q = self.q_proj.forward(x).view(x.shape[0], spec.num_heads, spec.head_dim)
        run_rotary_embedding(qk=q, cos=rope.cos, signed_sin=rope.signed_sin, backend=reads.backend)
        out = run_decode_attention(
            q=q,
            k_cache=cross_cache[0],
            v_cache=cross_cache[1],
            req_to_token=reads.req_to_token,
            req_pool_indices=reads.rows,
            seq_lens=reads.prefix_lens,
            sm_scale=spec.sm_scale,
            backend=reads.backend,
        )
        return self.o_proj.forward(out.reshape(x.shape[0], spec.q_size))


class CrossReads:
    """What every action token of a denoising pass reads in the cross caches: its request's
    row of the slot table and its prefix length (one entry per token)."""

    def __init__(
        self, *, req_to_token: torch.Tensor, rows: torch.Tensor, prefix_lens: torch.Tensor,
        backend: str,
    ) -> None:  # fmt: skip
        self.req_to_token = req_to_token
        self.rows = rows
        self.prefix_lens = prefix_lens
        self.backend = backend


class SmolVLAExpertLayer(nn.Module):
    """A Llama block of the action expert whose attention is joint or cross (see module)."""

    def __init__(self, spec: DecoderSpec, *, cross: bool, kv_width: int, factory: dict) -> None:
        super().__init__()
        self.cross = cross
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **factory)
        self.self_attn = (
            CrossAttention(spec, kv_width=kv_width, factory=factory)
            if cross
            else SelfAttention(spec, factory)
        )
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **factory)
        self.mlp = SwiGLU(spec, factory)

    def forward(
        self,
        x: torch.Tensor,
        *,
        rope: RopeTables,
        cross_rope: RopeTables,
        kv_cache: KVCache,
        cross_cache: KVCache | None,
        meta: AttentionMetadata,
        reads: CrossReads,
    ) -> torch.Tensor:
        hidden = self.input_layernorm.forward(x, backend=meta.backend)
        if self.cross:
            hidden = self.self_attn.forward(hidden, cross_rope, cross_cache, reads)
        else:
            hidden = self.self_attn.forward(hidden, rope, kv_cache, meta)
        x = x + hidden
        hidden = self.post_attention_layernorm.forward(x, backend=meta.backend)
        return x + self.mlp.forward(hidden, backend=meta.backend)


class SmolVLAModel(nn.Module):
    """SmolVLM2's tower, connector and first text layers on paged KV, the action expert and
    SmolVLA's projections (see the module docstring).

    Args:
        sizes: the folder's sizes.
        max_state_dim, max_action_dim: the padded state and action widths.
        min_period, max_period: the time embedding's periods.
        vision_tower: transformers' ``SmolVLMVisionTransformer`` (built by the loader).
        device, dtype: where and in which dtype the model lives; the state/action/time
            projections stay float32.
    """

    def __init__(
        self,
        *,
        sizes: SmolVLASizes,
        max_state_dim: int,
        max_action_dim: int,
        min_period: float,
        max_period: float,
        vision_tower: nn.Module,
        device: torch.device | str = 'cpu',
        dtype: torch.dtype = torch.float32,
    ) -> None:
        super().__init__()
        self.sizes = sizes
        self.max_state_dim, self.max_action_dim = max_state_dim, max_action_dim
        self.min_period, self.max_period = min_period, max_period
        factory = {'device': device, 'dtype': dtype}
        f32 = {'device': device, 'dtype': torch.float32}
        text, eps = sizes.text, sizes.rms_norm_eps
        self.vision_tower = vision_tower
        shuffled = sizes.vision.hidden_size * sizes.scale_factor**2
        self.connector = nn.Linear(shuffled, text.width, bias=False, **factory)
        self.language = PagedDecoder(
            decoder_spec(text, vocab_size=sizes.vocab_size, eps=eps), device=device, dtype=dtype
        )
        expert_spec = decoder_spec(sizes.expert, vocab_size=1, eps=eps)
        kv_width = text.num_kv_heads * text.head_dim
        self.expert = nn.ModuleList(
            SmolVLAExpertLayer(expert_spec, cross=i in sizes.cross_layers, kv_width=kv_width,
                        factory=factory)
            for i in range(sizes.expert.depth)
        )  # fmt: skip
        self.expert_norm = RMSNorm(sizes.expert.width, eps, **factory)
        width = sizes.expert.width
        self.state_proj = nn.Linear(max_state_dim, text.width, **f32)
        self.action_in_proj = nn.Linear(max_action_dim, width, **f32)
        self.action_out_proj = nn.Linear(width, max_action_dim, **f32)
        self.action_time_mlp_in = nn.Linear(2 * width, width, **f32)
        self.action_time_mlp_out = nn.Linear(width, width, **f32)

    @property
    def head_dim(self) -> int:
        return self.sizes.text.head_dim

    @property
    def dtype(self) -> torch.dtype:
        return self.language.dtype

    @property
    def device(self) -> torch.device:
        return self.language.device

    def allocate_kv_cache(self, num_slots: int) -> list[KVCache]:
        return self.language.allocate_kv_cache(num_slots)

    def allocate_cross_cache(self, num_slots: int) -> dict[int, KVCache]:
        """The cross layers' projected prefix K/V, indexed by the prefix's own slots."""
        spec = self.language.spec
        shape = (num_slots, spec.num_kv_heads, spec.head_dim)
        factory = {'device': self.device, 'dtype': self.dtype}
        return {
            i: (torch.zeros(shape, **factory), torch.zeros(shape, **factory))
            for i in self.sizes.cross_layers
        }

    def rope(self, positions: torch.Tensor) -> RopeTables:
        return smolvla_rope_tables(positions.to(self.device), self.head_dim, self.dtype)

    # ---- the prefix ---------------------------------------------------------------------

    def image_features(self, pixels: torch.Tensor) -> torch.Tensor:
        """``[N, 3, S, S]`` pixels in [-1, 1] -> ``[N, tokens, text width]``, scaled."""
        pixels = pixels.to(device=self.device, dtype=self.dtype)
        hidden = self.vision_tower(pixel_values=pixels).last_hidden_state
        features = self.connector.forward(pixel_shuffle(hidden, self.sizes.scale_factor))
        scale = torch.tensor(features.shape[-1] ** 0.5, dtype=features.dtype)
        return features * scale.to(features.device)

    def language_embeddings(self, input_ids: torch.Tensor) -> torch.Tensor:
        embedded = self.language.embed(input_ids.to(self.device))
        return embedded * math.sqrt(embedded.shape[-1])

    def state_embeddings(self, state: torch.Tensor) -> torch.Tensor:
        """``[B, max_state_dim]`` normalized states -> ``[B, text width]`` state tokens."""
        return self.state_proj.forward(state.to(self.device, torch.float32)).to(self.dtype)

    def run_prefix(
        self, embeds: torch.Tensor, meta: AttentionMetadata, kv_caches: list[KVCache]
    ) -> None:
        """The text layers over the prefix rows; their K/V stay in the cache."""
        self.language.forward(embeds, meta, kv_caches, rope=self.rope(meta.positions))

    def store_cross_kv(
        self, slots: torch.Tensor, kv_caches: list[KVCache], cross_caches: dict[int, KVCache]
    ) -> None:
        """Each cross layer's projections of the prefix K/V at ``slots``, stored there."""
        slots = slots.to(self.device)
        for i, (k_cache, v_cache) in cross_caches.items():
            k, v = self.expert[i].self_attn.project_prefix(
                kv_caches[i][0][slots], kv_caches[i][1][slots]
            )
            k_cache[slots] = k
            v_cache[slots] = v

    # ---- a denoising pass ---------------------------------------------------------------

    def action_tokens(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """``[B, chunk, expert width]`` action tokens in the model dtype."""
        emb = time_embedding(
            t.to(self.device), dim=self.sizes.expert.width, min_period=self.min_period,
            max_period=self.max_period,
        )  # fmt: skip
        actions = self.action_in_proj.forward(x_t.to(self.device, torch.float32))
        mixed = torch.cat([actions, emb[:, None, :].expand_as(actions)], dim=-1)
        tokens = self.action_time_mlp_out.forward(F.silu(self.action_time_mlp_in.forward(mixed)))
        return tokens.to(self.dtype)

    def velocity(
        self,
        *,
        x_t: torch.Tensor,
        t: torch.Tensor,
        meta: AttentionMetadata,
        reads: CrossReads,
        kv_caches: list[KVCache],
        cross_caches: dict[int, KVCache],
    ) -> torch.Tensor:
        """The velocity ``[B, chunk, max_action_dim]`` (float32) of ``B`` rows; ``meta``
        describes the actions over their rows' prefixes (joint layers), ``reads`` the prefixes
        the cross layers read."""
        tokens = self.action_tokens(x_t, t)
        num_rows, chunk, width = tokens.shape
        x = tokens.reshape(num_rows * chunk, width)
        rope = self.rope(meta.positions)
        cross_positions = torch.arange(chunk, device=self.device).repeat(num_rows)
        cross_rope = self.rope(cross_positions)
        for i, layer in enumerate(self.expert):
            x = layer.forward(
                x, rope=rope, cross_rope=cross_rope, kv_cache=kv_caches[i],
                cross_cache=cross_caches.get(i), meta=meta, reads=reads,
            )  # fmt: skip
        out = self.expert_norm.forward(x, backend=meta.backend).view(num_rows, chunk, width)
        return self.action_out_proj.forward(out.float())
