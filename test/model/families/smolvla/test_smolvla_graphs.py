"""SmolVLA's padded prefix and denoising passes (the CUDA-graph paths, run eagerly on the CPU)
against the plain passes: robots of different prompt lengths served through the scheduler
(``check_integrity()`` after every step), passes cut into pieces, a prefix longer than every
size, guided rows beside padded ones, and the padding counted."""

from __future__ import annotations

import time

import numpy as np
import pytest
import torch

from vla_sched.core.forward_batch import FlowGuidance, ImageInput, SamplingParams
from vla_sched.core.memory.kv_config import KVMemoryConfig
from vla_sched.core.memory.kv_memory import KVMemory
from vla_sched.core.scheduling.request import Req
from vla_sched.core.scheduling.scheduler import Scheduler
from vla_sched.core.scheduling.scheduler_config import SchedulerConfig
from vla_sched.model.families.openvla_oft.passes import PassSize
from vla_sched.model.families.pi0.passes import Pi0PassSizes
from vla_sched.model.families.smolvla.checkpoint import read_smolvla_spec
from vla_sched.model.families.smolvla.passes import smolvla_pass_sizes
from vla_sched.model.families.smolvla.runner import SmolVLARunner
from vla_sched.model.families.smolvla.weights import load_smolvla_model
from vla_sched.testing.smolvla_writer import write_smolvla_checkpoint

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

TOLERANCE = 1e-5  # the same float32 kernels at other shapes: rounding only
MARKER = SamplingParams(allowed_token_start=0, allowed_token_end=1)
# Language ids of each robot: prompts of 5, 2, 8 and 3 tokens (the state token follows).
PROMPTS = ((361, 267, 261, 298, 13), (300, 13), (5, 6, 7, 8, 9, 10, 11, 13), (40, 41, 13))


@pytest.fixture(scope='module')
def folder(tmp_path_factory):
    return write_smolvla_checkpoint(tmp_path_factory.mktemp('smolvla') / 'tiny', seed=6)


@pytest.fixture(scope='module')
def spec(folder):
    return read_smolvla_spec(folder, vlm_folder=folder / 'vlm')


def _pixels(images) -> torch.Tensor:
    stacked = np.stack([np.asarray(im, np.float32) / 255.0 for im in images])
    return torch.from_numpy(stacked).permute(0, 3, 1, 2) * 2.0 - 1.0


def _steps(spec, num_robots: int):
    out = []
    for n in range(num_robots):
        rng = np.random.default_rng(20 + n)
        size = spec.image_size
        images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in spec.camera_keys]
        state = np.zeros(spec.max_state_dim, np.float32)
        state[: spec.state_dim] = rng.standard_normal(spec.state_dim)
        noise = rng.standard_normal((spec.chunk_size, spec.max_action_dim)).astype(np.float32)
        out.append((PROMPTS[n % len(PROMPTS)], images, state, noise))
    return out


def _serve(folder, spec, steps, *, pass_sizes=None, backend='torch', guidance=None, burst=1):
    """``steps`` served together through the scheduler: their normalized chunks and the
    runner."""
    model = load_smolvla_model(folder, spec)
    memory = KVMemory(
        KVMemoryConfig(num_pages=128, page_size=4, num_req_slots=8, max_context_len=64)
    )
    runner = SmolVLARunner(
        model,
        req_to_token=memory.req_to_token_pool.req_to_token,
        num_kv_slots=(memory.allocator.num_pages + 1) * 4,
        num_steps=spec.num_inference_steps,
        chunk_size=spec.chunk_size,
        pixels_of=_pixels,
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
            origin_input_ids=(0,) * (per_image * len(images)) + tuple(ids) + (0,),
            sampling=MARKER,
            max_new_tokens=spec.num_inference_steps + 1,
            images=spans,
            denoise_steps=spec.num_inference_steps,
            noise=noise,
            proprio=state,
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


def _assert_same(got, want) -> None:
    for a, b in zip(got, want, strict=True):
        assert a is not None and b is not None
        np.testing.assert_allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE)


def _prefix_tokens(spec, steps) -> int:
    images = len(spec.camera_keys) * spec.num_image_tokens
    return sum(images + len(ids) + 1 for ids, *_ in steps)


@pytest.mark.parametrize('num_robots', [1, 3, 4])
def test_padded_passes_give_the_plain_chunks_for_robots_batched(folder, spec, num_robots):
    steps = _steps(spec, num_robots)
    want, plain = _serve(folder, spec, steps)
    sizes = smolvla_pass_sizes(
        spec, prefix_robot_counts=(1, 2), denoise_batch_sizes=(1, 2, 4), token_multiple=8
    )
    got, padded = _serve(folder, spec, steps, pass_sizes=sizes)
    _assert_same(got, want)
    stats = padded.padding_stats()
    denoise_rows = num_robots * spec.num_inference_steps
    assert stats['denoise'].num_real == denoise_rows and stats['denoise'].num_eager_runs == 0
    prefix_tokens = _prefix_tokens(spec, steps)
    assert stats['prefix'].num_real == prefix_tokens and stats['prefix'].num_eager_runs == 0
    if num_robots == 3:  # each pass of 3 rows padded to 4
        assert stats['denoise'].num_padding == spec.num_inference_steps
    assert stats['vision'].num_real == num_robots * len(spec.camera_keys)
    assert stats['vision'].num_eager_runs == 0
    # The plain runner counts every pass as eager.
    assert plain.padding_stats()['denoise'].num_eager == denoise_rows
    assert plain.padding_stats()['prefix'].num_eager == prefix_tokens


