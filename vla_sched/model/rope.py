"""Rotary position embeddings: inverse frequencies (default, linear, llama3) and rotation.

The arithmetic follows transformers' Llama code step for step (float32 frequencies,
``cos``/``sin`` cast to the activation dtype, rotate-half pairing), so logits agree to
float32 rounding.
"""

from __future__ import annotations

import math

import torch

from vla_sched.model.architecture import RopeSpec


def rope_inv_freq(rope: RopeSpec, head_dim: int) -> torch.Tensor:
    """Inverse frequencies ``[head_dim // 2]`` (float32) for a RoPE variant.

    ``linear`` divides every frequency by ``factor``. ``llama3`` (Llama 3.1) keeps the high
    frequencies, divides the low ones by ``factor`` and blends the band in between.
    """
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64).to(torch.float32) / head_dim
    inv_freq = 1.0 / (rope.theta**exponents)
    if rope.rope_type == 'linear':
        return inv_freq / rope.factor
    if rope.rope_type == 'llama3':
        return _llama3_inv_freq(inv_freq, rope)
    return inv_freq


def _llama3_inv_freq(inv_freq: torch.Tensor, rope: RopeSpec) -> torch.Tensor:
    old_context_len = rope.original_max_position_embeddings
    low_freq_wavelen = old_context_len / rope.low_freq_factor
    high_freq_wavelen = old_context_len / rope.high_freq_factor
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_freq_wavelen, inv_freq / rope.factor, inv_freq)
    smooth = (old_context_len / wavelen - rope.low_freq_factor) / (
        rope.high_freq_factor - rope.low_freq_factor
    )
    smoothed = (1 - smooth) * scaled / rope.factor + smooth * scaled
    is_medium = ~(wavelen < high_freq_wavelen) * ~(wavelen > low_freq_wavelen)
    return torch.where(is_medium, smoothed, scaled)


def rope_cos_sin(
    positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """``cos`` and ``sin`` tables ``[T, head_dim]`` for token positions ``[T]``."""
    freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [T, heads, head_dim]`` by per-token ``cos``/``sin`` ``[T, head_dim]``."""
    cos = cos[:, None, :]
    sin = sin[:, None, :]
    return x * cos + _rotate_half(x) * sin
