"""pi0's padded prefix and denoising passes (the CUDA-graph paths, run eagerly on the CPU)
against the plain passes: robots of different prompt lengths served through the scheduler,
passes cut into pieces, a prefix longer than every size, guided rows beside padded ones,
and the padding counted."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from pi0_serving import pixels_of, serve

from vla_sched.core.forward_batch import FlowGuidance
from vla_sched.model.families.openvla_oft.passes import PassSize
from vla_sched.model.families.pi0.checkpoint import read_pi0_spec
from vla_sched.model.families.pi0.passes import Pi0PassSizes
from vla_sched.model.families.pi0.runner import FlowMatchingRunner
from vla_sched.model.families.pi0.weights import load_pi0_model
from vla_sched.testing.pi0_writer import write_pi0_checkpoint

pytestmark = pytest.mark.slow  # seconds or more: not in the fast tier

TOLERANCE = 1e-5  # the same float32 kernels at other shapes: rounding only
# Language ids of each robot: prompts of 3 to 9 tokens, so prefixes of 35 to 41 tokens.
PROMPTS = ((2, 17, 40, 41, 9), (2, 88, 12), (2, 5, 6, 7, 8, 9, 10, 11, 12), (2, 30, 31, 32))


@pytest.fixture(scope='module', params=['pi0', 'pi05'])
def folder(request, tmp_path_factory):
    root = tmp_path_factory.mktemp(request.param)
    return write_pi0_checkpoint(
        root / 'tiny', policy_type=request.param, weights_dtype='float32', seed=5
    )


def _steps(spec, num_robots: int):
    out = []
    for n in range(num_robots):
        rng = np.random.default_rng(10 + n)
        size = spec.image_size
        images = [rng.integers(0, 256, (size, size, 3), dtype=np.uint8) for _ in spec.camera_keys]
        state = rng.standard_normal(spec.max_state_dim).astype(np.float32)
        noise = rng.standard_normal((spec.chunk_size, spec.max_action_dim)).astype(np.float32)
        out.append((PROMPTS[n % len(PROMPTS)], images, state, noise))
    return out


def _serve(folder, spec, steps, *, pass_sizes=None, backend='torch', guidance=None, burst=1):
    return serve(
        folder, spec, steps, burst=burst, guidance=guidance, pass_sizes=pass_sizes,
        backend=backend,
    )  # fmt: skip


def _assert_same(got, want) -> None:
    for a, b in zip(got, want, strict=True):
        assert a is not None and b is not None
        np.testing.assert_allclose(a, b, rtol=TOLERANCE, atol=TOLERANCE)


@pytest.mark.parametrize('num_robots', [1, 3, 4])
def test_padded_passes_give_the_plain_chunks_for_robots_batched(folder, num_robots):
    spec = read_pi0_spec(folder)
    steps = _steps(spec, num_robots)
    want, plain = _serve(folder, spec, steps)
    sizes = Pi0PassSizes.for_spec(
        spec, prefix_robot_counts=(1, 2), denoise_batch_sizes=(1, 2, 4), token_multiple=8
    )
    got, padded = _serve(folder, spec, steps, pass_sizes=sizes)
    _assert_same(got, want)
    stats = padded.padding_stats()
    denoise_rows = num_robots * spec.num_inference_steps
    assert stats['denoise'].num_real == denoise_rows and stats['denoise'].num_eager_runs == 0
    prefix_tokens = sum(len(spec.camera_keys) * spec.num_image_tokens + len(ids)
                        for ids, *_ in steps)  # fmt: skip
    assert stats['prefix'].num_real == prefix_tokens and stats['prefix'].num_eager_runs == 0
    assert stats['vision'].num_real == num_robots * len(spec.camera_keys)
    assert stats['vision'].num_eager_runs == 0
    # The plain runner counts every pass as eager.
    assert plain.padding_stats()['denoise'].num_eager == denoise_rows
    assert plain.padding_stats()['prefix'].num_eager == prefix_tokens


def test_rows_beyond_the_largest_size_run_as_pieces_and_match_the_plain_chunks(folder):
    spec = read_pi0_spec(folder)
    steps = _steps(spec, 3)
    want, _ = _serve(folder, spec, steps, burst=4)
    sizes = Pi0PassSizes.for_spec(
        spec, prefix_robot_counts=(1,), denoise_batch_sizes=(2,), vision_batch_sizes=(2,)
    )
    got, padded = _serve(folder, spec, steps, pass_sizes=sizes, burst=4)
    _assert_same(got, want)
    stats = padded.padding_stats()
    # Every pass of 3 rows is a piece of 2 and a piece of 1 padded to 2.
    assert stats['denoise'].num_real == 3 * spec.num_inference_steps
    assert stats['denoise'].num_padding * 2 == stats['denoise'].num_padded_runs
    assert stats['denoise'].num_eager_runs == 0


def test_a_prefix_longer_than_every_size_runs_on_the_plain_pass(folder):
    spec = read_pi0_spec(folder)
    steps = _steps(spec, 3)  # prompts of 5, 3 and 9 tokens
    want, _ = _serve(folder, spec, steps)
    images = len(spec.camera_keys) * spec.num_image_tokens
    sizes = Pi0PassSizes(robot_prefix_tokens=images + 5, prefix_robot_counts=(1,),
                         token_multiple=1)  # fmt: skip
    got, padded = _serve(folder, spec, steps, pass_sizes=sizes)
    _assert_same(got, want)
    prefix = padded.padding_stats()['prefix']
    assert (prefix.num_eager_runs, prefix.num_eager) == (1, images + 9)
    assert prefix.num_real == 2 * images + 5 + 3 and prefix.num_padding == 2


def test_guided_rows_run_on_the_plain_pass_beside_padded_rows(folder):
    spec = read_pi0_spec(folder)
    steps = _steps(spec, 3)
    rng = np.random.default_rng(7)
    target = rng.standard_normal((spec.chunk_size, spec.max_action_dim)).astype(np.float32)
    weights = np.linspace(1.0, 0.0, spec.chunk_size).astype(np.float32)
    guidance = [None, FlowGuidance(target=target, weights=weights, max_weight=5.0), None]
    want, _ = _serve(folder, spec, steps, guidance=guidance)
    sizes = Pi0PassSizes.for_spec(spec, denoise_batch_sizes=(1, 2, 4))
    got, padded = _serve(folder, spec, steps, pass_sizes=sizes, guidance=guidance)
    _assert_same(got, want)
    unguided, _ = _serve(folder, spec, steps, pass_sizes=sizes)
    assert np.abs(got[1] - unguided[1]).max() > 100 * TOLERANCE
    _assert_same([got[0], got[2]], [unguided[0], unguided[2]])
    denoise = padded.padding_stats()['denoise']
    steps_per_chunk = spec.num_inference_steps
    assert denoise.num_eager == steps_per_chunk  # the guided robot's rows only
    assert denoise.num_real == 2 * steps_per_chunk


def test_the_padded_passes_on_the_triton_kernels_give_the_plain_torch_chunks(folder):
    """The interpreter runs every program of every kernel (slow: pi0 only, whose state
    token makes the suffix's span start after its first token): one robot, its prefix
    padded by 7 tokens, each denoising pass by a row."""
    spec = read_pi0_spec(folder)
    if spec.policy_type != 'pi0':
        pytest.skip('the Triton path is the same for pi0.5; the interpreter is slow')
    steps = _steps(spec, 1)
    want, _ = _serve(folder, spec, steps)
    sizes = Pi0PassSizes.for_spec(spec, prefix_robot_counts=(1,), denoise_batch_sizes=(2,),
                                  vision_batch_sizes=(1,), token_multiple=16)  # fmt: skip
    got, padded = _serve(folder, spec, steps, pass_sizes=sizes, backend='triton')
    _assert_same(got, want)
    assert padded.padding_stats()['denoise'].num_eager_runs == 0


def test_cuda_graphs_need_a_cuda_device_and_the_sizes(folder):
    spec = read_pi0_spec(folder)
    model = load_pi0_model(folder, spec)
    table = torch.zeros((2, 64), dtype=torch.int32)
    common = dict(req_to_token=table, num_kv_slots=128, num_steps=3, chunk_size=spec.chunk_size,
                  pixels_of=pixels_of)  # fmt: skip
    with pytest.raises(ValueError, match='CUDA device'):
        FlowMatchingRunner(model, cuda_graphs=True, pass_sizes=Pi0PassSizes.for_spec(spec),
                           **common)  # fmt: skip
    plain = FlowMatchingRunner(model, **common)
    assert plain.denoise_graphs is None and plain.prefix_graphs is None


def test_prefix_sizes_hold_every_prompt_the_folder_accepts_per_robot(tmp_path):
    spec = read_pi0_spec(
        write_pi0_checkpoint(tmp_path / 'pi05', policy_type='pi05', weights_dtype='float32')
    )
    sizes = Pi0PassSizes.for_spec(spec)
    images = len(spec.camera_keys) * spec.num_image_tokens
    assert sizes.robot_prefix_tokens == images + spec.tokenizer_max_length == 2 * 16 + 200
    assert sizes.prefix_sizes() == (
        PassSize(1, 256), PassSize(2, 512), PassSize(4, 960), PassSize(8, 1856)
    )  # fmt: skip
    # pi0.5 at real sizes, two cameras of 256 patches: 712 tokens a robot
    real = Pi0PassSizes(robot_prefix_tokens=2 * 256 + 200)
    assert [s.num_tokens for s in real.prefix_sizes()] == [768, 1472, 2880, 5696]
    with pytest.raises(ValueError, match='denoise_batch_sizes'):
        Pi0PassSizes(robot_prefix_tokens=10, denoise_batch_sizes=(2, 2))
