"""What LeRobot's SmolVLA processors and ``prepare_images`` do to a step's inputs and the
model's outputs.

- Images (``pixels``): uint8 ``HxWx3`` -> [0, 1], resized with padding to the config's square
  ``resize_imgs_with_padding`` when their size differs (LeRobot's ``resize_with_pad`` of the
  smolvla convention: bilinear, ``align_corners=False``, sizes ``int(side / ratio)``, no clamp,
  padded with 0 on the left and the top), then ``x * 2 - 1``.
- State and actions: as pi0's normalizer and unnormalizer (``pi0/processor.py``: mean/std with
  eps 1e-8, quantiles, min/max; no clipping), the state zero-padded to ``max_state_dim``.
- Prompt (``prompt_ids``): the task with a newline appended unless it ends with one
  (``smolvla_new_line_processor``), tokenized by the VLM's tokenizer as it is (SmolVLM2's adds
  no special token), truncated to ``tokenizer_max_length``; only the valid tokens are
  returned. The request's prompt adds one placeholder for the state token at the end.

The VLM's tokenizer and config are not in a SmolVLA folder: ``vlm_folder`` finds them in a
folder the user names or in the Hugging Face cache of the config's ``vlm_model_name``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F

from vla_sched.model.config.checkpoint_spec import CheckpointError
from vla_sched.model.families.pi0.processor import Pi0Processor, hub_cache_dir
from vla_sched.model.families.smolvla.checkpoint import DEFAULT_VLM_NAME, SmolVLASpec

VLM_FILES = ('config.json', 'tokenizer.json', 'tokenizer_config.json', 'special_tokens_map.json')


class VLMFilesMissingError(CheckpointError):
    """The VLM's config or tokenizer is neither in the named folder nor in the cache."""


def download_command(folder: str | Path | None, *, repo: str = DEFAULT_VLM_NAME) -> str:
    """The command that puts the VLM's config and tokenizer files into ``folder``."""
    target = '<dir>' if folder is None else str(folder)
    return f'hf download {repo} {" ".join(VLM_FILES)} --local-dir {target}'


def cached_vlm_folder(repo: str, cache_dir: Path | None = None) -> Path | None:
    """The snapshot of ``repo`` that ``refs/main`` names in the hub cache, if it holds the
    config and ``tokenizer.json``."""
    cache = hub_cache_dir() if cache_dir is None else cache_dir
    root = cache / ('models--' + repo.replace('/', '--'))
    ref = root / 'refs' / 'main'
    if not ref.is_file():
        return None
    snapshot = root / 'snapshots' / ref.read_text().strip()
    ok = all((snapshot / name).is_file() for name in ('config.json', 'tokenizer.json'))
    return snapshot if ok else None


def vlm_folder(named: Path | None, *, repo: str, cache_dir: Path | None = None) -> Path:
    """The folder of the VLM's config and tokenizer: ``named``, else the cache of ``repo``.

    Raises:
        VLMFilesMissingError: naming where it looked and the ``hf download`` command.
    """
    if named is not None:
        missing = [n for n in ('config.json', 'tokenizer.json') if not (named / n).is_file()]
        if missing:
            raise VLMFilesMissingError(
                f'no {" or ".join(missing)} of {repo} in {named}; download them with: '
                f'{download_command(named, repo=repo)}'
            )
        return named
    found = cached_vlm_folder(repo, cache_dir)
    if found is None:
        raise VLMFilesMissingError(
            f"{repo}'s config and tokenizer are not in the Hugging Face cache "
            f'({hub_cache_dir() if cache_dir is None else cache_dir}); download them with: '
            f'{download_command(None, repo=repo)} and name that folder in '
            'engine.smolvla_vlm_path'
        )
    return found


def load_vlm_tokenizer(folder: Path) -> Any:
    """The VLM's tokenizer from its folder, offline."""
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(folder), local_files_only=True)


def resize_with_pad_left_top(images: torch.Tensor, size: int) -> torch.Tensor:
    """``[N, 3, H, W]`` float32 -> ``[N, 3, size, size]``: aspect kept, padded with 0 on the
    left and the top (LeRobot's smolvla ``resize_with_pad``; no clamp)."""
    height, width = images.shape[-2:]
    ratio = max(width / size, height / size)
    new_height, new_width = int(height / ratio), int(width / ratio)
    resized = F.interpolate(
        images, size=(new_height, new_width), mode='bilinear', align_corners=False
    )
    return F.pad(resized, (max(0, size - new_width), 0, max(0, size - new_height), 0), value=0.0)


class SmolVLAProcessor(Pi0Processor):
    """A SmolVLA folder's pre- and post-processing (see the module doc): pi0's state and action
    normalization, SmolVLA's image padding and prompt."""

    def __init__(self, spec: SmolVLASpec, tokenizer: Any) -> None:
        super().__init__(spec, tokenizer)  # type: ignore[arg-type]

    def pixels(self, images: Sequence[np.ndarray]) -> torch.Tensor:
        """One uint8 ``HxWx3`` image per camera -> float32 ``[N, 3, S, S]`` in [-1, 1]."""
        out, size = [], self.spec.image_size
        for image in images:
            array = np.asarray(image)
            if array.dtype != np.uint8 or array.ndim != 3 or array.shape[2] != 3:
                raise ValueError(f'an image must be uint8 HxWx3, got {array.dtype} {array.shape}')
            x = torch.from_numpy(np.ascontiguousarray(array)).permute(2, 0, 1)[None]
            x = x.to(torch.float32) / 255.0
            if tuple(x.shape[-2:]) != (size, size):
                x = resize_with_pad_left_top(x, size)
            out.append(x[0] * 2.0 - 1.0)
        return torch.stack(out)

    def prompt_text(self, instruction: str, state: Sequence[float] | np.ndarray) -> str:
        """The task with a newline, as ``smolvla_new_line_processor`` leaves it."""
        return instruction if instruction.endswith('\n') else f'{instruction}\n'

    def instruction_tokens(self, text: str) -> int:
        """Tokens of ``text`` alone as the VLM's tokenizer splits it (no newline, no special
        token)."""
        return len(self.tokenizer(text, add_special_tokens=False)['input_ids'])
