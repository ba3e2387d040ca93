"""What LeRobot's pi0 / pi0.5 processors do to a step's inputs and the model's outputs.

- Images (``pixels``): uint8 ``HxWx3`` -> [0, 1], resized with centred padding to the config's
  square ``image_resolution`` when their size differs (``resize_with_pad_torch``: bilinear,
  ``align_corners=False``, no antialias, sizes ``int(side / ratio)``, clamped to [0, 1], padded
  with 0, the odd pixel at the bottom / right), then ``x * 2 - 1``.
- State (``normalize_state``): the preprocessor's normalizer (``MEAN_STD``:
  ``(x - mean) / (std + 1e-8)``; ``QUANTILES``: ``2 (x - q01) / (q99 - q01) - 1``; ``MIN_MAX``
  and ``QUANTILE10`` alike; a zero range is replaced by 1e-8; no clipping), zero-padded to
  ``max_state_dim``.
- Prompt (``prompt_ids``): pi0 tokenizes the task with a newline appended (unless it ends with
  one); pi0.5 tokenizes ``Task: {task}, State: {bins};\\nAction: `` where the task is stripped
  with ``_`` and newlines replaced by spaces, and the bins are the padded normalized state's
  ``np.digitize(s, linspace(-1, 1, 257)[:-1]) - 1`` (below -1 gives -1, 1 and above 255).
  Both with ``<bos>`` in front, truncated to ``tokenizer_max_length`` as LeRobot's tokenizer
  step does (``truncation=True``); only the valid tokens are returned, no padding.
- Actions (``unnormalize_actions``): the first ``n_action_steps`` rows and ``action_dim``
  columns, un-normalized by the postprocessor's mode (mean/std or quantiles), no clipping.

The PaliGemma tokenizer is not in a LeRobot folder: ``load_paligemma_tokenizer`` reads it from a
folder the user names or from the Hugging Face cache, offline.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.families.pi0.checkpoint import Pi0Spec

NORMALIZER_EPS = 1e-8  # LeRobot's NormalizerProcessorStep eps
STATE_BINS = 256
PALIGEMMA_TOKENIZER_REPO = 'google/paligemma-3b-pt-224'
TOKENIZER_FILES = ('tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json')


class TokenizerMissingError(CheckpointError):
    """The PaliGemma tokenizer is neither in the named folder nor in the Hugging Face cache."""


def download_command(folder: str | Path | None) -> str:
    """The command that puts the PaliGemma tokenizer files into ``folder``."""
    target = '<dir>' if folder is None else str(folder)
    return (
        f'hf download {PALIGEMMA_TOKENIZER_REPO} {" ".join(TOKENIZER_FILES)} --local-dir {target}'
    )


def hub_cache_dir() -> Path:
    """The Hugging Face hub cache: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else
    ``~/.cache/huggingface/hub`` (as ``huggingface_hub`` resolves it)."""
    if os.environ.get('HF_HUB_CACHE'):
        return Path(os.environ['HF_HUB_CACHE']).expanduser()
    home = os.environ.get('HF_HOME') or os.path.join(
        os.environ.get('XDG_CACHE_HOME', '~/.cache'), 'huggingface'
    )
    return Path(home).expanduser() / 'hub'


def _cached_tokenizer_folder(cache_dir: Path) -> Path | None:
    """The snapshot of the PaliGemma repo that ``refs/main`` names in the hub cache's layout
    (``models--google--paligemma-3b-pt-224/snapshots/<revision>/``), if it holds
    ``tokenizer.json``."""
    repo = cache_dir / ('models--' + PALIGEMMA_TOKENIZER_REPO.replace('/', '--'))
    ref = repo / 'refs' / 'main'
    if not ref.is_file():
        return None
    snapshot = repo / 'snapshots' / ref.read_text().strip()
    return snapshot if (snapshot / 'tokenizer.json').is_file() else None


def load_paligemma_tokenizer(
    folder: str | Path | None = None, *, cache_dir: str | Path | None = None
) -> Any:
    """PaliGemma's tokenizer from ``folder`` (its ``tokenizer.json`` and config) or, when
    None, from the Hugging Face cache of ``google/paligemma-3b-pt-224`` (``cache_dir``, by
    default ``HF_HUB_CACHE``); never downloads.

    Raises:
        TokenizerMissingError: naming where it looked and the ``hf download`` command (the repo
            is gated: accept its license on the hub first).
    """
    from transformers import AutoTokenizer

    if folder is not None:
        where = Path(folder)
        if not (where / 'tokenizer.json').is_file():
            raise TokenizerMissingError(
                f'no PaliGemma tokenizer.json in {where}; download it (the repo is gated: accept '
                f'its license first) with: {download_command(where)}'
            )
    else:
        cache = hub_cache_dir() if cache_dir is None else Path(cache_dir)
        where = _cached_tokenizer_folder(cache)
        if where is None:
            raise TokenizerMissingError(
                f'the PaliGemma tokenizer is not in the Hugging Face cache ({cache}); download it '
                f'(the repo is gated: accept its license first) with: {download_command(None)} '
                'and name that folder'
            )
    return AutoTokenizer.from_pretrained(str(where), local_files_only=True)


def resize_with_pad(images: torch.Tensor, size: int) -> torch.Tensor:
    """``[N, 3, H, W]`` float32 in [0, 1] -> ``[N, 3, size, size]``, LeRobot's
    ``resize_with_pad_torch`` on float images: aspect kept, centred, padded with 0."""
    height, width = images.shape[-2:]
    ratio = max(width / size, height / size)
    new_height, new_width = int(height / ratio), int(width / ratio)
    resized = F.interpolate(
        images, size=(new_height, new_width), mode='bilinear', align_corners=False
    ).clamp(0.0, 1.0)
    top, left = (size - new_height) // 2, (size - new_width) // 2
    bottom, right = size - new_height - top, size - new_width - left
    return F.pad(resized, (left, right, top, bottom), mode='constant', value=0.0)


def discretize_state(normalized: np.ndarray) -> np.ndarray:
    """pi0.5's state bins: ``np.digitize(s, linspace(-1, 1, 257)[:-1]) - 1`` (int64)."""
    bins = np.linspace(-1.0, 1.0, STATE_BINS + 1)[:-1]
    return np.digitize(normalized, bins=bins) - 1


