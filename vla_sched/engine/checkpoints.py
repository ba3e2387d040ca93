"""Where the engine's checkpoint comes from (a folder, or the built-in tiny one), and how
the engine's settings apply to it (``unnorm_key``, ``action_decoding``, the OpenVLA-OFT
settings of ``oft_preset``)."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from vla_sched.engine.config import EngineConfig
    from vla_sched.model.config.checkpoint_spec import CheckpointSpec
    from vla_sched.model.config.openvla_oft import OFTCheckpointSpec

TINY_CHECKPOINT_NAME = 'tiny-vla-v1'


class ModelPathError(ValueError):
    """``engine.model_path`` (or ``engine.unnorm_key``) names nothing the engine can serve."""


def cache_dir() -> Path:
    """vla_sched's cache folder (``$XDG_CACHE_HOME/vla_sched`` or ``~/.cache/vla_sched``)."""
    base = os.environ.get('XDG_CACHE_HOME') or os.path.join(os.path.expanduser('~'), '.cache')
    return Path(base) / 'vla_sched'


def resolve_checkpoint(model_path: str) -> tuple[Path, bool]:
    """The checkpoint folder to load, and whether it is the built-in random one.

    An empty ``model_path`` means the built-in tiny random checkpoint: built on first use in
    the cache folder, into a temporary folder renamed into place, so a crash mid-build
    never leaves a half-written checkpoint behind.
    """
    if model_path:
        folder = Path(model_path).expanduser()
        if not (folder / 'config.json').is_file():
            raise FileNotFoundError(f'no checkpoint at {folder} (config.json missing)')
        return folder, False
    folder = cache_dir() / TINY_CHECKPOINT_NAME
    if (folder / 'config.json').is_file():
        return folder, True
    from vla_sched.model.loading.tiny_checkpoint import build_tiny_checkpoint

    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f'.{TINY_CHECKPOINT_NAME}-', dir=folder.parent))
    try:
        build_tiny_checkpoint(staging, seed=0, action_horizon=2)
        try:
            staging.rename(folder)
        except OSError:
            if not (folder / 'config.json').is_file():  # not a concurrent build that won
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return folder, True


def read_configured_spec(folder: Path, config: EngineConfig) -> CheckpointSpec | OFTCheckpointSpec:
    """The folder's spec with the engine's ``unnorm_key`` applied (when set): an
    ``OFTCheckpointSpec`` under an ``oft_preset`` (the folder must then be OpenVLA-OFT's)."""
    from vla_sched.model.config.formats import read_checkpoint_spec

    spec = read_checkpoint_spec(folder, oft_settings=config.oft_settings())
    return spec.with_unnorm_key(config.unnorm_key) if config.unnorm_key else spec


def decodes_whole_vocab(config: EngineConfig, spec: CheckpointSpec) -> bool:
    """Whether steps pick action ids over the whole vocabulary (then clipped into the bins,
    OpenVLA's way) rather than only inside the action token range."""
    choice = config.action_decoding
    if choice == 'auto':
        choice = spec.default_action_decoding
    return choice == 'whole_vocab'


def check_model_path(config: EngineConfig) -> None:
    """Check cheaply (JSON files only: no transformers, no torch) that the engine can serve
    ``config.model_path`` with ``config.unnorm_key``.

    The folder must exist, its ``config.json`` name a supported model type, its action
    statistics read, and ``unnorm_key`` name one of its datasets, or be empty for a
    checkpoint with one dataset (or one whose ``vla_config.json`` names its own). An
    OpenVLA-OFT folder needs ``oft_preset``, which any other folder refuses, and the
    scheduled core (the sequential one runs transformers' ``generate``). The engine
    reads the whole spec when it loads. Skipped for the built-in tiny checkpoint
    (``model_path`` empty; an ``oft_preset`` is refused there).

    Raises:
        ModelPathError: naming the setting and what is wrong (the dataset names when the
            ``unnorm_key`` is missing or unknown).
    """
    if not config.model_path:
        if config.oft_preset:
            raise ModelPathError(
                f'engine.oft_preset {config.oft_preset!r} is set but engine.model_path is '
                'empty: the built-in tiny checkpoint is not OpenVLA-OFT'
            )
        return
    from vla_sched.model.config.action_space import ActionStatisticsError
    from vla_sched.model.config.architecture import UnsupportedArchitectureError
    from vla_sched.model.config.checkpoint_spec import CheckpointError
    from vla_sched.model.config.formats import read_dataset_choice

    folder = Path(config.model_path).expanduser()
    _check_oft_preset(folder, config)
    if config.oft_preset and config.core == 'sequential':
        raise ModelPathError(
            f'engine.core sequential does not serve OpenVLA-OFT (engine.oft_preset '
            f'{config.oft_preset!r}): its steps run as one parallel pass, on engine.core '
            'scheduled'
        )
    try:
        names, own_key = read_dataset_choice(folder, oft_settings=config.oft_settings())
    except (CheckpointError, UnsupportedArchitectureError, ActionStatisticsError) as exc:
        settings = ' (OpenVLA-OFT settings: engine.oft_*)' if config.oft_preset else ''
        raise ModelPathError(f'engine.model_path {str(folder)!r}: {exc}{settings}') from None
    key = config.unnorm_key
    if key and key not in names:
        raise ModelPathError(
            f'engine.unnorm_key {key!r} is not a dataset of {folder}; choose one of {list(names)}'
        )
    if not key and own_key is None and len(names) > 1:
        raise ModelPathError(
            f'engine.unnorm_key is empty but {folder} holds the action statistics of '
            f'{len(names)} datasets: set it to one of {list(names)}'
        )


def _check_oft_preset(folder: Path, config: EngineConfig) -> None:
    """Refuse an OpenVLA-OFT folder without ``engine.oft_preset`` and a preset for any other
    folder, naming the parameter (the loader refuses both too, naming its own settings)."""
    from vla_sched.model.config.openvla_oft import oft_component_files

    if not folder.is_dir():
        return  # read_dataset_choice names the missing folder
    found = sorted(name for names in oft_component_files(folder).values() for name in names)
    if found and not config.oft_preset:
        raise ModelPathError(
            f'engine.model_path {str(folder)!r} is an OpenVLA-OFT checkpoint (it holds '
            f'{", ".join(found)}): set engine.oft_preset (libero, aloha or bridge), which gives '
            'the chunk length, action and state sizes, normalization, cameras and center crop '
            '(engine.oft_* override some of them)'
        )
    if config.oft_preset and not found:
        raise ModelPathError(
            f'engine.oft_preset {config.oft_preset!r} is set but engine.model_path '
            f'{str(folder)!r} holds no OpenVLA-OFT component files (action_head--*checkpoint.pt)'
            ': leave engine.oft_preset empty for a plain checkpoint'
        )
