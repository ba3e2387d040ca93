"""An independent float32 reference of LeRobot's pi0 and pi0.5 inference (``sample_actions``).

It shares no code with ``vla_sched.model``: the vision tower is transformers'
``SiglipVisionModel``, the PaliGemma language model transformers' ``GemmaModel`` (its scaled
token embedding, decoder layers and final norm), the action expert transformers'
``GemmaDecoderLayer`` / ``GemmaRMSNorm`` / ``GemmaRotaryEmbedding``; what LeRobot adds
(``PI0Pytorch`` / ``PI05Pytorch``, ``PaliGemmaWithExpertModel``, ``pi_gemma``) is written out
in plain torch:

- Prefix: each camera's ``[-1, 1]`` pixels through SigLIP (its post-layernorm output) and the
  projector, not scaled; the language ids through the scaled embedding (``x sqrt(width)`` in
  the weight's dtype); valid = [each camera's flag, ``lang_valid``], an autoregressive mask of
  zeros, the 2D mask ``cumsum(ar)[key] <= cumsum(ar)[query] and valid[query] and valid[key]``
  (LeRobot's ``make_att_2d_masks``), positions ``cumsum(valid) - 1``; ``GemmaModel.forward``
  with that mask made additive (0 / -2.3819763e38) and a cache, whose per-layer keys (after
  RoPE) and values are kept.
- Suffix (one denoising step): the time embedding (sin then cos of ``2 pi t / period``, the
  periods geometric from ``min_period`` to ``max_period`` in float64, cast to float32).
  pi0: the state token ``state_proj(state)``, then ``action_time_mlp_out(silu(
  action_time_mlp_in([action_in_proj(x_t), time])))``, autoregressive mask ``[1, 1, 0...]``.
  pi0.5: ``action_in_proj(x_t)``, mask ``[1, 0...]``, and ``cond = silu(time_mlp_out(silu(
  time_mlp_in(time))))``. Every suffix token sees the valid prefix; positions continue from
  the number of valid prefix tokens. Each expert layer's queries attend to [the prefix's K/V
  of the same layer ; the suffix's own K/V] (RoPE, query heads sharing KV heads, scale
  ``head_dim^-0.5``, additive mask, softmax in float32). pi0.5's expert norms are adaptive:
  ``scale, shift, gate = dense(cond)``, ``x_hat * (1 + scale) + shift``, the residual adds
  ``gate * branch`` (the final norm's gate unused). The last ``chunk`` tokens after the final
  norm through ``action_out_proj`` are the velocity.
- Euler from t = 1 with ``dt = -1 / steps`` (each time ``1 + step * dt`` in float64, then
  float32): ``x <- x + dt * v``.

``ReferencePi0.mutated(...)`` returns the same reference with one deliberate error
(``Mutations``), for tests that must show an error moves the actions.
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

# LeRobot's OPENPI_ATTENTION_MASK_VALUE: masked scores are this finite value added, not -inf,
# so a fully masked (padding) query row stays finite.
MASK_VALUE = -2.3819763e38
ROPE_THETA = 10000.0
NORM_EPS = 1e-6

WITH_EXPERT = 'model.paligemma_with_expert.'
VISION = WITH_EXPERT + 'paligemma.model.vision_tower.vision_model.'
PROJECTOR = WITH_EXPERT + 'paligemma.model.multi_modal_projector.linear.'
LANGUAGE = WITH_EXPERT + 'paligemma.model.language_model.'
TIED_EMBEDDING = WITH_EXPERT + 'paligemma.lm_head.weight'
EXPERT = WITH_EXPERT + 'gemma_expert.model.'
UNUSED = (WITH_EXPERT + 'gemma_expert.lm_head.weight',)
HEADS = {
    'pi0': ('state_proj', 'action_in_proj', 'action_out_proj', 'action_time_mlp_in',
            'action_time_mlp_out'),
    'pi05': ('action_in_proj', 'action_out_proj', 'time_mlp_in', 'time_mlp_out'),
}  # fmt: skip


@dataclass(frozen=True)
class Mutations:
    """Deliberate errors, each one a way a port of LeRobot's pi0 could go wrong."""

    causal_prefix: bool = False  # the prefix attends causally instead of bidirectionally
    suffix_positions_from_zero: bool = False  # suffix positions 0.. instead of after the prefix
    no_embedding_scale: bool = False  # language embeddings not multiplied by sqrt(width)
    causal_actions: bool = False  # action tokens attend causally among themselves