class Pi0Processor:
    """A folder's pre- and post-processing for one step at a time (see the module doc)."""

    def __init__(self, spec: Pi0Spec, tokenizer: Any) -> None:
        self.spec = spec
        self.tokenizer = tokenizer

    def pixels(self, images: Sequence[np.ndarray]) -> torch.Tensor:
        """One uint8 ``HxWx3`` image per camera -> float32 ``[N, 3, S, S]`` in [-1, 1]."""
        out = []
        size = self.spec.image_size
        for image in images:
            array = np.asarray(image)
            if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
                raise ValueError(f'an image must be uint8 HxWx3, got {array.dtype} {array.shape}')
            x = torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)[None]
            x = x.to(torch.float32) / 255.0
            if tuple(x.shape[-2:]) != (size, size):
                x = resize_with_pad(x, size)
            out.append(x[0] * 2.0 - 1.0)
        return torch.stack(out)

    def _normalized_state(self, state: Sequence[float] | np.ndarray) -> np.ndarray:
        spec = self.spec
        x = np.asarray(state, dtype=np.float32)
        if x.shape != (spec.state_dim,):
            raise ValueError(f'the state has shape {x.shape}, the folder ({spec.state_dim},)')
        if not np.isfinite(x).all():
            raise ValueError('the state holds values that are not finite')
        stats, mode = spec.state_statistics, spec.state_mode
        if mode == 'MEAN_STD':
            y = (x - stats['mean']) / (stats['std'] + np.float32(NORMALIZER_EPS))
        elif mode == 'IDENTITY':
            y = x
        else:
            low, high = {'MIN_MAX': ('min', 'max'), 'QUANTILES': ('q01', 'q99')}.get(
                mode, ('q10', 'q90')
            )
            span = stats[high] - stats[low]
            span = np.where(span == 0, np.float32(NORMALIZER_EPS), span).astype(np.float32)
            y = np.float32(2.0) * (x - stats[low]) / span - np.float32(1.0)
        padded = np.zeros(spec.max_state_dim, dtype=np.float32)
        padded[: spec.state_dim] = y
        return padded

    def normalize_state(self, state: Sequence[float] | np.ndarray) -> torch.Tensor:
        """The robot's state -> normalized float32 ``[max_state_dim]``, zero-padded."""
        return torch.from_numpy(self._normalized_state(state))

    def prompt_text(self, instruction: str, state: Sequence[float] | np.ndarray) -> str:
        """The text LeRobot's preprocessor tokenizes (pi0: the task and a newline)."""
        if self.spec.policy_type == 'pi0':
            return instruction if instruction.endswith('\n') else f'{instruction}\n'
        cleaned = instruction.strip().replace('_', ' ').replace('\n', ' ')
        bins = ' '.join(map(str, discretize_state(self._normalized_state(state))))
        return f'Task: {cleaned}, State: {bins};\nAction: '

    def instruction_tokens(self, instruction: str) -> int:
        """Tokens of ``instruction`` alone (no ``<bos>``, no template text)."""
        return len(self.tokenizer(instruction, add_special_tokens=False)['input_ids'])

    def prompt_ids(self, instruction: str, state: Sequence[float] | np.ndarray) -> tuple[int, ...]:
        """The prompt's valid token ids (``<bos>`` first), truncated to
        ``tokenizer_max_length`` as LeRobot does; pi0 ignores ``state`` here."""
        encoded = self.tokenizer(
            self.prompt_text(instruction, state),
            max_length=self.spec.tokenizer_max_length,
            truncation=True,
            padding='max_length',
            padding_side='right',
        )
        ids = tuple(
            int(i)
            for i, valid in zip(encoded['input_ids'], encoded['attention_mask'], strict=True)
            if valid
        )
        too_large = [i for i in ids if i >= self.spec.vocab_size]
        if too_large:
            raise ValueError(
                f'the tokenizer gave id {too_large[0]}, outside the model vocabulary of '
                f'{self.spec.vocab_size}: it is not the tokenizer of this folder'
            )
        return ids

    def normalize_actions(self, actions: np.ndarray) -> np.ndarray:
        """Robot-unit actions ``[n, action_dim]`` -> the model's normalized space, zero-padded
        to ``[n, max_action_dim]``: the exact inverse of ``unnormalize_actions`` (a
        real-time-chunking target is the previous chunk as the model produced it)."""
        spec = self.spec
        x = np.asarray(actions, np.float32)
        if x.ndim != 2 or x.shape[1] != spec.action_dim:
            raise ValueError(f'actions must be [n, {spec.action_dim}], got {list(x.shape)}')
        stats = {k: np.asarray(v, np.float32) for k, v in spec.action_statistics.items()}
        mode = spec.action_mode
        if mode == 'MEAN_STD':
            y = (x - stats['mean']) / stats['std']
        elif mode == 'IDENTITY':
            y = x.copy()
        else:
            low, high = {'MIN_MAX': ('min', 'max'), 'QUANTILES': ('q01', 'q99')}.get(
                mode, ('q10', 'q90')
            )
            span = stats[high] - stats[low]
            span = np.where(span == 0, np.float32(NORMALIZER_EPS), span)
            y = np.float32(2.0) * (x - stats[low]) / span - np.float32(1.0)
        padded = np.zeros((x.shape[0], spec.max_action_dim), dtype=np.float32)
        padded[:, : spec.action_dim] = y
        return padded

    def unnormalize_actions(self, x: torch.Tensor | np.ndarray) -> torch.Tensor:
        """float32 ``[chunk_size, max_action_dim]`` normalized actions -> the robot's
        ``[n_action_steps, action_dim]`` (no clipping)."""
        spec = self.spec
        actions = torch.as_tensor(x, dtype=torch.float32)
        if tuple(actions.shape) != (spec.chunk_size, spec.max_action_dim):
            raise ValueError(
                f'actions of shape {tuple(actions.shape)}, expected '
                f'({spec.chunk_size}, {spec.max_action_dim})'
            )
        y = actions[: spec.n_action_steps, : spec.action_dim]
        stats = {k: torch.from_numpy(np.asarray(v)) for k, v in spec.action_statistics.items()}
        mode = spec.action_mode
        if mode == 'MEAN_STD':
            return y * stats['std'] + stats['mean']
        if mode == 'IDENTITY':
            return y.clone()
        low, high = {'MIN_MAX': ('min', 'max'), 'QUANTILES': ('q01', 'q99')}.get(
            mode, ('q10', 'q90')
        )
        span = stats[high] - stats[low]
        span = torch.where(span == 0, torch.tensor(NORMALIZER_EPS, dtype=torch.float32), span)
        return (y + 1.0) * span / 2.0 + stats[low]
