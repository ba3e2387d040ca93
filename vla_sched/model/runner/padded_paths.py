"""The runner's padded persistent-buffer paths: decode steps, prefills, the vision encoder.

Each is on when ``cuda_graphs`` is (captured) or when its own ``padded_*`` option is
(eager, so the CPU tests check the padding). Decode and prefill padding write KV slots of
their own, reserved past the engine's.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import torch

from vla_sched.model.layers.decoder import KVCache
from vla_sched.model.loading.vla_model import VLAModel
from vla_sched.model.runner.config import RunnerConfig
from vla_sched.model.runner.decode_graphs import DecodeGraphs
from vla_sched.model.runner.graph_runner import GraphRunner
from vla_sched.model.runner.padding_stats import PaddingCounter
from vla_sched.model.runner.prefill_graphs import PrefillGraphs, max_padding
from vla_sched.model.runner.vision_graphs import VisionGraphs

logger = logging.getLogger(__name__)
_Padded = TypeVar('_Padded', bound=GraphRunner)


@dataclass(frozen=True, slots=True)
class PaddingSlots:
    """Reserved KV slots past the engine's ``num_kv_slots``: one per decode padding row,
    then one per prefill padding token."""

    first_decode_slot: int
    num_decode_slots: int
    num_prefill_slots: int

    @classmethod
    def for_config(cls, config: RunnerConfig, *, num_kv_slots: int) -> PaddingSlots:
        decode, prefill = decode_padded(config), prefill_padded(config)
        return cls(
            first_decode_slot=num_kv_slots,
            num_decode_slots=max(config.decode_batch_sizes) if decode or prefill else 0,
            num_prefill_slots=max_padding(config.prefill_token_counts) if prefill else 0,
        )

    @property
    def first_prefill_slot(self) -> int:
        return self.first_decode_slot + self.num_decode_slots

    @property
    def num_slots(self) -> int:
        return self.num_decode_slots + self.num_prefill_slots


@dataclass(frozen=True, slots=True)
class PaddedPaths:
    """The padded paths that are on (None: that part runs eagerly)."""

    decode: DecodeGraphs | None
    prefill: PrefillGraphs | None
    vision: VisionGraphs | None


def decode_padded(config: RunnerConfig) -> bool:
    return config.cuda_graphs or config.padded_decode


def prefill_padded(config: RunnerConfig) -> bool:
    return config.cuda_graphs or config.padded_prefill


def build_padded_paths(
    model: VLAModel,
    config: RunnerConfig,
    kv_caches: list[KVCache],
    req_to_token: torch.Tensor,
    *,
    dummy_row: int,
    slots: PaddingSlots,
    counters: Mapping[str, PaddingCounter],
) -> PaddedPaths:
    """Builds (and with ``cuda_graphs`` captures) the paths the config turns on.

    Args:
        model: The model.
        config: The runner's options.
        kv_caches: The runner's per-layer caches (with the reserved slots).
        req_to_token: The runner's device slot table; row ``dummy_row`` is reserved.
        dummy_row: The reserved slot-table row of padding requests.
        slots: The reserved KV slots.
        counters: Where each path ('decode', 'prefill', 'vision') counts its runs.
    """
    decode = None
    if decode_padded(config):
        decode = DecodeGraphs(
            model,
            kv_caches,
            req_to_token,
            batch_sizes=config.decode_batch_sizes,
            dummy_row=dummy_row,
            dummy_slots=slots.first_decode_slot,
            capture=config.cuda_graphs,
            use_triton=config.cuda_graphs or config.backend == 'triton',
            max_kv_splits=config.max_kv_splits,
            backend=config.backend,
            padding=counters['decode'],
        )
    prefill = None
    if prefill_padded(config):

        def build_prefill(capture: bool) -> PrefillGraphs:
            return PrefillGraphs(
                model.decoder,
                kv_caches,
                req_to_token,
                token_counts=config.prefill_token_counts,
                max_requests=config.prefill_max_requests,
                dummy_row=dummy_row,
                first_pad_slot=slots.first_prefill_slot,
                capture=capture,
                backend=config.backend,
                padding=counters['prefill'],
            )

        prefill = captured_or_eager(config.cuda_graphs, build_prefill, 'prefill')
    vision = None
    if config.cuda_graphs or config.padded_vision:
        vision = vision_graphs_for(
            model,
            batch_sizes=config.vision_batch_sizes,
            cuda_graphs=config.cuda_graphs,
            padding=counters['vision'],
        )
    return PaddedPaths(decode=decode, prefill=prefill, vision=vision)


def vision_graphs_for(
    model: VLAModel, *, batch_sizes: Sequence[int], cuda_graphs: bool, padding: PaddingCounter
) -> VisionGraphs | None:
    """The vision encoder's padded path (captured with ``cuda_graphs``), or None for a
    model without towers or an encoder that cannot be captured (it runs eagerly)."""
    vision = model.vision
    if vision is None:
        return None
    prep = model.spec.preprocessing
    shape = (len(prep.mean), prep.image_size, prep.image_size)

    def build(capture: bool) -> VisionGraphs:
        return VisionGraphs(
            vision,
            pixel_shape=shape,
            batch_sizes=batch_sizes,
            device=model.device,
            output_dtype=model.dtype,
            capture=capture,
            padding=padding,
        )

    return captured_or_eager(cuda_graphs, build, 'vision encoder')


def captured_or_eager(
    cuda_graphs: bool, build: Callable[[bool], _Padded], what: str
) -> _Padded | None:
    """The padded path, captured when ``cuda_graphs`` is on; None (eager) when an op of
    ``what`` cannot be captured."""
    if not cuda_graphs:
        return build(False)
    try:
        return build(True)
    except RuntimeError as exc:
        logger.warning('%s not captured, it runs eagerly: %s', what, exc)
        return None
