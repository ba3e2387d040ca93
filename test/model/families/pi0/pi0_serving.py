"""Serving pi0 steps through the real scheduler on a tiny folder, and the same steps through
the independent reference, for the pi0 tests (not a test module)."""

from __future__ import annotations

import time

import numpy as np
import torch

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.scheduling.request import Req
from vla_sched.core.scheduling.scheduler import Scheduler
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig
from vla_sched.model.families.pi0.runner import FlowMatchingRunner
from vla_sched.model.families.pi0.weights import load_pi0_model

MARKER = SamplingParams(allowed_token_start=0, allowed_token_end=1)
# (language ids, seed of the images, state and noise) of each robot: lengths differ.
ROBOTS = (((2, 17, 40, 41, 9), 1), ((2, 88, 12), 2), ((2, 5, 6, 7, 8, 9, 10, 11), 3))


def pixels_of(images) -> torch.Tensor:
    """uint8 ``[S, S, 3]`` frames at the tower's size as ``[-1, 1]`` pixels."""
    stacked = np.stack([np.asarray(im, np.float32) / 255.0 for im in images])
    return torch.from_numpy(stacked).permute(0, 3, 1, 2) * 2.0 - 1.0


def robot_steps(spec):
    """Each robot's (language ids, camera images, state, noise)."""
    size = spec.image_size
    out = []
    for ids, seed in ROBOTS:
        rng = np.random.default_rng(seed)
        images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in spec.camera_keys]
        state = rng.standard_normal(spec.max_state_dim).astype(np.float32)
        noise = rng.standard_normal((spec.chunk_size, spec.max_action_dim)).astype(np.float32)
        out.append((ids, images, state, noise))
    return out


def serve(folder, spec, steps, *, burst: int = 8, guidance=None, pass_sizes=None, backend='torch'):
    """``steps`` served together through the scheduler on the folder's model
    (``guidance``: one ``FlowGuidance`` or None per step; ``pass_sizes``: the runner's padded
    sizes), ``check_integrity()`` after every scheduler step: their normalized chunks and
    the runner."""
    model = load_pi0_model(folder, spec)
    memory = KVMemory(
        KVMemoryConfig(num_pages=256, page_size=4, num_req_slots=8, max_context_len=96)
    )
    runner = FlowMatchingRunner(
        model,
        req_to_token=memory.req_to_token_pool.req_to_token,
        num_kv_slots=(memory.allocator.num_pages + 1) * 4,
        num_steps=spec.num_inference_steps,
        chunk_size=spec.chunk_size,
        pixels_of=pixels_of,
        backend=backend,
        pass_sizes=pass_sizes,
    )
    config = SchedulerConfig(enable_overlap=False, num_continuous_decode_steps=burst)
    scheduler = Scheduler(config, memory, runner, clock=time.time_ns)
    per_image = spec.num_image_tokens
    guidance = guidance or [None] * len(steps)
    reqs = []
    for n, ((ids, images, state, noise), guide) in enumerate(zip(steps, guidance, strict=True)):
        spans = tuple(
            ImageInput(content_hash=1000 * n + c, token_offset=c * per_image,
                       num_tokens=per_image, pixels=image)
            for c, image in enumerate(images)
        )  # fmt: skip
        req = Req(
            rid=f'r{n}',
            origin_input_ids=(0,) * (per_image * len(images)) + tuple(ids),
            sampling=MARKER,
            max_new_tokens=spec.num_inference_steps + 1,
            images=spans,
            denoise_steps=spec.num_inference_steps,
            noise=noise,
            proprio=state if spec.policy_type == 'pi0' else None,
            guidance=guide,
        )
        scheduler.add_request(req)
        reqs.append(req)
    for _ in range(50):
        if not scheduler.has_work():
            break
        scheduler.run_once()
        scheduler.check_integrity()
    assert not scheduler.has_work()
    return [req.action_chunk for req in reqs], runner


def served_chunks(folder, spec, steps, *, burst: int = 8, guidance=None) -> list[np.ndarray]:
    """The normalized chunks of ``steps`` served together (``serve``)."""
    return serve(folder, spec, steps, burst=burst, guidance=guidance)[0]


def reference_inputs(spec, steps) -> dict:
    """``steps`` as the reference takes them (right-padded language, pixels per camera)."""
    longest = max(len(ids) for ids, *_ in steps)
    lang = torch.zeros((len(steps), longest), dtype=torch.int64)
    valid = torch.zeros((len(steps), longest), dtype=torch.bool)
    for n, (ids, *_) in enumerate(steps):
        lang[n, : len(ids)] = torch.tensor(ids)
        valid[n, : len(ids)] = True
    pixels = [
        torch.cat([pixels_of([images[c]]) for _, images, _, _ in steps])
        for c in range(len(spec.camera_keys))
    ]
    state = torch.from_numpy(np.stack([s for _, _, s, _ in steps]))
    return {
        'pixels': pixels,
        'lang_ids': lang,
        'lang_valid': valid,
        'state': state if spec.policy_type == 'pi0' else None,
    }


def reference_chunks(reference, spec, steps) -> np.ndarray:
    noise = torch.from_numpy(np.stack([x for *_, x in steps]))
    actions, _ = reference.sample_actions(
        **reference_inputs(spec, steps), noise=noise, num_steps=spec.num_inference_steps
    )
    return actions.numpy()
