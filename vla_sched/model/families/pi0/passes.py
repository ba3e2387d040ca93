"""The prepared sizes of pi0's padded passes (``graphs.py``): the prefix in tokens, the
denoising pass in rows, the SigLIP tower in images.

A robot's prefix is every camera's patches and its prompt: the patches are the same for
every step of a model (256 per camera at 224 pixels), the prompt at most the folder's
``tokenizer_max_length`` (48 for pi0, 200 for pi0.5, whose prompt holds the discretized
state: about 150 tokens for a 32-value state, digits being single pieces). A prefix
size of ``k`` robots holds ``k`` requests and ``k`` times that longest prefix, rounded up to
``token_multiple``, so every prompt the folder accepts fits in one robot's worth: pi0.5
with two cameras gives 768, 1,472, 2,880 and 5,696 tokens for 1, 2, 4 and 8 robots. A
batch of prefixes runs as passes of whole requests cut as OpenVLA-OFT's are
(``openvla_oft.passes.plan_passes``: the fewest padded tokens; a prefix attends both ways
over itself, so it is never cut). A denoising pass is a fixed number of suffix tokens per
row (pi0's state token and the chunk, or the chunk alone), so its sizes count rows: 1, 2,
4, 8, 16 and 32 robots; more rows run as passes of 32 and the rest.
"""

from __future__ import annotations

from dataclasses import dataclass

from vla_sched.core.memory.pages import round_up_to_page
from vla_sched.model.families.openvla_oft.passes import PassSize
from vla_sched.model.families.pi0.checkpoint import Pi0Spec


@dataclass(frozen=True, slots=True)
class Pi0PassSizes:
    """The sizes pi0's padded passes prepare (see the module docstring).

    Attributes:
        robot_prefix_tokens: One robot's longest prefix: every camera's patches and the
            prompt's longest (``for_spec``).
        prefix_robot_counts: Requests one prepared prefix pass holds, one size each.
        denoise_batch_sizes: Rows one prepared denoising pass holds, one size each.
        token_multiple: Each prefix size's token count is rounded up to a multiple of this.
        vision_batch_sizes: Images one prepared tower pass holds (every camera of every
            robot of a prefix pass; more run as several tower passes).
    """

    robot_prefix_tokens: int
    prefix_robot_counts: tuple[int, ...] = (1, 2, 4, 8)
    denoise_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)
    token_multiple: int = 64
    vision_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)

    def __post_init__(self) -> None:
        if self.robot_prefix_tokens < 1:
            raise ValueError(f'robot_prefix_tokens must be >= 1, got {self.robot_prefix_tokens}')
        for name in ('prefix_robot_counts', 'denoise_batch_sizes', 'vision_batch_sizes'):
            counts = getattr(self, name)
            if not counts or min(counts) < 1 or len(set(counts)) != len(counts):
                raise ValueError(f'{name} must be distinct positive counts, got {counts}')
        if self.token_multiple < 1:
            raise ValueError(f'token_multiple must be >= 1, got {self.token_multiple}')

    @classmethod
    def for_spec(cls, spec: Pi0Spec, **changes: tuple[int, ...] | int) -> Pi0PassSizes:
        """The sizes of ``spec``'s folder: its cameras' patches plus ``tokenizer_max_length``
        per robot; ``changes`` replace the other fields' defaults."""
        images = len(spec.camera_keys) * spec.num_image_tokens
        return cls(robot_prefix_tokens=images + spec.tokenizer_max_length, **changes)

    def prefix_sizes(self) -> tuple[PassSize, ...]:
        """The prepared prefix sizes, ascending in requests and tokens."""
        by_tokens: dict[int, int] = {}
        for count in self.prefix_robot_counts:
            tokens = round_up_to_page(count * self.robot_prefix_tokens, self.token_multiple)
            by_tokens[tokens] = max(count, by_tokens.get(tokens, 0))
        return tuple(PassSize(by_tokens[t], t) for t in sorted(by_tokens))
