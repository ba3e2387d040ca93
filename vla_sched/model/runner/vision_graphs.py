"""The vision encoder on persistent buffers, padded to a few batch sizes, optionally CUDA graphs.

A frame's pixels always have the same shape (``[C, S, S]`` after preprocessing), so the
towers and projector are a fixed sequence of kernels per batch size; a captured graph
removes the host time of the eager pass (hundreds of module calls across two ViTs). A batch
of ``N`` images runs at the smallest prepared size ``>= N`` (see ``graph_runner``); padding
rows hold zeros and their features are dropped; more images than the largest size run as
several passes. The captured call is the whole encoder (``OpenVLAVisionEncoder.forward``:
both towers, their concatenated patch features and the projector), so a batch's towers are
one replay per pass.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from vla_sched.model.runner.graph_runner import GraphRunner
from vla_sched.model.runner.padding_stats import PaddingCounter


class VisionGraphs(GraphRunner):
    """Padded vision encoder passes for fixed batch sizes.

    Args:
        vision: The vision encoder (``[N, C, S, S]`` pixels -> ``[N, tokens, hidden]``).
        pixel_shape: One image's preprocessed shape ``(C, S, S)``.
        batch_sizes: Padded batch sizes to prepare.
        device: Where the encoder runs.
        output_dtype: The dtype the features are returned in (the decoder's).
        capture: Capture CUDA graphs (needs a CUDA device).
        padding: Where the passes' real and padding images are counted.
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
        padding: PaddingCounter | None = None,
    ) -> None:
        super().__init__(
            sizes=batch_sizes,
            device=device,
            capture=capture,
            name='vision encoder',
            sizes_name='batch sizes',
            padding=padding,
        )
        self.vision = vision
        self.output_dtype = output_dtype
        self.pixels = torch.zeros(
            (self.max_size, *pixel_shape), dtype=torch.float32, device=device
        )
        if capture:
            self.capture_all()

    def encode(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """``[N, C, S, S]`` pixels -> ``[N, tokens, hidden]`` features (a new tensor each call).

        More images than the largest prepared size run as several passes back to back, each
        of the largest size but the last.

        Raises:
            ValueError: for pixels of another shape than the prepared one.
        """
        if tuple(pixel_values.shape[1:]) != tuple(self.pixels.shape[1:]):
            raise ValueError(
                f'pixel_values must be [N, {", ".join(map(str, self.pixels.shape[1:]))}], '
                f'got {tuple(pixel_values.shape)}'
            )
        num_images = int(pixel_values.shape[0])
        pieces = [
            self._encode_piece(pixel_values[start : start + self.max_size])
            for start in range(0, max(num_images, 1), self.max_size)
        ]
        return pieces[0] if len(pieces) == 1 else torch.cat(pieces)

    def _encode_piece(self, pixel_values: torch.Tensor) -> torch.Tensor:
        num_images = int(pixel_values.shape[0])
        size = self.padded_size(num_images)
        assert size is not None  # at most max_size images
        self.pixels[:num_images].copy_(pixel_values)
        self.pixels[num_images:size].zero_()
        # A replay's output is a buffer the next replay overwrites; the feature cache keeps
        # these rows.
        return self.run_padded(size, num_real=num_images)[:num_images].clone()

    def _forward(self, size: int) -> torch.Tensor:
        with torch.inference_mode():
            return self.vision(self.pixels[:size]).to(self.output_dtype)
