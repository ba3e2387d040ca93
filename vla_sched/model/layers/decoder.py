"""A Llama/Qwen2-family decoder whose attention runs on the engine's paged KV cache.

Tokens of all requests in a step are packed back to back (``[T, hidden]``, no padding);
positions, cache slots and what each token attends to come from ``AttentionMetadata``.

The layers are built as vLLM and SGLang build Llama: q/k/v are one projection
(``self_attn.qkv_proj``) and gate/up another (``mlp.gate_up_proj``), whose rows are the
checkpoint's ``q_proj``/``k_proj``/``v_proj`` and ``gate_proj``/``up_proj`` tensors
concatenated at load (``loading/weights.py``); every other parameter keeps transformers'
name (``layers.0.input_layernorm.weight``, ...). Each layer hands the residual stream to the
next one un-added, and the next norm adds it (``fused_add_rms_norm``); queries and keys are
rotated in place in the QKV output (one ``rotary_embedding`` over both); SiLU and the
product run as one ``silu_and_mul``. Those three run on the step's kernel backend
(``meta.backend``: Triton on CUDA, their torch twins elsewhere), with transformers'
arithmetic and rounding order.

Inside a step the layers call their parts' ``forward`` directly: the module call machinery
(hooks, which nothing here registers) would cost more than a small model's matmuls.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F

from vla_sched.kernels.activation import gelu_tanh_and_mul_torch, run_silu_and_mul
from vla_sched.kernels.rms_norm import run_fused_add_rms_norm, run_rms_norm
from vla_sched.kernels.rotary import run_rotary_embedding
from vla_sched.model.config.architecture import DecoderSpec
from vla_sched.model.layers.attention import AttentionMetadata, paged_attention
from vla_sched.model.layers.rope import RopeTables, rope_inv_freq, rope_tables

KVCache = tuple[torch.Tensor, torch.Tensor]


class RMSNorm(nn.Module):
    """Root-mean-square norm computed in float32, scaled in the input dtype; ``add_and_norm``
    adds the residual stream first and returns the new stream too."""

    def __init__(self, hidden_size: int, eps: float, *, device=None, dtype=None) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.eps = eps

    def forward(self, x: torch.Tensor, *, backend: str = 'auto') -> torch.Tensor:
        return run_rms_norm(x=x, weight=self.weight, eps=self.eps, backend=backend)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor, *, backend: str = 'auto'
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``(norm(x + residual), x + residual)``."""
        return run_fused_add_rms_norm(
            x=x, residual=residual, weight=self.weight, eps=self.eps, backend=backend
        )


def _linear(n_in: int, n_out: int, bias: bool, factory: dict) -> nn.Linear:
    return nn.Linear(n_in, n_out, bias=bias, **factory)


class SelfAttention(nn.Module):
    """GQA self-attention with RoPE; K/V go through the paged cache."""

    def __init__(self, spec: DecoderSpec, factory: dict) -> None:
        super().__init__()
        self.spec = spec
        qkv_size = spec.q_size + 2 * spec.kv_size
        self.qkv_proj = _linear(spec.hidden_size, qkv_size, spec.qkv_bias, factory)
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
        num_q, num_qk = spec.num_heads, spec.num_heads + spec.num_kv_heads
        qkv = self.qkv_proj.forward(x).view(num_tokens, num_qk + spec.num_kv_heads, spec.head_dim)
        run_rotary_embedding(
            qk=qkv[:, :num_qk], cos=rope.cos, signed_sin=rope.signed_sin, backend=meta.backend
        )
        out = paged_attention(
            q=qkv[:, :num_q],
            k=qkv[:, num_q:num_qk],
            v=qkv[:, num_qk:],
            k_cache=kv_cache[0],
            v_cache=kv_cache[1],
            meta=meta,
            sm_scale=spec.sm_scale,
        )
        return self.o_proj.forward(out.reshape(num_tokens, spec.q_size))


class SwiGLU(nn.Module):
    """``down(act(gate(x)) * up(x))``, gate and up as one projection; ``act`` is SiLU, or
    Gemma's tanh-approximated GELU (``spec.hidden_act``, torch only)."""

    def __init__(self, spec: DecoderSpec, factory: dict) -> None:
        super().__init__()
        size, inner = spec.hidden_size, spec.intermediate_size
        self.gate_up_proj = _linear(size, 2 * inner, spec.mlp_bias, factory)
        self.down_proj = _linear(inner, size, spec.mlp_bias, factory)
        self.gelu = spec.hidden_act == 'gelu_pytorch_tanh'

    def forward(self, x: torch.Tensor, *, backend: str = 'auto') -> torch.Tensor:
        gate_up = self.gate_up_proj.forward(x)
        if self.gelu:
            return self.down_proj.forward(gelu_tanh_and_mul_torch(gate_up=gate_up))
        return self.down_proj.forward(run_silu_and_mul(gate_up=gate_up, backend=backend))


class DecoderLayer(nn.Module):
    """Pre-norm transformer block: attention then SwiGLU, each with a residual.

    The block's output is returned beside the residual stream, not added to it: the next
    norm (the next block's or the final one) adds them in its own pass.
    """

    def __init__(self, spec: DecoderSpec, factory: dict) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **factory)
        self.self_attn = SelfAttention(spec, factory)
        self.post_attention_layernorm = RMSNorm(spec.hidden_size, spec.rms_norm_eps, **factory)
        self.mlp = SwiGLU(spec, factory)

    def forward(
        self,
        x: torch.Tensor,
        residual: torch.Tensor | None,
        rope: RopeTables,
        kv_cache: KVCache,
        meta: AttentionMetadata,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``x``: the previous block's output (the embeddings for the first block, whose
        ``residual`` is None). Returns this block's output and the residual stream."""
        backend = meta.backend
        if residual is None:
            residual = x
            hidden = self.input_layernorm.forward(x, backend=backend)
        else:
            hidden, residual = self.input_layernorm.add_and_norm(x, residual, backend=backend)
        hidden = self.self_attn.forward(hidden, rope, kv_cache, meta)
        hidden, residual = self.post_attention_layernorm.add_and_norm(
            hidden, residual, backend=backend
        )
        return self.mlp.forward(hidden, backend=backend), residual


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
        x, residual = inputs_embeds, None
        for layer, kv_cache in zip(self.layers, kv_caches, strict=True):
            x, residual = layer.forward(x, residual, rope, kv_cache, meta)
        return self.norm.add_and_norm(x, residual, backend=meta.backend)[0]

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """LM-head logits in float32."""
        weight = self.embed_tokens.weight if self.lm_head is None else self.lm_head.weight
        return F.linear(hidden, weight).float()
