"""The whole token sequence of one OpenVLA-OFT step, and where each part sits in it.

OpenVLA-OFT's ``predict_action`` runs one pass over::

    [BOS] [n patches x num_images] [proprio] [prompt text ... 29871] [A*K slots] [</s>]
    0     1                        P         P+1 (or P without proprio)          L-1

Images come in camera order (primary first), each ``n`` placeholder tokens whose embeddings
are the towers' projected patches; the proprio token (when used) is the projected state;
the prompt is OpenVLA's (``In: What action should the robot take to {...}?\\nOut:`` with
29871 appended); the ``A*K`` action slots have zero embeddings; ``</s>`` closes the
sequence as in training. The head reads the final hidden states of positions
``action_offset - 1 .. action_offset + A*K - 2``: the state one position before each action
slot (the 29871 position and the first ``A*K - 1`` slots), as upstream slices them.

Placeholder ids: images and proprio hold the checkpoint's image token (never embedded), the
action slots hold 1 (upstream's placeholder; its embedding is zeroed).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from vla_sched.model.families.openvla.prompt import VLAPromptBuilder
from vla_sched.model.families.openvla_oft.checkpoint import (
    OFT_ACTION_PLACEHOLDER_ID,
    OFT_STOP_TOKEN_ID,
    OFTCheckpointSpec,
)

if TYPE_CHECKING:
    import tokenizers


@dataclass(frozen=True, slots=True)
class OFTSequence:
    """Where the parts of one OFT step's sequence sit (see the module docstring).

    Attributes:
        seq_len: Positions of the whole sequence.
        num_images: Camera images, each ``num_image_tokens`` positions from position 1.
        num_image_tokens: Positions of one image.
        has_proprio: Whether one proprio position follows the images.
        prompt_len: Prompt text positions after BOS, 29871 included (upstream's
            ``NUM_PROMPT_TOKENS``).
        num_action_tokens: Action slots ``A*K``; one stop token follows them.
    """

    seq_len: int
    num_images: int
    num_image_tokens: int
    has_proprio: bool
    prompt_len: int
    num_action_tokens: int

    def __post_init__(self) -> None:
        if min(self.num_images, self.num_image_tokens, self.prompt_len) < 1:
            raise ValueError(f'an OFT sequence needs images and a prompt, got {self}')
        if self.num_action_tokens < 1:
            raise ValueError(f'an OFT sequence needs action slots, got {self}')
        expected = self.action_offset + self.num_action_tokens + 1
        if self.seq_len != expected:
            raise ValueError(f"seq_len {self.seq_len} != the parts' {expected}")

    @classmethod
    def from_length(
        cls,
        seq_len: int,
        *,
        num_images: int,
        num_image_tokens: int,
        has_proprio: bool,
        num_action_tokens: int,
    ) -> OFTSequence:
        """The layout of a sequence of ``seq_len`` positions with these parts.

        Raises:
            ValueError: when no prompt fits (too short a sequence).
        """
        fixed = 1 + num_images * num_image_tokens + int(has_proprio) + num_action_tokens + 1
        return cls(
            seq_len=seq_len,
            num_images=num_images,
            num_image_tokens=num_image_tokens,
            has_proprio=has_proprio,
            prompt_len=seq_len - fixed,
            num_action_tokens=num_action_tokens,
        )

    def image_offset(self, index: int) -> int:
        """First position of camera image ``index``."""
        if not 0 <= index < self.num_images:
            raise IndexError(f'image {index} of {self.num_images}')
        return 1 + index * self.num_image_tokens

    @property
    def proprio_offset(self) -> int:
        """Position of the proprio token (-1 without one)."""
        return 1 + self.num_images * self.num_image_tokens if self.has_proprio else -1

    @property
    def prompt_offset(self) -> int:
        """First position of the prompt text (right after the images and proprio)."""
        return 1 + self.num_images * self.num_image_tokens + int(self.has_proprio)

    @property
    def action_offset(self) -> int:
        """First action slot."""
        return self.prompt_offset + self.prompt_len

    @property
    def head_offset(self) -> int:
        """First of the ``num_action_tokens`` positions whose hidden states the head reads."""
        return self.action_offset - 1

    @property
    def stop_offset(self) -> int:
        return self.seq_len - 1


@dataclass(frozen=True, slots=True)
class OFTPrompt:
    """One step's token ids and their layout."""

    token_ids: tuple[int, ...]
    layout: OFTSequence


class OFTPromptBuilder:
    """Builds OFT step sequences: OpenVLA's prompt tokens (``VLAPromptBuilder`` on the base
    spec) around the images, the proprio token, the action slots and the stop token."""

    def __init__(
        self,
        spec: OFTCheckpointSpec,
        tokenizer: tokenizers.Tokenizer,
        *,
        bos_token_id: int | None,
    ) -> None:
        self.spec = spec
        self._prompts = VLAPromptBuilder(spec.base, tokenizer, bos_token_id=bos_token_id)

    @classmethod
    def from_checkpoint(cls, folder: str | Path, spec: OFTCheckpointSpec) -> OFTPromptBuilder:
        """Load the tokenizer of an OFT folder."""
        base = VLAPromptBuilder.from_checkpoint(folder, spec.base)
        return cls(spec, base.tokenizer, bos_token_id=base.bos_token_id)

    def instruction_tokens(self, instruction: str) -> int:
        """Tokens of ``instruction`` alone in OpenVLA's prompt (``VLAPromptBuilder``)."""
        return self._prompts.instruction_tokens(instruction)

    def build(self, instruction: str) -> OFTPrompt:
        """The whole sequence of one step for ``instruction`` with the settings' cameras
        and proprio."""
        settings = self.spec.settings
        openvla = self._prompts.build(instruction)  # [BOS][image][text ... 29871]
        text = openvla.token_ids[openvla.image_end :]
        image_id = self.spec.base.image_token_id
        n = self.spec.num_image_tokens
        ids = [openvla.token_ids[0]]
        ids += [image_id] * (n * settings.num_images)
        ids += [image_id] * int(settings.use_proprio)
        ids += text
        ids += [OFT_ACTION_PLACEHOLDER_ID] * settings.num_action_tokens
        ids.append(OFT_STOP_TOKEN_ID)
        layout = OFTSequence(
            seq_len=len(ids),
            num_images=settings.num_images,
            num_image_tokens=n,
            has_proprio=settings.use_proprio,
            prompt_len=len(text),
            num_action_tokens=settings.num_action_tokens,
        )
        return OFTPrompt(token_ids=tuple(int(i) for i in ids), layout=layout)
