"""Attention metadata for one step and the paged attention call of a decoder layer.

The metadata is built once per step (on the device) and passed to every layer as an
argument; each layer stores its new K/V into the paged cache and then attends through the
engine's slot table with the ``vla_sched.kernels`` dispatchers. On the 'torch' kernel
backend (the CPU path) with values the caller checked, ``build`` also works out once per
step which slots every layer reads (``TorchAttentionPlan``), and each layer runs only the
backend's arithmetic.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from vla_sched.kernels.decode_attention import decode_attention, run_decode_attention
from vla_sched.kernels.decode_reads import DecodeReads, decode_attention_over_reads, decode_reads
from vla_sched.kernels.extend_attention import run_extend_attention
from vla_sched.kernels.extend_runs import ExtendRun, extend_attention_over_runs, extend_runs
from vla_sched.kernels.store_kv import run_store_kv, write_kv
from vla_sched.model.layers.transfer import to_device


@dataclass(frozen=True, slots=True)
class DecodeScratch:
    """Persistent buffers for the Triton decode launcher (CUDA-graph friendly).

    ``out`` is reused by every layer in turn (each layer consumes it before the next one
    writes it).
    """

    out: torch.Tensor  # [B, Hq, Dv]
    attn_logits: torch.Tensor  # fp32 [B, Hq, max_kv_splits, Dv]
    attn_lse: torch.Tensor  # fp32 [B, Hq, max_kv_splits]
    num_kv_splits: torch.Tensor  # int32 [B]

    @classmethod
    def allocate(
        cls,
        *,
        batch_size: int,
        num_heads: int,
        head_dim: int,
        max_kv_splits: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> DecodeScratch:
        return cls(
            out=torch.zeros(batch_size, num_heads, head_dim, dtype=dtype, device=device),
            attn_logits=torch.zeros(
                batch_size, num_heads, max_kv_splits, head_dim, dtype=torch.float32, device=device
            ),
            attn_lse=torch.zeros(
                batch_size, num_heads, max_kv_splits, dtype=torch.float32, device=device
            ),
            num_kv_splits=torch.full(
                (batch_size,), max_kv_splits, dtype=torch.int32, device=device
            ),
        )


@dataclass(frozen=True, slots=True, eq=False)
class TorchAttentionPlan:
    """What every layer of a step reads on the 'torch' kernel backend, worked out once.

    A decode step has only ``decode`` reads. An extend step has ``extend`` runs for its
    requests of several new tokens, and ``decode`` reads for those of one new token (the
    running requests of a mixed pass; their token rows are ``decode_rows``): one token
    attends to every position up to its own, as a decode does, so they run as one batched
    decode instead of a run each.
    """

    decode: DecodeReads | None = None
    extend: list[ExtendRun] | None = None
    decode_rows: torch.Tensor | None = None  # int64 [num one-token requests], on the device


@dataclass(frozen=True, slots=True, eq=False)
class AttentionMetadata:
    """Where one step's tokens go and what they attend to (all tensors on the device).

    ``positions``, ``out_cache_loc`` cover the step's ``T`` new tokens back to back; the
    per-request tensors have one entry per request of the batch.
    """

    is_decode: bool
    positions: torch.Tensor  # int64 [T]
    out_cache_loc: torch.Tensor  # int64 [T]
    req_to_token: torch.Tensor  # int32 [num_req_slots, max_context_len]
    req_pool_indices: torch.Tensor  # int64 [B]
    seq_lens: torch.Tensor  # int64 [B]
    prefix_lens: torch.Tensor  # int64 [B]
    extend_lens: torch.Tensor  # int64 [B]
    extend_start_loc: torch.Tensor  # int64 [B]
    max_extend_len: int
    image_spans: torch.Tensor | None = None  # int64 [B, 2] bidirectional spans, or None
    backend: str = 'auto'
    decode_scratch: DecodeScratch | None = None
    check_values: bool = True  # False: the caller checked slots and lengths (the runner)
    torch_plan: TorchAttentionPlan | None = None  # 'torch' backend, values checked: per step

    @property
    def num_tokens(self) -> int:
        return int(self.positions.shape[0])

    @classmethod
    def build(
        cls,
        *,
        is_decode: bool,
        req_to_token: torch.Tensor,
        req_pool_indices: torch.Tensor,
        prefix_lens: torch.Tensor,
        extend_lens: torch.Tensor,
        out_cache_loc: torch.Tensor,
        device: torch.device,
        backend: str = 'auto',
        image_spans: torch.Tensor | None = None,
        check_values: bool = True,
    ) -> AttentionMetadata:
        """Derive positions and offsets from CPU lengths and move everything to ``device``.

        With ``check_values`` False (the caller checked every slot, row and length) and the
        'torch' kernel backend, the slots every layer reads are worked out here, once.
        """
        prefix_lens, extend_lens = _int64(prefix_lens), _int64(extend_lens)
        num_tokens, num_reqs = int(out_cache_loc.shape[0]), int(extend_lens.shape[0])
        if is_decode and num_tokens == num_reqs:
            # One token per request: each sits at its prefix length.
            positions = prefix_lens
            extend_start_loc = torch.arange(num_reqs, dtype=torch.int64)
            max_extend_len = 1
        else:
            positions, extend_start_loc = extend_positions(
                prefix_lens, extend_lens, num_tokens=num_tokens
            )
            max_extend_len = int(extend_lens.max()) if num_tokens else 0

        def put(t: torch.Tensor) -> torch.Tensor:
            return to_device(t, device)

        seq_lens = prefix_lens + extend_lens
        req_pool_indices = put(_int64(req_pool_indices))
        device_seq_lens = put(seq_lens)
        plan = None
        on_torch = backend == 'torch' or (backend == 'auto' and device.type != 'cuda')
        if not check_values and num_tokens and on_torch:
            if is_decode:
                reads = decode_reads(
                    req_to_token=req_to_token,
                    req_pool_indices=req_pool_indices,
                    seq_lens=device_seq_lens,
                )
                plan = TorchAttentionPlan(decode=reads)
            else:
                plan = _extend_plan(
                    req_to_token=req_to_token,
                    req_pool_indices=req_pool_indices,
                    prefix_lens=prefix_lens,
                    extend_lens=extend_lens,
                    extend_start_loc=extend_start_loc,
                    seq_lens=device_seq_lens,
                    image_spans=image_spans,
                )
        return cls(
            is_decode=is_decode,
            positions=put(positions),
            out_cache_loc=put(_int64(out_cache_loc)),
            req_to_token=req_to_token,
            req_pool_indices=req_pool_indices,
            seq_lens=device_seq_lens,
            prefix_lens=put(prefix_lens),
            extend_lens=put(extend_lens),
            extend_start_loc=put(extend_start_loc),
            max_extend_len=max_extend_len,
            image_spans=None if image_spans is None else put(image_spans.to(torch.int64)),
            backend=backend,
            check_values=check_values,
            torch_plan=plan,
        )


def _extend_plan(
    *,
    req_to_token: torch.Tensor,
    req_pool_indices: torch.Tensor,
    prefix_lens: torch.Tensor,
    extend_lens: torch.Tensor,
    extend_start_loc: torch.Tensor,
    seq_lens: torch.Tensor,
    image_spans: torch.Tensor | None,
) -> TorchAttentionPlan:
    """An extend step's plan: runs for the requests of several new tokens, one batched
    decode for those of one (see ``TorchAttentionPlan``). Lengths and offsets are on the host,
    the pool rows and ``seq_lens`` on the device."""
    lens = extend_lens.tolist()
    single = [i for i, n in enumerate(lens) if n == 1]
    multi = None  # every request, unless some extend by one token
    if single:
        multi = torch.tensor([i for i, n in enumerate(lens) if n != 1], dtype=torch.int64)
    runs = []
    if multi is None or multi.numel():

        def pick(t: torch.Tensor | None) -> torch.Tensor | None:
            return t if multi is None or t is None else t[multi.to(t.device)]

        runs = extend_runs(
            req_to_token=req_to_token,
            req_pool_indices=pick(req_pool_indices),
            prefix_lens=pick(prefix_lens),
            extend_lens=pick(extend_lens),
            extend_start_loc=pick(extend_start_loc),
            image_spans=pick(image_spans),
        )
    if not single:
        return TorchAttentionPlan(extend=runs)
    single_host = torch.tensor(single, dtype=torch.int64)
    single_dev = single_host.to(req_pool_indices.device)
    reads = decode_reads(
        req_to_token=req_to_token,
        req_pool_indices=req_pool_indices[single_dev],
        seq_lens=seq_lens[single_dev],
    )
    rows = extend_start_loc[single_host].to(req_pool_indices.device)
    return TorchAttentionPlan(decode=reads, extend=runs, decode_rows=rows)


def _int64(t: torch.Tensor) -> torch.Tensor:
    return t if t.dtype == torch.int64 else t.to(torch.int64)


def extend_positions(
    prefix_lens: torch.Tensor, extend_lens: torch.Tensor, *, num_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Each new token's position ``[T]`` and each request's first row ``[B]`` (int64, on the
    lengths' device): request ``i``'s tokens sit at ``prefix_lens[i] ...`` back to back.
    ``num_tokens`` is ``T`` when the caller knows it (else a host sync works it out)."""
    if num_tokens is None:
        num_tokens = int(extend_lens.sum())
    extend_start_loc = torch.cumsum(extend_lens, 0) - extend_lens
    starts = torch.repeat_interleave(
        prefix_lens - extend_start_loc, extend_lens, output_size=num_tokens
    )
    positions = torch.arange(num_tokens, dtype=torch.int64, device=extend_lens.device) + starts
    return positions, extend_start_loc


