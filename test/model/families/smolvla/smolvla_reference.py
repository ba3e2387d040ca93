"""An independent float32 reference of LeRobot's SmolVLA inference (``sample_actions``).

It shares no code with ``vla_sched.model``: the vision tower is transformers'
``SmolVLMVisionTransformer`` and the pixel shuffle transformers' ``SmolVLMConnector``; the
text model's and the expert's weights sit in transformers' ``LlamaModel`` /
``LlamaDecoderLayer`` / ``LlamaRMSNorm`` (their norms and MLPs are called as they are);
what LeRobot adds (``VLAFlowMatching``, ``SmolVLMWithExpertModel``) is written out in plain
torch:

- Prefix: each camera's ``[-1, 1]`` pixels through the tower and the connector, multiplied by
  ``sqrt(text width)`` (a tensor in the features' dtype); the language ids through the token
  embedding times ``math.sqrt(text width)``; the state token ``state_proj(state)``. Pad mask
  ``[images, lang_valid, 1]``, autoregressive mask ``[0 ... 0, 1]`` (images and language do not
  see the state), the 2D mask ``cumsum(ar)[key] <= cumsum(ar)[query] and valid[query] and
  valid[key]`` (``make_att_2d_masks``), positions ``cumsum(valid) - 1``.
- Every VLM layer (only the first ``num_vlm_layers``): norm, q/k/v, LeRobot's RoPE
  (``positions / 10000 ** (2 i / head_dim)`` in float32, halves rotated), eager attention with
  q and k in float32, GQA expanded, masked scores set to the float32 minimum, softmax, o_proj
  and the residual, norm, SiLU MLP, residual. Its post-RoPE K and V are kept.
- Suffix: ``action_time_mlp_out(silu(action_time_mlp_in([action_in_proj(x_t), time])))``,
  autoregressive mask ``[1] * chunk`` (causal actions), seeing every valid prefix token;
  positions ``valid prefix tokens + cumsum - 1``.
- Expert layer ``i``: self-attention layers attend over [the prefix K/V of VLM layer ``i`` ;
  the suffix's own K/V] at those positions; cross-attention layers' queries (positions minus
  their minimum, so from 0) attend to ``k_proj`` / ``v_proj`` of the expert applied to the
  prefix's K and V of layer ``i`` (post-RoPE K, no further rotation), over the valid prefix.
  Final norm, the last ``chunk`` tokens through ``action_out_proj``.
- Euler from t = 1 with ``dt = -1 / steps``: ``x <- x + dt * v``.

``ReferenceSmolVLA.mutated(...)`` returns the same reference with one deliberate error.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

import torch
from torch.nn import functional as F

PREFIX = 'model.vlm_with_expert.'
VISION = PREFIX + 'vlm.model.vision_model.'
CONNECTOR = PREFIX + 'vlm.model.connector.'
TEXT = PREFIX + 'vlm.model.text_model.'
EXPERT = PREFIX + 'lm_expert.'
HEADS = ('state_proj', 'action_in_proj', 'action_out_proj', 'action_time_mlp_in',
         'action_time_mlp_out')  # fmt: skip
MAX_WAVELENGTH = 10_000


@dataclass(frozen=True)
class Mutations:
    """Deliberate errors, each one a way a port of LeRobot's SmolVLA could go wrong."""

    no_image_scale: bool = False  # image features not multiplied by sqrt(width)
    state_visible_to_images: bool = False  # the state token in the bidirectional block
    noncausal_actions: bool = False  # action tokens attend both ways among themselves
    cross_positions_absolute: bool = False  # cross-attention queries not re-based to 0


class PrefixOut(NamedTuple):
    valid: torch.Tensor  # [B, P] bool
    mask: torch.Tensor  # [B, P, P] bool, [b, query, key]
    positions: torch.Tensor  # [B, P]
    keys: list[torch.Tensor]  # per layer [B, P, kv_heads, head_dim], after RoPE
    values: list[torch.Tensor]  # per layer [B, P, kv_heads, head_dim]


def make_att_2d_masks(valid: torch.Tensor, autoregressive: torch.Tensor) -> torch.Tensor:
    """big_vision's rule: a key is seen when its cumulative autoregressive count is at most
    the query's and both are valid. ``[B, N, N]`` bool."""
    count = torch.cumsum(autoregressive.long(), dim=1).expand(valid.shape)
    return (count[:, None, :] <= count[:, :, None]) & valid[:, None, :] & valid[:, :, None]


