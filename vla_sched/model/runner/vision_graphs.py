"""The vision encoder on persistent buffers, padded to a few batch sizes, optionally CUDA graphs.

A frame's pixels always have the same shape (``[C, S, S]`` after preprocessing), so the
towers and projector are a fixed sequence of kernels per batch size: on a GPU each padded
size is captured once as a CUDA graph and replayed, which removes the host time of the
eager pass (hundreds of module calls across two ViTs). A batch of ``N`` images runs at the
smallest prepared size ``>= N``; padding rows hold zeros and their features are dropped.
Without capture (the CPU) the same padded path runs eagerly, so tests can check it.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

import torch
from torch import nn

from vla_sched.model.runner.graph_capture import capture_graphs

logger = logging.getLogger(__name__)


class VisionGraphs:
    """Padded vision encoder passes for fixed batch sizes.

    Args:
        vision: The vision encoder (``[N, C, S, S]`` pixels -> ``[N, tokens, hidden]``).
        pixel_shape: One image's preprocessed shape ``(C, S, S)``.
        batch_sizes: Padded batch sizes to prepare.
        device: Where the encoder runs.
        output_dtype: The dtype the features are returned in (the decoder's).
        capture: Capture CUDA graphs (needs a CUDA device).
    """

    def __init__(
        self,
        vision: nn.Module,
        *,
        pixel_shape: tuple[int, int, int],
        batch_sizes: Sequence[int],
        device: torch.device,
        output_dtype: torch.dtype,
        capture: bool,
    ) -> None:
        if not batch_sizes or min(batch_sizes) < 1:
            raise ValueError(f'batch sizes must be positive, got {batch_sizes}')
        if capture and device.type != 'cuda':
            raise ValueError('CUDA graph capture needs a CUDA device')
        self.vision = vision
        self.batch_sizes = tuple(sorted(set(batch_sizes)))
        self.max_batch_size = self.batch_sizes[-1]
        self.device = device
        self.output_dtype = output_dtype
        self.pixels = torch.zeros(
            (self.max_batch_size, *pixel_shape), dtype=torch.float32, device=device
        )
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}
        if capture:
            self._capture_all()

    @property
    def is_captured(self) -> bool:
        return bool(self._graphs)

    def padded_size(self, num_images: int) -> int | None:
        """The prepared batch size ``num_images`` run at, or None if too many."""
        for size in self.batch_sizes:
            if size >= num_images:
                return size
        return None

    def encode(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[N, C, S, S]`` pixels -> ``[N, tokens, hidden]`` features (a new tensor each call).

        Raises:
            ValueError: for more images than the largest prepared size, or another shape.
        """
        num_images = int(pixel_values.shape[0])
        size = self.padded_size(num_images)
        if size is None:
            raise ValueError(f'{num_images} images exceed the prepared {self.max_batch_size}')
        if tuple(pixel_values.shape[1:]) != tuple(self.pixels.shape[1:]):
            raise ValueError(
                f'pixel_values must be [N, {", ".join(map(str, self.pixels.shape[1:]))}], '
                f'got {tuple(pixel_values.shape)}'
            )
        self.pixels[:num_images].copy_(pixel_values)
        self.pixels[num_images:size].zero_()
        graph = self._graphs.get(size)
        if graph is None:
            return self._forward(size)[:num_images].clone()
        graph.replay()
        # The next replay overwrites the output buffer; the feature cache keeps these rows.
        return self._outputs[size][:num_images].clone()

    def _forward(self, size: int) -> torch.Tensor:
        with torch.inference_mode():
            return self.vision(self.pixels[:size]).to(self.output_dtype)

    def _capture_all(self) -> None:
        self._graphs, self._outputs = capture_graphs(self.batch_sizes, self._forward, self.device)
        logger.info('vision encoder captured for batch sizes %s', list(self.batch_sizes))