@dataclass(frozen=True)
class FlowSettings:
    """What the reference reads from a LeRobot ``config.json``."""

    chunk_size: int
    max_state_dim: int
    max_action_dim: int
    num_inference_steps: int
    min_period: float
    max_period: float

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> FlowSettings:
        return cls(
            chunk_size=int(config['chunk_size']),
            max_state_dim=int(config['max_state_dim']),
            max_action_dim=int(config['max_action_dim']),
            num_inference_steps=int(config['num_inference_steps']),
            min_period=float(config['min_period']),
            max_period=float(config['max_period']),
        )


class PrefixOut(NamedTuple):
    embeddings: torch.Tensor  # [B, P, width]: image features, then scaled language embeddings
    valid: torch.Tensor  # [B, P] bool: LeRobot's prefix pad mask
    mask: torch.Tensor  # [B, P, P] bool: mask[b, query, key]
    positions: torch.Tensor  # [B, P] long
    keys: list[torch.Tensor]  # per layer [B, kv_heads, P, head_dim], after RoPE
    values: list[torch.Tensor]  # per layer [B, kv_heads, P, head_dim]


class SuffixIn(NamedTuple):
    embeddings: torch.Tensor  # [B, S, expert width]
    autoregressive: list[int]  # LeRobot's att_masks for the suffix tokens
    cond: torch.Tensor | None  # [B, expert width]: pi0.5's adaRMS condition


def attention_2d(valid: torch.Tensor, autoregressive: torch.Tensor) -> torch.Tensor:
    """``[B, N, N]`` bool, [b, query, key]: a key is seen when its cumulative autoregressive
    count is at most the query's and both tokens are valid (big_vision's rule)."""
    count = torch.cumsum(autoregressive.long(), dim=-1).expand(valid.shape)
    return (count[:, None, :] <= count[:, :, None]) & valid[:, None, :] & valid[:, :, None]


def additive(mask: torch.Tensor) -> torch.Tensor:
    """A bool ``[B, Q, K]`` mask as the ``[B, 1, Q, K]`` float32 one added to the scores."""
    zero = torch.zeros((), dtype=torch.float32)
    return torch.where(mask[:, None], zero, torch.tensor(MASK_VALUE, dtype=torch.float32))


def rms_normalize(x: torch.Tensor, eps: float = NORM_EPS) -> torch.Tensor:
    x = x.float()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)


