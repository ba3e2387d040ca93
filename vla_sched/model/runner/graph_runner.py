"""A forward pass on persistent buffers at a few padded sizes, replayed as CUDA graphs.

Decode steps, prefills and the vision encoder share one scheme: every tensor the forward
reads lives in a persistent buffer, a batch runs at the smallest prepared size that holds
it, and the rows past the batch are padding. Each prepared size is then a fixed sequence of
kernels, so on a GPU it is captured once as a CUDA graph and replayed; without capture (the
CPU) the same padded forward runs eagerly, which lets tests check the padding.
"""

from __future__ import annotations

import logging
from abc import ABC, abstractmethod
from collections.abc import Sequence

import torch

from vla_sched.model.runner.padding_stats import PaddingCounter

logger = logging.getLogger(__name__)


class GraphRunner(ABC):
    """The prepared sizes of a padded forward and its capture, replay or eager run.

    A subclass allocates its persistent buffers, then calls :meth:`capture_all` when asked
    to capture. Per batch it copies the inputs into its buffers (padding them up to
    :meth:`padded_size`), takes :meth:`run_padded` and keeps the batch's rows. It implements
    :meth:`_forward`, which reads only the buffers. Every run is counted in ``padding``.

    Args:
        sizes: Padded sizes to prepare (batch sizes or token counts).
        device: Where the forward runs.
        capture: Whether the subclass captures graphs (checked here, before any buffer).
        name: What runs, for errors and logs ('decode', 'prefill', 'vision encoder').
        sizes_name: What a size counts, for errors and logs ('batch sizes', 'token counts').
        padding: Where the runs' real and padding units are counted (a new counter if None).
    """

    def __init__(
        self,
        *,
        sizes: Sequence[int],
        device: torch.device,
        capture: bool,
        name: str,
        sizes_name: str,
        padding: PaddingCounter | None = None,
    ) -> None:
        if not sizes or min(sizes) < 1:
            raise ValueError(f'{sizes_name} must be positive, got {sizes}')
        if capture and device.type != 'cuda':
            raise ValueError('CUDA graph capture needs a CUDA device')
        self.sizes = tuple(sorted(set(sizes)))
        self.max_size = self.sizes[-1]
        self.device = device
        self.name = name
        self.sizes_name = sizes_name
        self.padding = padding if padding is not None else PaddingCounter()
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}

    @property
    def is_captured(self) -> bool:
        return bool(self._graphs)

    def padded_size(self, n: int) -> int | None:
        """The smallest prepared size ``>= n``, or None if ``n`` exceeds them all."""
        for size in self.sizes:
            if size >= n:
                return size
        return None

    def run_padded(self, size: int, *, num_real: int) -> torch.Tensor:
        """The forward's output at a prepared ``size``, its inputs (``num_real`` real units,
        then padding) already in the buffers: the graph's replay when captured (a buffer the
        next replay overwrites), else an eager run of the same padded forward."""
        self.padding.add_padded(num_real=num_real, size=size)
        graph = self._graphs.get(size)
        if graph is None:
            return self._forward(size)
        graph.replay()
        return self._outputs[size]

    def capture_all(self) -> None:
        """Capture ``_forward(size)`` for every size, largest first, on a side stream.

        Each size runs twice before its capture (kernels compiled, allocator settled); the
        graphs share one memory pool, so they cost about as much memory as the largest.
        """
        graphs: dict[int, torch.cuda.CUDAGraph] = {}
        outputs: dict[int, torch.Tensor] = {}
        pool = None
        stream = torch.cuda.Stream(device=self.device)
        with torch.inference_mode():
            for size in reversed(self.sizes):
                stream.wait_stream(torch.cuda.current_stream())
                with torch.cuda.stream(stream):
                    for _ in range(2):  # warm-up
                        self._forward(size)
                torch.cuda.current_stream().wait_stream(stream)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    outputs[size] = self._forward(size)
                pool = graph.pool()
                graphs[size] = graph
        torch.cuda.synchronize(self.device)
        self._graphs, self._outputs = graphs, outputs
        logger.info('%s captured for %s %s', self.name, self.sizes_name, list(self.sizes))

    @abstractmethod
    def _forward(self, size: int) -> torch.Tensor:
        """The padded forward at ``size``, reading its inputs from the persistent buffers."""
