"""Our SmolVLA on the paged KV, served through the scheduler, against the independent
reference (``smolvla_reference``: transformers' SmolVLM vision tower and connector and Llama
modules plus LeRobot's additions in plain torch) on a tiny float32 folder: several robots with
different instructions and states batched, every chunk within 1e-4, and every denoising
step's velocity within 1e-4; the attention masks (probed through the attention kernel itself)
and the positions of the prefix, the joint layers and the cross layers exactly the
reference's; each error a port could make (no image scale, the state visible to the images,
bidirectional actions, cross-attention positions not from 0) moves the reference's actions
beyond that tolerance, so this comparison would catch it."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch
from smolvla_reference import ReferenceSmolVLA

from vla_sched.core.forward_batch import ImageInput, SamplingParams
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.scheduling.request import Req
from vla_sched.core.scheduling.scheduler import Scheduler
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig
from vla_sched.model.families.smolvla.checkpoint import read_smolvla_spec
from vla_sched.model.families.smolvla.model import SmolVLAModel
from vla_sched.model.families.smolvla.runner import SmolVLARunner
from vla_sched.model.families.smolvla.weights import load_smolvla_model
from vla_sched.model.layers.attention import paged_attention
from vla_sched.testing.smolvla_writer import write_smolvla_checkpoint

TOLERANCE = 1e-4
MARKER = SamplingParams(allowed_token_start=0, allowed_token_end=1)
# (language ids, seed of the images, state and noise) of each robot: lengths differ.
ROBOTS = (((361, 267, 261, 298, 13), 1), ((300, 13), 2), ((5, 6, 7, 8, 9, 10, 11, 13), 3))
MUTATIONS = (
    'no_image_scale', 'state_visible_to_images', 'noncausal_actions', 'cross_positions_absolute',
)  # fmt: skip


def _pixels(images) -> torch.Tensor:
    """uint8 ``[S, S, 3]`` frames at the tower's size as ``[-1, 1]`` pixels."""
    stacked = np.stack([np.asarray(im, np.float32) / 255.0 for im in images])
    return torch.from_numpy(stacked).permute(0, 3, 1, 2) * 2.0 - 1.0


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return write_smolvla_checkpoint(tmp_path_factory.mktemp('smolvla') / 'tiny', seed=4)


@pytest.fixture(scope='module')
def spec(folder):
    return read_smolvla_spec(folder, vlm_folder=folder / 'vlm')


@pytest.fixture(scope='module')
def reference(folder):
    return ReferenceSmolVLA.from_folder(folder, vlm_folder=folder / 'vlm')


def _steps(spec):
    out = []
    for ids, seed in ROBOTS:
        rng = np.random.default_rng(seed)
        size = spec.image_size
        images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in spec.camera_keys]
        state = np.zeros(spec.max_state_dim, np.float32)
        state[: spec.state_dim] = rng.standard_normal(spec.state_dim)
        noise = rng.standard_normal((spec.chunk_size, spec.max_action_dim)).astype(np.float32)
        out.append((ids, images, state, noise))
    return out


def _served_chunks(folder, spec, steps, *, burst: int, guidance=None) -> list[np.ndarray]:
    model = load_smolvla_model(folder, spec)
    memory = KVMemory(
        KVMemoryConfig(num_pages=64, page_size=4, num_req_slots=4, max_context_len=48)
    )
    runner = SmolVLARunner(
        model,
        req_to_token=memory.req_to_token_pool.req_to_token,
        num_kv_slots=(memory.allocator.num_pages + 1) * 4,
        num_steps=spec.num_inference_steps,
        chunk_size=spec.chunk_size,
        pixels_of=_pixels,
        backend='torch',
    )
    config = SchedulerConfig(enable_overlap=False, num_continuous_decode_steps=burst)
    scheduler = Scheduler(config, memory, runner, clock=time.time_ns)
    per_image = spec.num_image_tokens
    reqs = []
    for n, (ids, images, state, noise) in enumerate(steps):
        spans = tuple(
            ImageInput(content_hash=1000 * n + c, token_offset=c * per_image,
                       num_tokens=per_image, pixels=image)
            for c, image in enumerate(images)
        )  # fmt: skip
        req = Req(
            rid=f'r{n}',
            origin_input_ids=(0,) * (per_image * len(images)) + tuple(ids) + (0,),
            sampling=MARKER,
            max_new_tokens=spec.num_inference_steps + 1,
            images=spans,
            denoise_steps=spec.num_inference_steps,
            noise=noise,
            proprio=state,
            guidance=None if guidance is None else guidance[n],
        )
        scheduler.add_request(req)
        reqs.append(req)
    for _ in range(50):
        if not scheduler.has_work():
            break
        scheduler.run_once()
        scheduler.check_integrity()
    return [req.action_chunk for req in reqs]


