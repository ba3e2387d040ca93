"""How the model runner executes steps: kernel backend, caches and its padded paths."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class RunnerConfig:
    """How the runner executes steps.

    Attributes:
        backend: Kernel backend: ``auto`` (``triton`` on CUDA, ``torch`` elsewhere),
            ``triton`` or ``torch``.
        feature_cache_size: Images whose projected features are kept (by content hash).
        bidirectional_image_spans: Let image tokens see each other (prefix-LM models); LLaVA
            checkpoints are causal, so off by default.
        cuda_graphs: Capture decode steps, prefills and the vision encoder as CUDA graphs
            (GPU only).
        decode_batch_sizes: Padded decode batch sizes for the persistent-buffer path.
        padded_decode: Run decode through the padded persistent-buffer path even without
            graphs (on by itself whenever ``cuda_graphs`` is).
        vision_batch_sizes: Padded image counts of the vision encoder's persistent-buffer
            path; more new images in one step run on it in several passes.
        padded_vision: Run the vision encoder through that path even without graphs (on by
            itself whenever ``cuda_graphs`` is).
        prefill_token_counts: Padded token counts of the prefill persistent-buffer path;
            a prefill of more tokens (or of more than ``prefill_max_requests`` requests)
            runs on it in pieces; only prefills with bidirectional image spans run eagerly.
            Mixed passes and decode steps the decode path does not take run on it too.
        prefill_max_requests: Most requests of one piece on that path (32: a mixed pass
            beside as many running requests as the decode path takes stays one piece).
        padded_prefill: Run prefills through that path even without graphs (on by itself
            whenever ``cuda_graphs`` is).
        max_kv_splits: Split bound of the Triton decode kernel.
    """

    backend: str = 'auto'
    feature_cache_size: int = 64
    bidirectional_image_spans: bool = False
    cuda_graphs: bool = False
    decode_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    padded_decode: bool = False
    vision_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    padded_vision: bool = False
    prefill_token_counts: tuple[int, ...] = (
        *range(64, 513, 64),
        *range(640, 1025, 128),
        *range(1280, 2049, 256),
    )
    prefill_max_requests: int = 32
    padded_prefill: bool = False
    max_kv_splits: int = 8

    def __post_init__(self) -> None:
        if self.backend not in ('auto', 'triton', 'torch'):
            raise ValueError(f'unknown backend {self.backend!r}')
        if self.feature_cache_size < 1:
            raise ValueError('feature_cache_size must be >= 1')
        if not self.decode_batch_sizes or min(self.decode_batch_sizes) < 1:
            raise ValueError(f'bad decode_batch_sizes {self.decode_batch_sizes}')
        if not self.vision_batch_sizes or min(self.vision_batch_sizes) < 1:
            raise ValueError(f'bad vision_batch_sizes {self.vision_batch_sizes}')
        if not self.prefill_token_counts or min(self.prefill_token_counts) < 1:
            raise ValueError(f'bad prefill_token_counts {self.prefill_token_counts}')
        if self.prefill_max_requests < 1:
            raise ValueError('prefill_max_requests must be >= 1')
        if self.max_kv_splits < 1:
            raise ValueError('max_kv_splits must be >= 1')
