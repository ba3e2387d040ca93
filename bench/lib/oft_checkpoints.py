"""OpenVLA-OFT folders for benchmarks, made from an OpenVLA folder without copying it.

An OFT fine-tune ships openvla-7b's own files (``config.json``, the merged model's
safetensors, the tokenizer) plus ``dataset_statistics.json`` and its component files. So an
OFT folder here links every file of an OpenVLA folder (the 15 GB of openvla-7b's weights are
linked, not copied) and adds what OFT adds, drawn at the base's widths: the statistics of a
LIBERO-like dataset (``vla_sched.testing.openvla_oft_writer``'s layout and dataset name), an
L1 action head (about 151 M parameters at openvla-7b's width 4096 and 7 action values) and a
proprio projector, seeded random on the given device in the given dtype, saved as training
saves them (``module.`` keys). The actions they give mean nothing.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import torch

from vla_sched.model.config.action_space import ACTION_STATISTICS_FILE
from vla_sched.model.config.openvla import openvla_text_config
from vla_sched.model.families.openvla_oft.checkpoint import (
    ACTION_HEAD_COMPONENT,
    OPENVLA_OFT_COMPONENTS,
    PROPRIO_PROJECTOR_COMPONENT,
    OFTSettings,
)
from vla_sched.model.families.openvla_oft.weights import (
    action_head_shapes,
    proprio_projector_shapes,
)
from vla_sched.testing.openvla_oft_writer import (
    OFT_DATASET,
    component_file_name,
    oft_statistics,
    save_component,
)

COMPLETE_MARKER = '.complete'  # written last: a folder without it is redone
# Files of the base folder an OFT folder does not link (nor any component file): the
# statistics (it writes its own) and the base's marker.
_NOT_LINKED = (ACTION_STATISTICS_FILE, COMPLETE_MARKER)


def random_component_state(
    shapes: dict[str, tuple[int, ...]], *, device: torch.device | str, dtype: torch.dtype,
    seed: int,
) -> dict[str, torch.Tensor]:  # fmt: skip
    """Seeded random tensors of ``shapes``: norm weights near 1, biases small, matrices
    scaled by their fan-in (so activations stay O(1)); drawn on ``device`` in ``dtype``."""
    generator = torch.Generator(device=device).manual_seed(seed)
    state = {}
    for name, shape in shapes.items():
        drawn = torch.randn(shape, generator=generator, device=device, dtype=torch.float32)
        if name.endswith('weight') and len(shape) == 1:
            drawn = 1.0 + 0.1 * drawn
        elif name.endswith('bias'):
            drawn = 0.1 * drawn
        else:
            drawn = drawn / math.sqrt(shape[1])
        state[name] = drawn.to(dtype)
    return state


def _on_host(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Saved from the host, so the file loads anywhere as training's files do."""
    return {name: t.cpu() for name, t in state.items()}


def _linked_files(base: Path) -> list[Path]:
    components = tuple(f'{c}--' for c in OPENVLA_OFT_COMPONENTS)
    return [
        p
        for p in sorted(base.iterdir())
        if p.is_file() and p.name not in _NOT_LINKED and not p.name.startswith(components)
    ]


def write_oft_folder_from_openvla(
    base: Path, folder: Path, *, settings: OFTSettings, device: torch.device | str,
    dtype: torch.dtype, seed: int = 0,
) -> Path:  # fmt: skip
    """Make ``folder`` an OFT folder of ``settings`` on ``base``'s OpenVLA files (see the
    module doc); files of the same names already there are replaced. Returns ``folder``."""
    base = base.resolve()
    folder.mkdir(parents=True, exist_ok=True)
    for source in _linked_files(base):
        link = folder / source.name
        link.unlink(missing_ok=True)
        link.symlink_to(source)
    stats = oft_statistics(
        (OFT_DATASET,), action_dim=settings.action_dim, proprio_dim=settings.proprio_dim
    )
    (folder / ACTION_STATISTICS_FILE).write_text(json.dumps(stats, indent=2) + '\n')
    config = json.loads((base / 'config.json').read_text())
    hidden = int(openvla_text_config(config)['hidden_size'])
    head = random_component_state(
        action_head_shapes(hidden, settings.action_dim), device=device, dtype=dtype, seed=seed
    )
    save_component(folder / component_file_name(ACTION_HEAD_COMPONENT), _on_host(head))
    if settings.use_proprio:
        projector = random_component_state(
            proprio_projector_shapes(hidden, settings.proprio_dim),
            device=device, dtype=dtype, seed=seed + 1,
        )  # fmt: skip
        save_component(
            folder / component_file_name(PROPRIO_PROJECTOR_COMPONENT), _on_host(projector)
        )
    return folder


def oft_folder_once(
    workdir: Path, base: Path, *, settings: OFTSettings, device: torch.device | str,
    dtype: torch.dtype,
) -> tuple[Path, bool]:  # fmt: skip
    """The OFT folder on ``base`` in ``workdir`` (named after it), made unless a finished
    one is there already; returns it and whether it was reused."""
    folder = workdir / f'{base.name}-oft'
    done = folder / COMPLETE_MARKER
    reused = done.exists()
    if not reused:
        write_oft_folder_from_openvla(base, folder, settings=settings, device=device, dtype=dtype)
        done.write_text('written\n')
    return folder, reused
