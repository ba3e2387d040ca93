"""The prepared sizes of SmolVLA's padded passes (``graphs.py``): the prefix in tokens, the
denoising pass in rows.

They are pi0's (``pi0.passes.Pi0PassSizes``: prefix sizes of 1, 2, 4 and 8 robots' longest
prefix, rounded up to ``token_multiple``; denoising passes of 1 to 32 rows). A SmolVLA
robot's longest prefix is every camera's tokens (64 per camera at 512 pixels for
SmolVLM2-500M), the prompt's longest (``tokenizer_max_length``, 48) and the state token:
241 tokens with three cameras, so prefix sizes of 256, 512, 1,024 and 1,984 tokens. The
tower runs at ``vision_batch_sizes`` images (every camera of every robot of a prefix pass).
"""

from __future__ import annotations

from vla_sched.model.families.pi0.passes import Pi0PassSizes
from vla_sched.model.families.smolvla.checkpoint import SmolVLASpec


def smolvla_pass_sizes(spec: SmolVLASpec, **changes: tuple[int, ...] | int) -> Pi0PassSizes:
    """The sizes of ``spec``'s folder: its cameras' tokens, ``tokenizer_max_length`` and the
    state token per robot; ``changes`` replace the other fields' defaults."""
    images = len(spec.camera_keys) * spec.num_image_tokens
    return Pi0PassSizes(robot_prefix_tokens=images + spec.tokenizer_max_length + 1, **changes)
