"""Decode steps on persistent buffers, padded to a few batch sizes, optionally CUDA graphs.

A decode step of ``B`` requests runs at the smallest prepared batch size ``>= B`` (see
``graph_runner``). Padding rows read one reserved slot and write their own reserved slots,
so they never touch a real request's KV. On the Triton path each size has its own decode
scratch buffers, so a captured step needs no allocation.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from vla_sched.kernels.decode_attention import choose_num_kv_splits, device_num_sms
from vla_sched.model.layers.attention import AttentionMetadata, DecodeScratch
from vla_sched.model.layers.decoder import KVCache
from vla_sched.model.loading.vla_model import VLAModel
from vla_sched.model.runner.graph_runner import GraphRunner
from vla_sched.model.runner.padding_stats import PaddingCounter


class DecodeGraphs(GraphRunner):
    """Padded decode forward passes for fixed batch sizes.

    Args:
        model: The model (its decoder runs the steps).
        kv_caches: The runner's per-layer caches.
        req_to_token: The runner's device slot table; row ``dummy_row`` is reserved.
        batch_sizes: Padded batch sizes to prepare.
        dummy_row: Reserved slot-table row for padding rows.
        dummy_slots: First of ``max(batch_sizes)`` reserved KV slots for padding rows.
        capture: Capture CUDA graphs (needs a CUDA device and ``use_triton``).
        use_triton: Run decode attention through the Triton launcher on persistent scratch
            buffers (required for capture).
        max_kv_splits: Split bound of the Triton decode kernel.
        backend: Kernel backend for the eager path.
        padding: Where the steps' real and padding rows are counted.
    """

    def __init__(
        self,
        model: VLAModel,
        kv_caches: list[KVCache],
        req_to_token: torch.Tensor,
        *,
        batch_sizes: Sequence[int],
        dummy_row: int,
        dummy_slots: int,
        capture: bool,
        use_triton: bool,
        max_kv_splits: int = 8,
        backend: str = 'auto',
        padding: PaddingCounter | None = None,
    ) -> None:
        super().__init__(
            sizes=batch_sizes,
            device=model.device,
            capture=capture,
            name='decode',
            sizes_name='batch sizes',
            padding=padding,
        )
        if capture and not use_triton:
            raise ValueError('CUDA graph capture needs the Triton decode path')
        self.model = model
        self.kv_caches = kv_caches
        self.req_to_token = req_to_token
        self.backend = 'triton' if use_triton else backend
        self.use_triton = use_triton
        self.max_kv_splits = max_kv_splits
        device = model.device
        n = self.max_size
        self.input_ids = torch.zeros(n, dtype=torch.int64, device=device)
        self.req_pool_indices = torch.full((n,), dummy_row, dtype=torch.int64, device=device)
        self.seq_lens = torch.ones(n, dtype=torch.int64, device=device)
        self.pad_slots = torch.arange(n, dtype=torch.int64, device=device) + dummy_slots
        self.out_cache_loc = self.pad_slots.clone()
        self.dummy_row = dummy_row
        req_to_token[dummy_row].fill_(dummy_slots)
        self._scratch = {size: self._allocate_scratch(size) for size in self.sizes}
        if capture:
            self.capture_all()

    def run(
        self,
        *,
        input_ids: torch.Tensor,
        req_pool_indices: torch.Tensor,
        seq_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
    ) -> torch.Tensor:
        """Logits ``[B, vocab]`` (float32) of one decode step; inputs are device tensors."""
        batch_size = int(input_ids.shape[0])
        size = self.padded_size(batch_size)
        if size is None:
            raise ValueError(f'decode batch of {batch_size} exceeds {self.max_size}')
        self.input_ids[:batch_size].copy_(input_ids)
        self.req_pool_indices[:batch_size].copy_(req_pool_indices)
        self.seq_lens[:batch_size].copy_(seq_lens)
        self.out_cache_loc[:batch_size].copy_(out_cache_loc)
        self.input_ids[batch_size:size].zero_()
        self.req_pool_indices[batch_size:size].fill_(self.dummy_row)
        self.seq_lens[batch_size:size].fill_(1)
        self.out_cache_loc[batch_size:size].copy_(self.pad_slots[batch_size:size])
        return self.run_padded(size, num_real=batch_size)[:batch_size]

    def _allocate_scratch(self, size: int) -> DecodeScratch | None:
        if not self.use_triton:
            return None
        spec = self.model.spec.decoder
        return DecodeScratch.allocate(
            batch_size=size,
            num_heads=spec.num_heads,
            head_dim=spec.head_dim,
            max_kv_splits=self.max_kv_splits,
            dtype=self.model.dtype,
            device=self.model.device,
        )

    def _forward(self, size: int) -> torch.Tensor:
        decoder = self.model.decoder
        seq_lens = self.seq_lens[:size]
        scratch = self._scratch[size]
        if scratch is not None:
            spec = decoder.spec
            scratch.num_kv_splits.copy_(
                choose_num_kv_splits(
                    seq_lens=seq_lens,
                    num_q_heads=spec.num_heads,
                    num_kv_heads=spec.num_kv_heads,
                    max_kv_splits=self.max_kv_splits,
                    num_sms=device_num_sms(self.device),
                    head_dim=spec.head_dim,
                    itemsize=self.model.dtype.itemsize,
                    dtype=self.model.dtype,
                )
            )
        ones = torch.ones_like(seq_lens)
        meta = AttentionMetadata(
            is_decode=True,
            positions=seq_lens - 1,
            out_cache_loc=self.out_cache_loc[:size],
            req_to_token=self.req_to_token,
            req_pool_indices=self.req_pool_indices[:size],
            seq_lens=seq_lens,
            prefix_lens=seq_lens - 1,
            extend_lens=ones,
            extend_start_loc=torch.cumsum(ones, 0) - 1,
            max_extend_len=1,
            backend=self.backend,
            decode_scratch=scratch,
        )
        hidden = decoder(decoder.embed(self.input_ids[:size]), meta, self.kv_caches)
        return decoder.logits(hidden)
