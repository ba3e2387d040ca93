"""A Llama/Qwen2-family decoder whose attention runs on the engine's paged KV cache.

Tokens of all requests in a step are packed back to back (``[T, hidden]``, no padding);
positions, cache slots and what each token attends to come from ``AttentionMetadata``.
Parameter names match transformers' ``LlamaModel``/``Qwen2Model`` (``layers.0.self_attn
.q_proj.weight``, ...), so a checkpoint's tensors load by name.

Inside a step the layers call their parts' ``forward`` directly: the module call machinery
(hooks, which nothing here registers) would cost more than a small model's matmuls.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from vla_sched.model.config.architecture import DecoderSpec
from vla_sched.model.layers.attention import AttentionMetadata, paged_attention
from vla_sched.model.layers.rope import RopeTables, apply_rope, rope_inv_freq, rope_tables

KVCache = tuple[torch.Tensor, torch.Tensor]


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, scaled in the input dtype."""

    def __init__(self, hidden_size: int, eps: float, *, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        input_dtype = x.dtype
        if input_dtype == torch.float32:  # no casts to do: the fused op, same arithmetic
            return F.rms_norm(x, self.weight.shape, self.weight, self.eps)
        x32 = x.to(torch.float32)
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(input_dtype)


def _linear(n_in: int, n_out: int, bias: bool, factory: dict) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=bias, **factory)


class SelfAttention(nn.Module):
    """GQA self-attention with RoPE; K/V go through the paged cache."""

    def __init__(self, spec: DecoderSpec, factory: dict) -> None:
        super().__init__()
        self.spec = spec
        self.q_proj = _linear(spec.hidden_size, spec.q_size, spec.qkv_bias, factory)
        self.k_proj = _linear(spec.hidden_size, spec.kv_size, spec.qkv_bias, factory)
        self.v_proj = _linear(spec.hidden_size, spec.kv_size, spec.qkv_bias, factory)
        self.o_proj = _linear(spec.q_size, spec.hidden_size, spec.o_bias, factory)

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        spec = self.spec
        num_tokens = x.shape[0]
        q = self.q_proj.forward(x).view(num_tokens, spec.num_heads, spec.head_dim)
        k = self.k_proj.forward(x).view(num_tokens, spec.num_kv_heads, spec.head_dim)
        v = self.v_proj.forward(x).view(num_tokens, spec.num_kv_heads, spec.head_dim)
        q = apply_rope(q, rope)
        k = apply_rope(k, rope)
        out = paged_attention(
            q=q,
            k=k,
            v=v.contiguous(),
            k_cache=kv_cache[0],
            v_cache=kv_cache[1],
            meta=meta,
            sm_scale=spec.sm_scale,
        )
        return self.o_proj.forward(out.reshape(num_tokens, spec.q_size))


class SwiGLU(nn.Module):
    """``down(silu(gate(x)) * up(x))``."""

    def __init__(self, spec: DecoderSpec, factory: dict) -> None:
        super().__init__()
        size, inner = spec.hidden_size, spec.intermediate_size
        self.gate_proj = _linear(size, inner, spec.mlp_bias, factory)
        self.up_proj = _linear(size, inner, spec.mlp_bias, factory)
        self.down_proj = _linear(inner, size, spec.mlp_bias, factory)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = F.silu(self.gate_proj.forward(x))
        return self.down_proj.forward(gate * self.up_proj.forward(x))


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: attention then SwiGLU, each with a residual."""

    def __init__(self, spec: DecoderSpec, factory: dict) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **factory)
        self.self_attn = SelfAttention(spec, factory)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **factory)
        self.mlp = SwiGLU(spec, factory)

    def forward(
        self,
        x: torch.Tensor,
        rope: RopeTables,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        x = x + self.self_attn.forward(self.input_layernorm.forward(x), rope, kv_cache, meta)
        return x + self.mlp.forward(self.post_attention_layernorm.forward(x))


class PagedDecoder(nn.Module):
    """Token embedding, decoder layers, final norm and LM head.

    Args:
        spec: The decoder's dimensions.
        device: Where the parameters live.
        dtype: Parameter and activation dtype.
    """

    def __init__(
        self, spec: DecoderSpec, *, device: torch.device | str = 'cpu', dtype=torch.float32
    ) -> None:
        super().__init__()
        factory = {'device': device, 'dtype': dtype}
        self.spec = spec
        self.embed_tokens = nn.Embedding(spec.vocab_size, spec.hidden_size, **factory)
        self.layers = nn.ModuleList(DecoderLayer(spec, factory) for _ in range(spec.num_layers))
        self.norm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **factory)
        self.lm_head = None
        if not spec.tie_word_embeddings:
            self.lm_head = nn.Linear(spec.hidden_size, spec.vocab_size, bias=False, **factory)
        self.register_buffer('inv_freq', torch.empty(0), persistent=False)
        self.init_rope(torch.device(device))

    def init_rope(self, device: torch.device) -> None:
        """(Re)compute the RoPE inverse frequencies on ``device`` (after a meta build)."""
        self.inv_freq = rope_inv_freq(self.spec.rope, self.spec.head_dim).to(device)

    @property
    def dtype(self) -> torch.dtype:
        return self.embed_tokens.weight.dtype

    @property
    def device(self) -> torch.device:
        return self.embed_tokens.weight.device

    def allocate_kv_cache(self, num_slots: int) -> list[KVCache]:
        """Per-layer ``(k_cache, v_cache)``, each ``[num_slots, num_kv_heads, head_dim]``."""
        shape = (num_slots, self.spec.num_kv_heads, self.spec.head_dim)
        factory = {'device': self.device, 'dtype': self.dtype}
        return [
            (torch.zeros(shape, **factory), torch.zeros(shape, **factory))
            for _ in range(self.spec.num_layers)
        ]

    def embed(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.embed_tokens(input_ids)

    def rope_tables(self, num_positions: int) -> RopeTables:
        """RoPE tables of positions ``0 .. num_positions - 1`` in the model's dtype, for a
        caller that looks a step's positions up instead of building them every step."""
        positions = torch.arange(num_positions, dtype=torch.int64, device=self.device)
        return rope_tables(positions, self.inv_freq, self.dtype)

    def forward(
        self,
        inputs_embeds: torch.Tensor,
        meta: AttentionMetadata,
        kv_caches: list[KVCache],
        *,
        rope: RopeTables | None = None,
    ) -> torch.Tensor:
        """Run all layers on ``[T, hidden]`` embeddings; returns the final-normed hidden.

        ``rope``: the tables of ``meta.positions`` if the caller has them (else built here).
        """
        if len(kv_caches) != self.spec.num_layers:
            raise ValueError(f'need {self.spec.num_layers} KV caches, got {len(kv_caches)}')
        if rope is None:
            rope = rope_tables(meta.positions, self.inv_freq, inputs_embeds.dtype)
        x = inputs_embeds
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x = layer.forward(x, rope, kv_cache, meta)
        return self.norm.forward(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits in float32."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()