def test_rows_beyond_the_largest_size_run_as_pieces_and_match_the_plain_chunks(folder, spec):
    steps = _steps(spec, 3)
    want, _ = _serve(folder, spec, steps, burst=4)
    sizes = smolvla_pass_sizes(
        spec, prefix_robot_counts=(1,), denoise_batch_sizes=(2,), vision_batch_sizes=(2,)
    )
    got, padded = _serve(folder, spec, steps, pass_sizes=sizes, burst=4)
    _assert_same(got, want)
    stats = padded.padding_stats()
    # Every pass of 3 rows is a piece of 2 and a piece of 1 padded to 2.
    assert stats['denoise'].num_real == 3 * spec.num_inference_steps
    assert stats['denoise'].num_padding * 2 == stats['denoise'].num_padded_runs
    assert stats['denoise'].num_eager_runs == 0


def test_a_prefix_longer_than_every_size_runs_on_the_plain_pass(folder, spec):
    steps = _steps(spec, 3)  # prompts of 5, 2 and 8 tokens
    want, _ = _serve(folder, spec, steps)
    images = len(spec.camera_keys) * spec.num_image_tokens
    sizes = Pi0PassSizes(robot_prefix_tokens=images + 5 + 1, prefix_robot_counts=(1,),
                         token_multiple=1)  # fmt: skip
    got, padded = _serve(folder, spec, steps, pass_sizes=sizes)
    _assert_same(got, want)
    prefix = padded.padding_stats()['prefix']
    assert (prefix.num_eager_runs, prefix.num_eager) == (1, images + 8 + 1)
    assert prefix.num_real == 2 * images + 5 + 2 + 2 and prefix.num_padding == 3


def test_guided_rows_run_on_the_plain_pass_beside_padded_rows(folder, spec):
    steps = _steps(spec, 3)
    rng = np.random.default_rng(7)
    target = rng.standard_normal((spec.chunk_size, spec.max_action_dim)).astype(np.float32)
    weights = np.linspace(1.0, 0.0, spec.chunk_size).astype(np.float32)
    guidance = [None, FlowGuidance(target=target, weights=weights, max_weight=5.0), None]
    want, _ = _serve(folder, spec, steps, guidance=guidance)
    sizes = smolvla_pass_sizes(spec, denoise_batch_sizes=(1, 2, 4))
    got, padded = _serve(folder, spec, steps, pass_sizes=sizes, guidance=guidance)
    _assert_same(got, want)
    unguided, _ = _serve(folder, spec, steps, pass_sizes=sizes)
    assert np.abs(got[1] - unguided[1]).max() > 100 * TOLERANCE
    _assert_same([got[0], got[2]], [unguided[0], unguided[2]])
    denoise = padded.padding_stats()['denoise']
    assert denoise.num_eager == spec.num_inference_steps  # the guided robot's rows only
    assert denoise.num_real == 2 * spec.num_inference_steps


def test_the_padded_passes_on_the_triton_kernels_give_the_plain_torch_chunks(folder, spec):
    """The interpreter runs every program of every kernel (the ones a captured graph runs,
    the cross layers' decode kernel included): one robot, its prefix padded, each denoising
    pass padded by a row that reads one reserved slot in the cross caches."""
    steps = _steps(spec, 1)
    want, _ = _serve(folder, spec, steps)
    sizes = smolvla_pass_sizes(
        spec,
        prefix_robot_counts=(1,),
        denoise_batch_sizes=(2,),
        vision_batch_sizes=(1,),
        token_multiple=16,
    )
    got, padded = _serve(folder, spec, steps, pass_sizes=sizes, backend='triton')
    _assert_same(got, want)
    stats = padded.padding_stats()
    assert stats['denoise'].num_eager_runs == 0 and stats['prefix'].num_padding > 0


def test_cuda_graphs_need_a_cuda_device_and_the_sizes(folder, spec):
    model = load_smolvla_model(folder, spec)
    table = torch.zeros((2, 64), dtype=torch.int32)
    common = dict(req_to_token=table, num_kv_slots=128, num_steps=3, chunk_size=spec.chunk_size,
                  pixels_of=_pixels)  # fmt: skip
    with pytest.raises(ValueError, match='CUDA device'):
        SmolVLARunner(model, cuda_graphs=True, pass_sizes=smolvla_pass_sizes(spec), **common)
    plain = SmolVLARunner(model, **common)
    assert plain.denoise_graphs is None and plain.prefix_graphs is None
    assert plain.vision_graphs is None


def test_prefix_sizes_hold_every_prompt_the_folder_accepts_per_robot(spec):
    sizes = smolvla_pass_sizes(spec)
    images = len(spec.camera_keys) * spec.num_image_tokens
    assert sizes.robot_prefix_tokens == images + spec.tokenizer_max_length + 1
    # SmolVLA base at real sizes, three cameras of 64 tokens, prompts of 48: 241 a robot
    real = Pi0PassSizes(robot_prefix_tokens=3 * 64 + 48 + 1)
    assert real.prefix_sizes() == (
        PassSize(1, 256), PassSize(2, 512), PassSize(4, 1024), PassSize(8, 1984)
    )  # fmt: skip
