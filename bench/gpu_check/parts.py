"""The parts of the prepared GPU run, in order, and what a part knows when it runs."""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.gpu_check.json_files import json_text, write_whole


@dataclass(frozen=True, slots=True)
class Part:
    """One part: its limit at the default budget and whether it reads the checkpoint."""

    name: str
    limit_s: float
    needs_checkpoint: bool = False


DEFAULT_BUDGET_S = 510.0
PARTS = (
    Part('environment', 27),  # the decode builds first (about 10 compiles), then the rates
    Part('kernels', 70),  # bench.gpu_kernels sweeps launch configs until 55 s in
    Part('checkpoint', 50),
    Part('model', 48),
    Part('profile', 30),
    Part('engine_core', 32, needs_checkpoint=True),
    Part('serving', 93, needs_checkpoint=True),
    Part('oft', 45, needs_checkpoint=True),
    Part('scheduler', 37, needs_checkpoint=True),
    Part('pi0', 50),  # unmeasured, it writes its own folder
    Part('smolvla', 28),  # last: unmeasured, it writes its own folder
)
PART_NAMES = tuple(p.name for p in PARTS)


def partial_file_of(result_file: Path) -> Path:
    """Where a part saves what it has measured so far: beside its result file."""
    return result_file.with_name(f'{result_file.stem}.partial.json')


@dataclass(frozen=True, slots=True)
class PartContext:
    """What a part knows: the mode, the work dir, the results of the parts before it and
    where it saves its data so far (``save_partial``; None: nowhere)."""

    dry_run: bool
    workdir: Path
    prior: dict[str, Any]
    partial_file: Path | None = None

    @property
    def device(self) -> str:
        return 'cpu' if self.dry_run else 'cuda'

    @property
    def dtype(self):
        """float32 in the dry run (the Triton interpreter runs fp32 only), else bfloat16."""
        import torch

        return torch.float32 if self.dry_run else torch.bfloat16

    def require_cuda(self) -> None:
        import torch

        if not self.dry_run and not torch.cuda.is_available():
            raise RuntimeError('no CUDA device (use --dry-run on a CPU)')

    def save_partial(self, data: dict[str, Any]) -> None:
        """Save ``data``, what the part has measured so far, in the shape of its result (its
        ``section`` renders it), replacing what it saved before: written to a temporary file,
        then renamed, so a part stopped at any moment leaves the previous save or this one.
        The driver keeps it when the part does not end ok."""
        if self.partial_file is not None:
            write_whole(self.partial_file, json_text(data))

    def data(self, part: str) -> dict[str, Any]:
        """What ``part`` found, if it ended ok (else nothing)."""
        entry = self.prior.get(part, {})
        return entry.get('data', {}) if entry.get('status') == 'ok' else {}

    def rates(self):
        """The environment part's copy bandwidth and matmul rate (None without them)."""
        from bench.lib.device_timing import MeasuredRates

        env = self.data('environment')
        if not env:
            return None
        return MeasuredRates(env['copy_gb_per_s'], env['matmul_tflops'], env['matmul_dtype'])

    def folder(self) -> Path:
        folder = self.data('checkpoint').get('folder')
        if not folder:
            raise RuntimeError('no checkpoint folder: the checkpoint part did not end ok')
        return Path(folder)


def part_module(name: str):
    """The module of part ``name``: ``run(ctx)`` gives its data, ``section(data)`` its report
    lines; imported only in the part's own process (its imports are the part's)."""
    if name not in PART_NAMES:
        raise ValueError(f'unknown part {name!r}; one of {PART_NAMES}')
    return importlib.import_module(f'bench.gpu_check.{name}')