def _reference_chunks(reference, spec, steps) -> np.ndarray:
    longest = max(len(ids) for ids, *_ in steps)
    lang = torch.zeros((len(steps), longest), dtype=torch.int64)
    valid = torch.zeros((len(steps), longest), dtype=torch.bool)
    for n, (ids, *_) in enumerate(steps):
        lang[n, : len(ids)] = torch.tensor(ids)
        valid[n, : len(ids)] = True
    pixels = [
        torch.cat([_pixels([images[c]]) for _, images, _, _ in steps])
        for c in range(len(spec.camera_keys))
    ]
    actions, _ = reference.sample_actions(
        pixels=pixels,
        lang_ids=lang,
        lang_valid=valid,
        state=torch.from_numpy(np.stack([s for _, _, s, _ in steps])),
        noise=torch.from_numpy(np.stack([x for *_, x in steps])),
        num_steps=spec.num_inference_steps,
    )
    return actions.numpy()


@pytest.mark.parametrize('burst', [1, 8])
def test_served_chunks_equal_the_reference_for_robots_batched(folder, spec, reference, burst):
    steps = _steps(spec)
    want = _reference_chunks(reference, spec, steps)
    got = _served_chunks(folder, spec, steps, burst=burst)
    for n, chunk in enumerate(got):
        assert chunk is not None and chunk.shape == want[n].shape
        np.testing.assert_allclose(chunk, want[n], rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize('mutation', MUTATIONS)
def test_each_porting_error_moves_the_reference_beyond_the_tolerance(spec, reference, mutation):
    steps = _steps(spec)
    right = _reference_chunks(reference, spec, steps)
    wrong = _reference_chunks(reference.mutated(**{mutation: True}), spec, steps)
    assert np.abs(right - wrong).max() > 10 * TOLERANCE


@pytest.mark.slow
def test_every_denoising_steps_velocity_equals_the_references(
    folder, spec, reference, monkeypatch
):
    steps = _steps(spec)
    want: list[torch.Tensor] = []
    for ids, images, state, noise in steps:  # one robot at a time: each pass holds one row
        pixels = [_pixels([image]) for image in images]
        _, velocities = reference.sample_actions(
            pixels=pixels, lang_ids=torch.tensor([ids]),
            lang_valid=torch.ones((1, len(ids)), dtype=torch.bool),
            state=torch.from_numpy(state)[None], noise=torch.from_numpy(noise)[None],
            num_steps=spec.num_inference_steps,
        )  # fmt: skip
        want.append(velocities)
    recorded: list[torch.Tensor] = []
    plain = SmolVLAModel.velocity

    def recording(self, **inputs):
        v = plain(self, **inputs)
        recorded.append(v.detach().clone())
        return v

    monkeypatch.setattr(SmolVLAModel, 'velocity', recording)
    for n, step in enumerate(steps):
        recorded.clear()
        _served_chunks(folder, spec, [step], burst=1)
        assert len(recorded) == spec.num_inference_steps
        for k, v in enumerate(recorded):
            np.testing.assert_allclose(
                v[0].numpy(), want[n][k][0].numpy(), rtol=TOLERANCE, atol=TOLERANCE
            )


def _probed_mask(meta, *, num_keys: int, prefix_slots: torch.Tensor | None) -> torch.Tensor:
    """The mask ``[T, num_keys]`` the attention kernel applies for ``meta``: every query and
    key zero (so a query weighs every key it sees alike), the value of key ``j`` the one-hot
    ``e_j`` (cached prefix keys at their slots, new keys from the pass), so the output's
    nonzero entries are the keys each query sees."""
    new = meta.num_tokens
    first_new = num_keys - new
    eye = torch.eye(num_keys, dtype=torch.float32)
    slots = int(meta.out_cache_loc.max()) + 1
    if prefix_slots is not None:
        slots = max(slots, int(prefix_slots.max()) + 1)
    k_cache = torch.zeros((slots, 1, num_keys))
    v_cache = torch.zeros((slots, 1, num_keys))
    if prefix_slots is not None:
        v_cache[prefix_slots.long(), 0] = eye[:first_new]
    out = paged_attention(
        q=torch.zeros((new, 1, num_keys)), k=torch.zeros((new, 1, num_keys)),
        v=eye[first_new:, None], k_cache=k_cache, v_cache=v_cache, meta=meta, sm_scale=1.0,
    )  # fmt: skip
    return out[:, 0] > 0


@pytest.mark.slow
def test_masks_and_positions_are_exactly_the_references(folder, spec, reference, monkeypatch):
    ids, images, state, noise = _steps(spec)[0]
    prefix = reference.prefix(
        pixels=[_pixels([image]) for image in images], lang_ids=torch.tensor([ids]),
        lang_valid=torch.ones((1, len(ids)), dtype=torch.bool),
        state=torch.from_numpy(state)[None],
    )  # fmt: skip
    want_suffix_mask, want_suffix_positions = reference.suffix_layout(prefix, spec.chunk_size)
    length = prefix.valid.shape[1]
    seen: dict[str, object] = {}
    run_prefix, velocity, rope = (
        SmolVLAModel.run_prefix, SmolVLAModel.velocity, SmolVLAModel.rope
    )  # fmt: skip
    ropes: list[torch.Tensor] = []

    def recording_prefix(self, embeds, meta, kv_caches):
        seen['prefix'] = meta
        return run_prefix(self, embeds, meta, kv_caches)

    def recording_velocity(self, **inputs):
        seen.setdefault('suffix', inputs['meta'])
        seen.setdefault('reads', inputs['reads'])
        ropes.clear()
        return velocity(self, **inputs)

    def recording_rope(self, positions):
        ropes.append(positions.clone())
        return rope(self, positions)

    monkeypatch.setattr(SmolVLAModel, 'run_prefix', recording_prefix)
    monkeypatch.setattr(SmolVLAModel, 'velocity', recording_velocity)
    monkeypatch.setattr(SmolVLAModel, 'rope', recording_rope)
    _served_chunks(folder, spec, [(ids, images, state, noise)], burst=1)

    prefix_meta = seen['prefix']
    assert prefix_meta.positions.tolist() == prefix.positions[0].tolist()
    got = _probed_mask(prefix_meta, num_keys=length, prefix_slots=None)
    assert torch.equal(got, prefix.mask[0])

    suffix_meta = seen['suffix']
    assert suffix_meta.positions.tolist() == want_suffix_positions[0].tolist()
    table = suffix_meta.req_to_token[0, :length]
    got = _probed_mask(suffix_meta, num_keys=length + spec.chunk_size, prefix_slots=table)
    assert torch.equal(got, want_suffix_mask[0])

    # Cross layers: every action reads the whole prefix, its query at positions from 0.
    reads = seen['reads']
    assert reads.prefix_lens.tolist() == [int(prefix.valid.sum())] * spec.chunk_size
    assert bool(want_suffix_mask[0, :, :length].all())
    joint, cross = ropes[-2:]
    assert joint.tolist() == want_suffix_positions[0].tolist()
    rebased = want_suffix_positions - want_suffix_positions.min(dim=1, keepdim=True).values
    assert cross.tolist() == rebased[0].tolist()