def apply_rope(x: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
    """LeRobot's RoPE on ``x [B, L, H, D]`` at ``positions [B, L]``, in float32."""
    half = x.shape[-1] // 2
    exponents = (2.0 / x.shape[-1]) * torch.arange(half, dtype=torch.float32)
    timescale = MAX_WAVELENGTH**exponents
    radians = positions[..., None].float() / timescale[None, None, :]
    sin, cos = torch.sin(radians)[..., None, :], torch.cos(radians)[..., None, :]
    x = x.float()
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)


def eager_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor, head_dim: int
) -> torch.Tensor:
    """``q [B, L, H, D]``, ``k``/``v [B, S, Hkv, D]``, ``mask [B, L, S]`` -> ``[B, L, H*D]``."""
    groups = q.shape[2] // k.shape[2]
    k = k.repeat_interleave(groups, dim=2).float()
    v = v.repeat_interleave(groups, dim=2)
    scores = q.float().transpose(1, 2) @ k.transpose(1, 2).transpose(2, 3) * head_dim**-0.5
    scores = torch.where(mask[:, None], scores, torch.finfo(torch.float32).min)
    probs = torch.softmax(scores, dim=-1).to(v.dtype)
    out = (probs @ v.transpose(1, 2)).transpose(1, 2)
    return out.reshape(q.shape[0], q.shape[1], -1)


class _Tensors:
    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self._tensors = {k: v.float() for k, v in tensors.items()}
        self._taken: set[str] = set()

    def one(self, name: str) -> torch.Tensor:
        self._taken.add(name)
        return self._tensors[name]

    def under(self, prefix: str) -> dict[str, torch.Tensor]:
        names = [k for k in self._tensors if k.startswith(prefix)]
        return {k.removeprefix(prefix): self.one(k) for k in names}

    def check_all_taken(self) -> None:
        left = sorted(set(self._tensors) - self._taken)
        if left:
            raise ValueError(f'tensors the reference does not use: {left}')


