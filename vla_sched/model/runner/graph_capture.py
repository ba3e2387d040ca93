"""Capturing one forward pass per padded size as CUDA graphs that share a memory pool."""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch


def capture_graphs(
    sizes: Sequence[int], forward: Callable[[int], torch.Tensor], device: torch.device
) -> tuple[dict[int, torch.cuda.CUDAGraph], dict[int, torch.Tensor]]:
    """Capture ``forward(size)`` for every size, largest first, on a side stream.

    Each size runs twice before its capture (kernels compiled, allocator settled); the
    graphs share one memory pool, so they cost about as much memory as the largest.

    Returns:
        The graphs and the output tensor each replay writes, by size.
    """
    graphs: dict[int, torch.cuda.CUDAGraph] = {}
    outputs: dict[int, torch.Tensor] = {}
    pool = None
    stream = torch.cuda.Stream(device=device)
    with torch.inference_mode():
        for size in sorted(set(sizes), reverse=True):
            stream.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(stream):
                for _ in range(2):
                    forward(size)
            torch.cuda.current_stream().wait_stream(stream)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool, stream=stream):
                outputs[size] = forward(size)
            pool = graph.pool()
            graphs[size] = graph
    torch.cuda.synchronize(device)
    return graphs, outputs
