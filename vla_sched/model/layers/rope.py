"""Rotary position embeddings: inverse frequencies (default, linear, llama3) and rotation.

The arithmetic follows transformers' Llama code step for step (float32 frequencies,
``cos``/``sin`` cast to the activation dtype, rotate-half pairing), so logits agree to
float32 rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from vla_sched.model.config.architecture import RopeSpec


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


@dataclass(frozen=True, slots=True, eq=False)
class RopeTables:
    """One step's rotation, built once for every layer: ``cos [T, head_dim]`` and ``sin``
    with its first half negated (``signed_sin [T, head_dim]``), as
    ``vla_sched.kernels.rotary`` takes them."""

    cos: torch.Tensor
    signed_sin: torch.Tensor

    def at(self, rows: torch.Tensor) -> RopeTables:
        """The rows ``rows [T]`` of tables built for positions ``0, 1, ...``: the tables of
        those positions, as :func:`rope_tables` would build them (the same elementwise
        arithmetic on the same inputs), by two lookups."""
        return RopeTables(
            cos=self.cos.index_select(0, rows), signed_sin=self.signed_sin.index_select(0, rows)
        )


def rope_tables(positions: torch.Tensor, inv_freq: torch.Tensor, dtype: torch.dtype) -> RopeTables:
    """The tables of :func:`apply_rope` for token positions ``[T]``."""
    cos, sin = rope_cos_sin(positions, inv_freq, dtype)
    half = sin.shape[-1] // 2
    signed_sin = torch.cat((-sin[:, :half], sin[:, half:]), dim=-1)
    return RopeTables(cos=cos, signed_sin=signed_sin)


def apply_rope(x: torch.Tensor, tables: RopeTables) -> torch.Tensor:
    """Rotate ``x [T, heads, head_dim]`` by its tokens' tables, out of place.

    ``x * cos + rotate_half(x) * sin`` with ``rotate_half(x) = cat(-x2, x1)``: swapping the
    halves of ``x`` (a roll by half) and negating the first half of ``sin`` instead gives
    the same products, bit for bit, in fewer operations. The decoder rotates its queries
    and keys in place with ``vla_sched.kernels.rotary``, the same arithmetic.
    """
    swapped = x.roll(x.shape[-1] // 2, dims=-1)
    return x * tables.cos[:, None, :] + swapped * tables.signed_sin[:, None, :]
