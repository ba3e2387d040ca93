"""Builds a control step's prompt token ids, with image placeholder tokens, for the engine.

Uses the ``tokenizers`` library on the checkpoint's ``tokenizer.json`` (no transformers, no
torch), and tokenizes each segment separately so that a robot's session prefix always has
the same token ids, whatever frame follows it. OpenVLA's template puts the image right after
BOS and all its text in one segment, which gives the ids of OpenVLA's processor (the whole
prompt string tokenized with BOS) with the image span inserted after BOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from vla_sched.model.config.action_space import select_statistics
from vla_sched.model.config.checkpoint_spec import (
    TOKENIZER_FILE,
    CheckpointError,
    CheckpointSpec,
    read_json,
)
from vla_sched.model.config.formats import read_checkpoint_spec
from vla_sched.model.families.openvla.action_tokenizer import ActionTokenizer

if TYPE_CHECKING:
    import tokenizers

TOKENIZER_CONFIG_FILE = 'tokenizer_config.json'


@dataclass(frozen=True, slots=True)
class PromptLayout:
    """One step's prompt and where its parts sit.

    Attributes:
        token_ids: The whole prompt; image positions hold the image placeholder token.
        session_prefix_len: Leading tokens that depend only on the instruction (the part
            the radix cache can share across the robot's steps).
        image_offset: Position of the first image placeholder token (-1 without an image).
        num_image_tokens: Length of the image placeholder span.
    """

    token_ids: tuple[int, ...]
    session_prefix_len: int
    image_offset: int
    num_image_tokens: int

    @property
    def image_end(self) -> int:
        return self.image_offset + self.num_image_tokens


class VLAPromptBuilder:
    """Turns an instruction (and optionally a joint state) into prompt token ids."""

    def __init__(
        self, spec: CheckpointSpec, tokenizer: tokenizers.Tokenizer, *, bos_token_id: int | None
    ) -> None:
        if spec.prompt.add_bos and bos_token_id is None:
            raise CheckpointError('the prompt template adds BOS but the tokenizer has none')
        self.spec = spec
        self.tokenizer = tokenizer
        self.bos_token_id = bos_token_id
        self._action_tokenizer = ActionTokenizer(spec.action_tokens)

    @classmethod
    def from_checkpoint(
        cls, folder: str | Path, spec: CheckpointSpec | None = None
    ) -> VLAPromptBuilder:
        """Load the tokenizer of a checkpoint folder (and its spec, unless given)."""
        import tokenizers

        folder = Path(folder)
        spec = spec if spec is not None else read_checkpoint_spec(folder)
        path = folder / TOKENIZER_FILE
        if not path.is_file():
            raise CheckpointError(f'missing {TOKENIZER_FILE} in {folder}')
        tokenizer = tokenizers.Tokenizer.from_file(str(path))
        return cls(spec, tokenizer, bos_token_id=_find_bos(folder, tokenizer))

    @property
    def num_image_tokens(self) -> int:
        return self.spec.num_image_tokens

    @property
    def action_token_range(self) -> tuple[int, int]:
        return self.spec.action_token_range

    @property
    def action_horizon(self) -> int:
        return self.spec.action_horizon

    @property
    def action_dim(self) -> int:
        return self.spec.action_dim

    @property
    def num_action_tokens(self) -> int:
        return self.spec.num_action_tokens

    def encode_text(self, text: str) -> list[int]:
        """Token ids of ``text`` without special tokens."""
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def instruction_tokens(self, instruction: str) -> int:
        """Tokens of ``instruction`` alone, as the template takes it (lowercased when it
        lowercases), without the template's text or special tokens."""
        lower = self.spec.prompt.lowercase_instruction
        return len(self.encode_text(instruction.lower() if lower else instruction))

    def state_token_ids(self, state: np.ndarray) -> list[int]:
        """Joint state -> tokens: normalized with the proprio statistics, then binned."""
        stats = select_statistics(self.spec.proprio_statistics, self.spec.unnorm_key)
        values = np.asarray(state, dtype=np.float64).reshape(-1)
        if values.shape != (stats.action_dim,):
            raise ValueError(f'state has {values.shape[0]} values, statistics {stats.action_dim}')
        return [int(t) for t in self._action_tokenizer.encode(stats.normalize(values))]

    def build(self, instruction: str, *, state: np.ndarray | None = None) -> PromptLayout:
        """Token ids of one step's prompt.

        Each text part of the template is tokenized on its own (without special tokens), so
        text kept in one part (OpenVLA's image-first template: all of it in the prefix) is
        tokenized in one piece, as a tokenizer given the whole string would. The template's
        ``append_token_id`` goes last unless the prompt already ends with it.

        Args:
            instruction: The robot's language instruction.
            state: Joint state, required when the template has state tokens.

        Returns:
            The prompt and the positions of its session prefix and image span.
        """
        template = self.spec.prompt
        if template.state_tokens and state is None:
            raise ValueError('this prompt template needs the joint state')
        text = instruction.lower() if template.lowercase_instruction else instruction
        bos = [self.bos_token_id] if template.add_bos else []
        prefix = self.encode_text(template.prefix.format(instruction=text))
        image = (
            []
            if self.spec.image_token_id is None
            else ([self.spec.image_token_id] * self.num_image_tokens)
        )
        state_ids = self.state_token_ids(state) if template.state_tokens else []
        suffix = self.encode_text(template.suffix) if template.suffix else []
        if template.image_first:
            ids = bos + image + prefix + state_ids + suffix
            image_offset, session_len = len(bos), len(bos)
        else:
            ids = bos + prefix + image + state_ids + suffix
            image_offset = session_len = len(bos) + len(prefix)
        appended = template.append_token_id
        if appended is not None and (not ids or ids[-1] != appended):
            ids.append(appended)
        return PromptLayout(
            token_ids=tuple(int(i) for i in ids),
            session_prefix_len=session_len,
            image_offset=image_offset if image else -1,
            num_image_tokens=len(image),
        )


def _find_bos(folder: Path, tokenizer: tokenizers.Tokenizer) -> int | None:
    bos_text = None
    if (folder / TOKENIZER_CONFIG_FILE).is_file():
        bos = read_json(folder / TOKENIZER_CONFIG_FILE).get('bos_token')
        bos_text = bos.get('content') if isinstance(bos, dict) else bos
    for candidate in (bos_text, '<s>', '<|begin_of_text|>'):
        if candidate is not None and tokenizer.token_to_id(candidate) is not None:
            return int(tokenizer.token_to_id(candidate))
    return None