class ReferenceSmolVLA:
    """LeRobot's SmolVLA ``sample_actions`` in float32 from a folder's tensors."""

    def __init__(
        self, tensors: dict[str, torch.Tensor], *, config: dict[str, Any], vlm: dict[str, Any]
    ) -> None:
        from transformers import LlamaConfig, LlamaModel, SmolVLMConfig
        from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRMSNorm
        from transformers.models.smolvlm.modeling_smolvlm import (
            SmolVLMConnector,
            SmolVLMVisionTransformer,
        )

        self.mutations = Mutations()
        self.config = config
        found = _Tensors(tensors)
        vlm_config = SmolVLMConfig(**vlm)
        vlm_config.vision_config._attn_implementation = 'eager'
        self.vision = SmolVLMVisionTransformer(vlm_config.vision_config).eval()
        self.vision.load_state_dict(found.under(VISION), strict=True)
        self.connector = SmolVLMConnector(vlm_config).eval()
        self.connector.load_state_dict(found.under(CONNECTOR), strict=True)
        text = dict(vlm['text_config'])
        num_layers = int(config['num_vlm_layers'])
        text_config = LlamaConfig(
            vocab_size=text['vocab_size'], hidden_size=text['hidden_size'],
            intermediate_size=text['intermediate_size'], num_hidden_layers=num_layers,
            num_attention_heads=text['num_attention_heads'],
            num_key_value_heads=text['num_key_value_heads'], head_dim=text['head_dim'],
            rms_norm_eps=text['rms_norm_eps'], hidden_act='silu',
        )  # fmt: skip
        self.text = LlamaModel(text_config).eval()
        self.text.load_state_dict(found.under(TEXT), strict=True)
        width = int(text['hidden_size'] * config['expert_width_multiplier'])
        inner = int(2 * width / 3) * 4
        expert_config = LlamaConfig(
            vocab_size=1, hidden_size=width, intermediate_size=256 * ((inner + 255) // 256),
            num_hidden_layers=num_layers, num_attention_heads=text['num_attention_heads'],
            num_key_value_heads=text['num_key_value_heads'], head_dim=text['head_dim'],
            rms_norm_eps=text['rms_norm_eps'], hidden_act='silu', bos_token_id=None,
            eos_token_id=None, pad_token_id=None,
        )  # fmt: skip
        self.expert_layers = torch.nn.ModuleList(
            LlamaDecoderLayer(expert_config, i) for i in range(num_layers)
        ).eval()
        kv_width = text['num_key_value_heads'] * text['head_dim']
        every = int(config['self_attn_every_n_layers'])
        self.cross = [i % every != 0 for i in range(num_layers)]
        for i, layer in enumerate(self.expert_layers):
            if self.cross[i]:
                layer.self_attn.k_proj = torch.nn.Linear(kv_width, kv_width, bias=False)
                layer.self_attn.v_proj = torch.nn.Linear(kv_width, kv_width, bias=False)
            layer.load_state_dict(found.under(f'{EXPERT}layers.{i}.'), strict=True)
        self.expert_norm = LlamaRMSNorm(width, eps=text['rms_norm_eps'])
        self.expert_norm.load_state_dict({'weight': found.one(f'{EXPERT}norm.weight')})
        self.heads = {
            name: (found.one(f'model.{name}.weight'), found.one(f'model.{name}.bias'))
            for name in HEADS
        }
        found.check_all_taken()
        self.head_dim = text['head_dim']
        self.expert_width = width
        for module in (self.vision, self.connector, self.text, self.expert_layers):
            module.requires_grad_(False)

    @classmethod
    def from_folder(cls, folder: str | Path, *, vlm_folder: str | Path) -> ReferenceSmolVLA:
        from safetensors.torch import load_file

        folder = Path(folder)
        return cls(
            load_file(str(folder / 'model.safetensors')),
            config=json.loads((folder / 'config.json').read_text()),
            vlm=json.loads((Path(vlm_folder) / 'config.json').read_text()),
        )

    def mutated(self, **flags: bool) -> ReferenceSmolVLA:
        other = object.__new__(ReferenceSmolVLA)
        other.__dict__.update(self.__dict__)
        other.mutations = dataclasses.replace(self.mutations, **flags)
        return other

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, *self.heads[name])

    # -- prefix ---------------------------------------------------------------------------

    def embed_image(self, pixels: torch.Tensor) -> torch.Tensor:
        hidden = self.vision(pixel_values=pixels.float()).last_hidden_state
        features = self.connector(hidden)
        if self.mutations.no_image_scale:
            return features
        return features * torch.tensor(features.shape[-1] ** 0.5, dtype=features.dtype)

    def embed_language(self, lang_ids: torch.Tensor) -> torch.Tensor:
        embedded = self.text.embed_tokens(lang_ids)
        return embedded * math.sqrt(embedded.shape[-1])

    def _layer_qkv(self, layer, h: torch.Tensor) -> tuple[torch.Tensor, ...]:
        shape = (*h.shape[:2], -1, self.head_dim)
        attn = layer.self_attn
        return attn.q_proj(h).view(shape), attn.k_proj(h).view(shape), attn.v_proj(h).view(shape)

    def _finish_layer(self, layer, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        x = layer.self_attn.o_proj(attended) + x
        return layer.mlp(layer.post_attention_layernorm(x)) + x

    @torch.no_grad()
    def prefix(
        self,
        *,
        pixels: list[torch.Tensor],
        lang_ids: torch.Tensor,
        lang_valid: torch.Tensor,
        state: torch.Tensor,
    ) -> PrefixOut:
        """Images, language and the state token through the VLM's layers; K/V kept."""
        batch = lang_ids.shape[0]
        embeds, valid, ar = [], [], []
        for camera in pixels:
            features = self.embed_image(camera)
            embeds.append(features)
            valid.append(torch.ones(features.shape[:2], dtype=torch.bool))
            ar += [0] * features.shape[1]
        embeds.append(self.embed_language(lang_ids))
        valid.append(lang_valid.bool())
        ar += [0] * lang_ids.shape[1]
        state = F.pad(state.float(), (0, int(self.config['max_state_dim']) - state.shape[-1]))
        embeds.append(self._linear(state, 'state_proj')[:, None])
        valid.append(torch.ones(batch, 1, dtype=torch.bool))
        ar += [0 if self.mutations.state_visible_to_images else 1]
        x, valid = torch.cat(embeds, dim=1), torch.cat(valid, dim=1)
        mask = make_att_2d_masks(valid, torch.tensor([ar]))
        positions = torch.cumsum(valid.long(), dim=1) - 1
        keys, values = [], []
        for layer in self.text.layers:
            q, k, v = self._layer_qkv(layer, layer.input_layernorm(x))
            q, k = apply_rope(q, positions), apply_rope(k, positions)
            keys.append(k)
            values.append(v)
            x = self._finish_layer(layer, x, eager_attention(q, k, v, mask, self.head_dim))
        return PrefixOut(valid, mask, positions, keys, values)

    # -- suffix ---------------------------------------------------------------------------

    def time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        low, high = float(self.config['min_period']), float(self.config['max_period'])
        fraction = torch.linspace(0.0, 1.0, self.expert_width // 2, dtype=torch.float64)
        period = low * (high / low) ** fraction
        angle = (1.0 / period * 2 * math.pi)[None, :] * t.double()[:, None]
        return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).float()

    def embed_suffix(self, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        actions = self._linear(x_t.float(), 'action_in_proj')
        time = self.time_embedding(t)[:, None].expand_as(actions)
        mixed = self._linear(torch.cat([actions, time], dim=-1), 'action_time_mlp_in')
        return self._linear(F.silu(mixed), 'action_time_mlp_out')

    def suffix_layout(self, prefix: PrefixOut, chunk: int) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, chunk, P + chunk]`` mask and ``[B, chunk]`` positions of the action tokens."""
        batch = prefix.valid.shape[0]
        ar = [1] + [0] * (chunk - 1) if self.mutations.noncausal_actions else [1] * chunk
        own = make_att_2d_masks(torch.ones(batch, chunk, dtype=torch.bool), torch.tensor([ar]))
        seen = prefix.valid[:, None, :].expand(batch, chunk, prefix.valid.shape[1])
        offsets = prefix.valid.sum(dim=1, keepdim=True)
        positions = offsets + torch.arange(chunk)[None, :]
        return torch.cat([seen, own], dim=2), positions

    @torch.no_grad()
    def velocity(self, prefix: PrefixOut, *, x_t: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        """One denoising step's ``v_t``: ``[B, chunk, max_action_dim]``."""
        x = self.embed_suffix(x_t, t)
        chunk, length = x.shape[1], prefix.valid.shape[1]
        mask, positions = self.suffix_layout(prefix, chunk)
        for i, layer in enumerate(self.expert_layers):
            h = layer.input_layernorm(x)
            shape = (*h.shape[:2], -1, self.head_dim)
            if self.cross[i]:
                q = layer.self_attn.q_proj(h).view(shape)
                rebased = positions
                if not self.mutations.cross_positions_absolute:
                    rebased = positions - positions.min(dim=1, keepdim=True).values
                q = apply_rope(q, rebased)
                keys, values = prefix.keys[i], prefix.values[i]
                k = layer.self_attn.k_proj(keys.reshape(*keys.shape[:2], -1)).view(
                    *keys.shape[:2], -1, self.head_dim
                )
                v = layer.self_attn.v_proj(values.reshape(*values.shape[:2], -1)).view(
                    *values.shape[:2], -1, self.head_dim
                )
                attended = eager_attention(q, k, v, mask[:, :, :length], self.head_dim)
            else:
                q, k, v = self._layer_qkv(layer, h)
                q, k = apply_rope(q, positions), apply_rope(k, positions)
                k = torch.cat([prefix.keys[i], k], dim=1)
                v = torch.cat([prefix.values[i], v], dim=1)
                attended = eager_attention(q, k, v, mask, self.head_dim)
            x = self._finish_layer(layer, x, attended)
        out = self.expert_norm(x)[:, -chunk:]
        return self._linear(out.float(), 'action_out_proj')

    @torch.no_grad()
    def sample_actions(
        self,
        *,
        pixels: list[torch.Tensor],
        lang_ids: torch.Tensor,
        lang_valid: torch.Tensor,
        state: torch.Tensor,
        noise: torch.Tensor,
        num_steps: int,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Normalized actions ``[B, chunk, max_action_dim]`` and every step's velocity."""
        prefix = self.prefix(pixels=pixels, lang_ids=lang_ids, lang_valid=lang_valid, state=state)
        dt = -1.0 / num_steps
        x_t, velocities = noise.float(), []
        for step in range(num_steps):
            t = torch.full((noise.shape[0],), 1.0 + step * dt, dtype=torch.float32)
            v_t = self.velocity(prefix, x_t=x_t, t=t)
            velocities.append(v_t)
            x_t = x_t + dt * v_t
        return x_t, velocities