def paged_attention(
    *,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    k_cache: torch.Tensor,
    v_cache: torch.Tensor,
    meta: AttentionMetadata,
    sm_scale: float,
) -> torch.Tensor:
    """Store the step's K/V in the cache, then attend over prefix + new tokens.

    Args:
        q: [T, Hq, D] rotated queries. k: [T, Hkv, D] rotated keys. v: [T, Hkv, Dv] values.
        k_cache, v_cache: this layer's paged cache ``[num_slots, Hkv, D|Dv]``.
        meta: the step's metadata.
        sm_scale: softmax scale.

    Returns:
        [T, Hq, Dv] attention output in ``q.dtype``.
    """
    plan = meta.torch_plan
    if plan is not None:
        write_kv(k=k, v=v, k_cache=k_cache, v_cache=v_cache, locations=meta.out_cache_loc)
        if plan.extend is None:
            return decode_attention_over_reads(
                q=q, k_cache=k_cache, v_cache=v_cache, reads=plan.decode, sm_scale=sm_scale
            )
        out = extend_attention_over_runs(
            q=q, k=k, v=v, k_cache=k_cache, v_cache=v_cache, runs=plan.extend, sm_scale=sm_scale
        )
        if plan.decode_rows is not None:
            out[plan.decode_rows] = decode_attention_over_reads(
                q=q[plan.decode_rows],
                k_cache=k_cache,
                v_cache=v_cache,
                reads=plan.decode,
                sm_scale=sm_scale,
            )
        return out
    run_store_kv(
        k=k,
        v=v,
        k_cache=k_cache,
        v_cache=v_cache,
        out_cache_loc=meta.out_cache_loc,
        backend=meta.backend,
        check_values=meta.check_values,
    )
    if meta.is_decode:
        scratch = meta.decode_scratch
        if scratch is not None:
            decode_attention(
                q=q,
                k_cache=k_cache,
                v_cache=v_cache,
                req_to_token=meta.req_to_token,
                req_pool_indices=meta.req_pool_indices,
                seq_lens=meta.seq_lens,
                out=scratch.out,
                attn_logits=scratch.attn_logits,
                attn_lse=scratch.attn_lse,
                num_kv_splits=scratch.num_kv_splits,
                sm_scale=sm_scale,
                debug=False,
            )
            return scratch.out
        return run_decode_attention(
            q=q,
            k_cache=k_cache,
            v_cache=v_cache,
            req_to_token=meta.req_to_token,
            req_pool_indices=meta.req_pool_indices,
            seq_lens=meta.seq_lens,
            sm_scale=sm_scale,
            backend=meta.backend,
            check_values=meta.check_values,
        )
    return run_extend_attention(
        q=q,
        k=k,
        v=v,
        k_cache=k_cache,
        v_cache=v_cache,
        req_to_token=meta.req_to_token,
        req_pool_indices=meta.req_pool_indices,
        prefix_lens=meta.prefix_lens,
        extend_lens=meta.extend_lens,
        extend_start_loc=meta.extend_start_loc,
        sm_scale=sm_scale,
        image_spans=meta.image_spans,
        max_extend_len=meta.max_extend_len,
        backend=meta.backend,
        check_values=meta.check_values,
    )
