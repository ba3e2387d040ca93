"""Where the engine's checkpoint comes from: a folder, or the built-in tiny one."""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

TINY_CHECKPOINT_NAME = 'tiny-vla-v1'


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
    from vla_sched.model.tiny_checkpoint import build_tiny_checkpoint

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