def ada_rms_norm(
    x: torch.Tensor, dense: tuple[torch.Tensor, torch.Tensor], cond: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """pi0.5's adaptive RMSNorm: ``x_hat * (1 + scale) + shift`` and the residual's gate."""
    scale, shift, gate = F.linear(cond, *dense)[:, None].chunk(3, dim=-1)
    return rms_normalize(x) * (1 + scale) + shift, gate


def gemma_config(size: Any, vocab_size: int):
    """transformers' ``GemmaConfig`` for a ``GemmaSize`` (width, depth, mlp_dim, heads...)."""
    from transformers import GemmaConfig

    return GemmaConfig(
        vocab_size=vocab_size,
        hidden_size=size.width,
        intermediate_size=size.mlp_dim,
        num_hidden_layers=size.depth,
        num_attention_heads=size.num_heads,
        num_key_value_heads=size.num_kv_heads,
        head_dim=size.head_dim,
        hidden_act='gelu_pytorch_tanh',
        rms_norm_eps=NORM_EPS,
        rope_parameters={'rope_type': 'default', 'rope_theta': ROPE_THETA},
        pad_token_id=None,
        bos_token_id=None,
        eos_token_id=None,
        attn_implementation='eager',
    )


class _Tensors:
    """The folder's tensors by name, in float32; remembers which were taken."""

    def __init__(self, tensors: dict[str, torch.Tensor]) -> None:
        self._tensors = {k: v.float() for k, v in tensors.items()}
        self._taken: set[str] = set()

    def __contains__(self, name: str) -> bool:
        return name in self._tensors

    def one(self, name: str) -> torch.Tensor:
        if name not in self._tensors:
            raise KeyError(f'missing tensor {name}')
        self._taken.add(name)
        return self._tensors[name]

    def linear(self, name: str) -> tuple[torch.Tensor, torch.Tensor]:
        return self.one(f'{name}.weight'), self.one(f'{name}.bias')

    def under(self, prefix: str) -> dict[str, torch.Tensor]:
        names = [k for k in self._tensors if k.startswith(prefix)]
        return {k.removeprefix(prefix): self.one(k) for k in names}

    def check_all_taken(self) -> None:
        left = sorted(set(self._tensors) - self._taken - set(UNUSED))
        if left:
            raise ValueError(f'tensors the reference does not use: {left}')


class ReferencePi0:
    """LeRobot's pi0 / pi0.5 ``sample_actions`` in float32 from a folder's tensors."""

    def __init__(
        self,
        tensors: dict[str, torch.Tensor],
        *,
        policy_type: str,
        sizes: Any,
        settings: FlowSettings,
    ) -> None:
        from transformers import GemmaModel, SiglipVisionConfig, SiglipVisionModel
        from transformers.models.gemma.modeling_gemma import (
            GemmaDecoderLayer,
            GemmaRMSNorm,
            GemmaRotaryEmbedding,
        )

        if policy_type not in HEADS:
            raise ValueError(f'unknown policy type {policy_type!r}')
        self.policy_type = policy_type
        self.settings = settings
        self.mutations = Mutations()
        found = _Tensors(tensors)
        vision = sizes.vision
        self.vision = SiglipVisionModel(
            SiglipVisionConfig(
                hidden_size=vision.hidden_size,
                intermediate_size=vision.intermediate_size,
                num_hidden_layers=vision.num_layers,
                num_attention_heads=vision.num_heads,
                patch_size=vision.patch_size,
                image_size=vision.image_size,
                hidden_act='gelu_pytorch_tanh',
                layer_norm_eps=1e-6,
                vision_use_head=False,
                attn_implementation='eager',
            )
        ).eval()
        self.vision.load_state_dict(found.under(VISION), strict=True)
        self.projector = found.linear(PROJECTOR.removesuffix('.'))
        self.language_model = GemmaModel(gemma_config(sizes.paligemma, sizes.vocab_size)).eval()
        language = found.under(LANGUAGE)
        language['embed_tokens.weight'] = found.one(TIED_EMBEDDING)
        self.language_model.load_state_dict(language, strict=True)

        expert = gemma_config(sizes.expert, vocab_size=1)
        self.expert_layers = torch.nn.ModuleList(
            GemmaDecoderLayer(expert, i) for i in range(expert.num_hidden_layers)
        ).eval()
        self.expert_norm = GemmaRMSNorm(expert.hidden_size, eps=NORM_EPS)
        self.expert_rotary = GemmaRotaryEmbedding(config=expert)
        # pi0.5: per layer {'input_layernorm': (w, b), 'post_attention_layernorm': (w, b)}.
        self.expert_dense: list[dict[str, tuple[torch.Tensor, torch.Tensor]]] = []
        self.expert_norm_dense: tuple[torch.Tensor, torch.Tensor] | None = None
        for i, layer in enumerate(self.expert_layers):
            own = found.under(f'{EXPERT}layers.{i}.')
            dense = {}
            for norm in ('input_layernorm', 'post_attention_layernorm'):
                if policy_type == 'pi05':
                    dense[norm] = (own.pop(f'{norm}.dense.weight'), own.pop(f'{norm}.dense.bias'))
                    own[f'{norm}.weight'] = torch.zeros(expert.hidden_size)  # never read
            layer.load_state_dict(own, strict=True)
            self.expert_dense.append(dense)
        if policy_type == 'pi05':
            self.expert_norm_dense = found.linear(f'{EXPERT}norm.dense')
        else:
            self.expert_norm.load_state_dict({'weight': found.one(f'{EXPERT}norm.weight')})
        self.heads = {name: found.linear(f'model.{name}') for name in HEADS[policy_type]}
        found.check_all_taken()
        self.expert_width = expert.hidden_size
        for module in (self.vision, self.language_model, self.expert_layers, self.expert_norm):
            module.requires_grad_(False)

    @classmethod
    def from_folder(cls, folder: str | Path, *, sizes: Any) -> ReferencePi0:
        """A LeRobot pi0 / pi05 folder: ``config.json`` (type, chunk, dims, periods, steps)
        and ``model.safetensors``. ``sizes`` has ``paligemma`` and ``expert`` (GemmaSize),
        ``vision`` (SiglipSize) and ``vocab_size``, as ``read_pi0_spec`` gives them."""
        from safetensors.torch import load_file

        folder = Path(folder)
        config = json.loads((folder / 'config.json').read_text())
        return cls(
            load_file(str(folder / 'model.safetensors')),
            policy_type=config['type'],
            sizes=sizes,
            settings=FlowSettings.from_config(config),
        )

    def mutated(self, **flags: bool) -> ReferencePi0:
        """This reference (same modules and tensors) with the named ``Mutations`` set."""
        other = object.__new__(ReferencePi0)
        other.__dict__.update(self.__dict__)
        other.mutations = dataclasses.replace(self.mutations, **flags)
        return other

    def _linear(self, x: torch.Tensor, name: str) -> torch.Tensor:
        return F.linear(x, *self.heads[name])

    # -- prefix ---------------------------------------------------------------------------

    def embed_language(self, lang_ids: torch.Tensor) -> torch.Tensor:
        if self.mutations.no_embedding_scale:
            return F.embedding(lang_ids, self.language_model.embed_tokens.weight)
        return self.language_model.embed_tokens(lang_ids)

    def embed_image(self, pixels: torch.Tensor) -> torch.Tensor:
        features = self.vision(pixel_values=pixels.float()).last_hidden_state
        return F.linear(features, *self.projector)

    @torch.no_grad()
    def prefix(
        self,
        *,
        pixels: list[torch.Tensor],
        lang_ids: torch.Tensor,
        lang_valid: torch.Tensor,
        image_valid: list[bool] | None = None,
    ) -> PrefixOut:
        """Cameras then language through PaliGemma's Gemma; its per-layer K/V kept."""
        from transformers import DynamicCache

        batch = lang_ids.shape[0]
        image_valid = [True] * len(pixels) if image_valid is None else image_valid
        embeddings, valid = [], []
        for camera, ok in zip(pixels, image_valid, strict=True):
            features = self.embed_image(camera)
            embeddings.append(features)
            valid.append(torch.full(features.shape[:2], bool(ok)))
        embeddings.append(self.embed_language(lang_ids))
        valid.append(lang_valid.bool())
        embeddings, valid = torch.cat(embeddings, dim=1), torch.cat(valid, dim=1)
        length = embeddings.shape[1]
        autoregressive = torch.full((1, length), int(self.mutations.causal_prefix))
        mask = attention_2d(valid, autoregressive)
        positions = torch.cumsum(valid.long(), dim=1) - 1
        cache = DynamicCache()
        self.language_model(
            inputs_embeds=embeddings,
            attention_mask=additive(mask),
            position_ids=positions,
            cache=cache,
            use_cache=True,
        )
        keys = [layer.keys for layer in cache.layers]
        values = [layer.values for layer in cache.layers]
        assert keys[0].shape[0] == batch and keys[0].shape[2] == length
        return PrefixOut(embeddings, valid, mask, positions, keys, values)

    # -- suffix ---------------------------------------------------------------------------

    def time_embedding(self, t: torch.Tensor) -> torch.Tensor:
        """``[B]`` float32 times -> ``[B, width]``: sin half, then cos half."""
        s = self.settings
        fraction = torch.linspace(0.0, 1.0, self.expert_width // 2, dtype=torch.float64)
        period = s.min_period * (s.max_period / s.min_period) ** fraction
        angle = (1.0 / period * 2 * math.pi)[None, :] * t.double()[:, None]
        return torch.cat([torch.sin(angle), torch.cos(angle)], dim=1).float()

    def embed_suffix(
        self, *, state: torch.Tensor | None, x_t: torch.Tensor, t: torch.Tensor
    ) -> SuffixIn:
        chunk = x_t.shape[1]
        actions_ar = [1] * chunk if self.mutations.causal_actions else [1] + [0] * (chunk - 1)
        time = self.time_embedding(t)
        actions = self._linear(x_t.float(), 'action_in_proj')
        if self.policy_type == 'pi05':
            cond = F.silu(self._linear(F.silu(self._linear(time, 'time_mlp_in')), 'time_mlp_out'))
            return SuffixIn(actions, actions_ar, cond)
        if state is None:
            raise ValueError('pi0 needs the state')
        state = F.pad(state.float(), (0, self.settings.max_state_dim - state.shape[-1]))
        state_token = self._linear(state, 'state_proj')[:, None]
        fused = torch.cat([actions, time[:, None].expand_as(actions)], dim=-1)
        fused = self._linear(
            F.silu(self._linear(fused, 'action_time_mlp_in')), 'action_time_mlp_out'
        )
        return SuffixIn(torch.cat([state_token, fused], dim=1), [1, *actions_ar], None)

    def suffix_layout(
        self, prefix: PrefixOut, autoregressive: list[int]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """``[B, S, P + S]`` bool mask (the valid prefix, then the suffix's own rule) and
        ``[B, S]`` positions after the valid prefix tokens."""
        batch, length = prefix.valid.shape[0], len(autoregressive)
        suffix_valid = torch.ones(batch, length, dtype=torch.bool)
        own = attention_2d(suffix_valid, torch.tensor([autoregressive]))
        seen = prefix.valid[:, None, :].expand(batch, length, prefix.valid.shape[1])
        offset = 0 if self.mutations.suffix_positions_from_zero else prefix.valid.sum(dim=1)
        positions = torch.as_tensor(offset).reshape(-1, 1) + torch.cumsum(suffix_valid, 1) - 1
        return torch.cat([seen, own], dim=2), positions

    def _norm(self, norm, x, dense, cond):
        if cond is None:
            return norm(x), None
        return ada_rms_norm(x, dense, cond)

    def _joint_attention(self, attn, h, keys, values, rope, mask):
        from transformers.models.gemma.modeling_gemma import apply_rotary_pos_emb

        batch, length, _ = h.shape
        head_dim = attn.head_dim
        q = attn.q_proj(h).view(batch, length, -1, head_dim).transpose(1, 2)
        k = attn.k_proj(h).view(batch, length, -1, head_dim).transpose(1, 2)
        v = attn.v_proj(h).view(batch, length, -1, head_dim).transpose(1, 2)
        q, k = apply_rotary_pos_emb(q, k, *rope)
        k, v = torch.cat([keys, k], dim=2), torch.cat([values, v], dim=2)
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = q @ k.transpose(-1, -2) * head_dim**-0.5 + mask
        probs = torch.softmax(scores.float(), dim=-1).to(q.dtype)
        out = (probs @ v).transpose(1, 2).reshape(batch, length, -1)
        return attn.o_proj(out)

    def run_expert(self, prefix: PrefixOut, suffix: SuffixIn) -> torch.Tensor:
        """The expert over the suffix, attending to the prefix's K/V: ``[B, S, width]``
        after the final norm."""
        mask, positions = self.suffix_layout(prefix, suffix.autoregressive)
        mask = additive(mask)
        x, cond = suffix.embeddings, suffix.cond
        rope = self.expert_rotary(x, positions)
        for i, layer in enumerate(self.expert_layers):
            dense = self.expert_dense[i]
            h, gate = self._norm(layer.input_layernorm, x, dense.get('input_layernorm'), cond)
            h = self._joint_attention(
                layer.self_attn, h, prefix.keys[i], prefix.values[i], rope, mask
            )
            x = x + (h if gate is None else h * gate)
            h, gate = self._norm(
                layer.post_attention_layernorm, x, dense.get('post_attention_layernorm'), cond
            )
            h = layer.mlp(h)
            x = x + (h if gate is None else h * gate)
        return self._norm(self.expert_norm, x, self.expert_norm_dense, cond)[0]

    @torch.no_grad()
    def velocity(
        self, prefix: PrefixOut, *, state: torch.Tensor | None, x_t: torch.Tensor, t: torch.Tensor
    ) -> torch.Tensor:
        """One denoising step's ``v_t``: ``[B, chunk, max_action_dim]``."""
        suffix = self.embed_suffix(state=state, x_t=x_t, t=t)
        out = self.run_expert(prefix, suffix)
        return self._linear(out[:, -x_t.shape[1] :], 'action_out_proj')

    @torch.no_grad()
    def sample_actions(
        self,
        *,
        pixels: list[torch.Tensor],
        lang_ids: torch.Tensor,
        lang_valid: torch.Tensor,
        state: torch.Tensor | None,
        noise: torch.Tensor,
        num_steps: int,
        image_valid: list[bool] | None = None,
    ) -> tuple[torch.Tensor, list[torch.Tensor]]:
        """Normalized actions ``[B, chunk, max_action_dim]`` and every step's velocity."""
        prefix = self.prefix(
            pixels=pixels, lang_ids=lang_ids, lang_valid=lang_valid, image_valid=image_valid
        )
        dt = -1.0 / num_steps
        x_t, velocities = noise.float(), []
        for step in range(num_steps):
            t = torch.full((noise.shape[0],), 1.0 + step * dt, dtype=torch.float32)
            v_t = self.velocity(prefix, state=state, x_t=x_t, t=t)
            velocities.append(v_t)
            x_t = x_t + dt * v_t
        return x_t, velocities
