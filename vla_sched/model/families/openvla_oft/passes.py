"""The prepared sizes of the padded OpenVLA-OFT pass, and how a batch is cut into passes.

An OFT step is one whole sequence (``prompt.py``): BOS, every camera's
patches, the proprio token, the prompt, the action slots and ``</s>``. Everything but the
prompt has the same length for every step of a model (571 positions for LIBERO's two
cameras, 1,121 for ALOHA's three), and the prompt is OpenVLA's template around the
instruction (about 25 to 35 tokens for LIBERO's instructions). So a robot's worth of a
pass is nearly a constant, and the prepared sizes count robots: a size of ``k`` robots
holds ``k`` request rows and ``k * (fixed + prompt_tokens)`` tokens rounded up to
``token_multiple``. The defaults, 1, 2, 4 and 8 robots with 48 prompt tokens each, give
640, 1,280, 2,496 and 4,992 tokens for LIBERO.

A batch of requests (never cut: a request attends to its whole sequence both ways, so its
tokens must share one pass) runs as one or more passes of consecutive requests, each at the
smallest size that holds its requests and tokens. Among the ways to cut the batch, the one
with the fewest padded tokens is taken (then the fewest passes): on an H200 a pass of a few
hundred tokens already runs openvla-7b's matrix products near their compute-bound rate (a
280-token prefill's take 5.45 ms, about 700 TFLOP/s), so once a captured pass has removed
the launch time, the padded tokens are what a batch costs. Three robots run as passes of
two and one (1,920 tokens for LIBERO) rather than one of four (2,496); thirteen as eight,
four and one. Sizes of 1, 2, 4 and 8 robots make any count such a sum, and the graphs'
shared memory pool stays that of eight robots. A request longer than the largest size (an
instruction of thousands of tokens) runs alone on the plain eager pass.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from itertools import accumulate

from vla_sched.core.memory.pages import round_up_to_page
from vla_sched.model.families.openvla_oft.checkpoint import OFTCheckpointSpec


@dataclass(frozen=True, slots=True)
class OFTPassSizes:
    """The sizes the padded OFT pass prepares (see the module docstring).

    Attributes:
        robot_counts: Requests one prepared pass holds, one size each.
        prompt_tokens: Prompt positions (template, instruction and 29871) a robot's worth
            of a size allows for; longer prompts take a larger size or another pass.
        token_multiple: Each size's token count is rounded up to a multiple of this.
        vision_batch_sizes: Padded image counts of the vision encoder's path (every camera
            of every robot of a pass; more run as several encoder passes).
    """

    robot_counts: tuple[int, ...] = (1, 2, 4, 8)
    prompt_tokens: int = 48
    token_multiple: int = 64
    vision_batch_sizes: tuple[int, ...] = (1, 2, 4, 8, 16, 32)

    def __post_init__(self) -> None:
        if not self.robot_counts or min(self.robot_counts) < 1:
            raise ValueError(f'robot_counts must be positive, got {self.robot_counts}')
        if len(set(self.robot_counts)) != len(self.robot_counts):
            raise ValueError(f'robot_counts must be distinct, got {self.robot_counts}')
        if self.prompt_tokens < 1:
            raise ValueError(f'prompt_tokens must be >= 1, got {self.prompt_tokens}')
        if self.token_multiple < 1:
            raise ValueError(f'token_multiple must be >= 1, got {self.token_multiple}')
        if not self.vision_batch_sizes or min(self.vision_batch_sizes) < 1:
            raise ValueError(f'vision_batch_sizes must be positive, got {self.vision_batch_sizes}')

    def pass_sizes(self, fixed_len: int) -> tuple[PassSize, ...]:
        """The prepared sizes for sequences of ``fixed_len`` positions besides the prompt,
        ascending in both requests and tokens.

        Raises:
            ValueError: for ``fixed_len < 1``.
        """
        if fixed_len < 1:
            raise ValueError(f'fixed_len must be >= 1, got {fixed_len}')
        robot_len = fixed_len + self.prompt_tokens
        by_tokens: dict[int, int] = {}
        for count in self.robot_counts:
            tokens = round_up_to_page(count * robot_len, self.token_multiple)
            by_tokens[tokens] = max(count, by_tokens.get(tokens, 0))
        return tuple(PassSize(by_tokens[t], t) for t in sorted(by_tokens))


def oft_fixed_len(spec: OFTCheckpointSpec) -> int:
    """Positions of every OFT sequence of ``spec``'s model besides its prompt: BOS, the
    images, the proprio token, the action slots and ``</s>``."""
    settings = spec.settings
    images = settings.num_images * spec.num_image_tokens
    return 1 + images + int(settings.use_proprio) + settings.num_action_tokens + 1


@dataclass(frozen=True, slots=True)
class PassSize:
    """One prepared size: at most ``num_requests`` requests of ``num_tokens`` tokens in all."""

    num_requests: int
    num_tokens: int


@dataclass(frozen=True, slots=True)
class OFTPass:
    """One pass of a batch: requests ``first:first + num_requests`` (tokens
    ``token_start:token_end`` of the batch) at prepared size ``size``, or one request too
    long for every size (``size`` None), which runs on the plain eager pass."""

    first: int
    num_requests: int
    token_start: int
    token_end: int
    size: PassSize | None

    @property
    def num_tokens(self) -> int:
        return self.token_end - self.token_start

    @property
    def requests(self) -> slice:
        return slice(self.first, self.first + self.num_requests)

    @property
    def tokens(self) -> slice:
        return slice(self.token_start, self.token_end)


def smallest_fitting(
    sizes: Sequence[PassSize], *, num_requests: int, num_tokens: int
) -> PassSize | None:
    """The first of ``sizes`` (ascending) that holds the requests and tokens, or None."""
    for size in sizes:
        if size.num_requests >= num_requests and size.num_tokens >= num_tokens:
            return size
    return None


def plan_passes(seq_lens: Sequence[int], sizes: Sequence[PassSize]) -> list[OFTPass]:
    """The passes of a batch of whole sequences, in batch order, with the fewest computed
    tokens (then the fewest passes) over every cut into runs of consecutive requests; a
    request longer than the largest size is a pass of its own with no size.

    Raises:
        ValueError: without sizes.
    """
    if not sizes:
        raise ValueError('no prepared sizes')
    starts = [0, *accumulate(seq_lens)]
    max_requests = max(size.num_requests for size in sizes)
    # best[end]: the (computed tokens, passes) of the cheapest plan of requests 0 .. end-1,
    # the first request of its last pass and that pass's size.
    best: list[tuple[tuple[int, int], int, PassSize | None]] = [((0, 0), 0, None)]
    for end in range(1, len(seq_lens) + 1):
        (tokens, passes), _, _ = best[end - 1]
        choice = ((tokens + seq_lens[end - 1], passes + 1), end - 1, None)  # alone, eager
        for first in range(end - 1, max(end - max_requests, 0) - 1, -1):
            size = smallest_fitting(
                sizes, num_requests=end - first, num_tokens=starts[end] - starts[first]
            )
            if size is None:
                break  # earlier firsts only add requests and tokens
            (tokens, passes), _, _ = best[first]
            cost = (tokens + size.num_tokens, passes + 1)
            if choice[2] is None or cost < choice[0]:
                choice = (cost, first, size)
        best.append(choice)
    plan: list[OFTPass] = []
    end = len(seq_lens)
    while end:
        _, first, size = best[end]
        plan.append(OFTPass(first, end - first, starts[first], starts[end], size))
        end = first
    return plan[::-1]
