"""The scheduled core serves an OpenVLA-OFT folder: steps of several robots, each with two
cameras and its state, run as prefill-only requests batched into one pass, and give the
chunks the ParallelActionRunner gives for the same inputs built here independently."""

from __future__ import annotations

import dataclasses
import time

import numpy as np
import pytest
import torch

from vla_sched.core.forward_batch import ForwardBatch, ForwardMode, ImageInput, SamplingParams
from vla_sched.engine.assembly import assemble_core
from vla_sched.engine.checkpoints import ModelPathError, check_model_path
from vla_sched.engine.config import OFT_PRESET_CHOICES, EngineConfig, EngineConfigError
from vla_sched.engine.scheduled_core import ScheduledCore
from vla_sched.ipc.messages import FailureReason, StepFailure, StepRequest, StepResult
from vla_sched.model.families.openvla_oft.checkpoint import OFT_PRESETS, oft_preset, read_oft_spec
from vla_sched.model.families.openvla_oft.family import oft_settings_of
from vla_sched.model.families.openvla_oft.model import load_oft_checkpoint
from vla_sched.model.families.openvla_oft.prompt import OFTPromptBuilder
from vla_sched.model.families.openvla_oft.runner import ParallelActionRunner
from vla_sched.model.layers.image_crop import center_crop_image
from vla_sched.testing.openvla_oft_writer import write_openvla_oft_checkpoint
from vla_sched.testing.openvla_writer import write_openvla_checkpoint

pytestmark = pytest.mark.slow

CROPPED = 'cropped'  # the robot whose images the core center-crops (robots.<id>.center_crop)
STATE = np.linspace(-0.3, 0.4, 8).astype(np.float32)


class RecordingRunner:
    """Passes each batch on to the core's runner and keeps its request ids."""

    def __init__(self, inner) -> None:
        self.inner = inner
        self.passes: list[tuple[str, ...]] = []

    def launch(self, batch: ForwardBatch):
        self.passes.append(batch.rids)
        return self.inner.launch(batch)


@pytest.fixture(scope='module')
def oft_dir(tmp_path_factory):
    return write_openvla_oft_checkpoint(tmp_path_factory.mktemp('oft') / 'tiny-oft', seed=3)


@pytest.fixture(scope='module')
def core(oft_dir):
    config = EngineConfig(
        model_path=str(oft_dir),
        oft_preset='libero',
        oft_center_crop=False,  # only the robot that asks for it is cropped
        robots={CROPPED: {'center_crop': True}},
        kv_pool_tokens=8192,
    )
    parts = assemble_core(config)
    c = ScheduledCore(dataclasses.replace(parts, runner=RecordingRunner(parts.runner)))
    yield c
    c.close()


@pytest.fixture(scope='module')
def reference(oft_dir):
    """The runner's chunks for steps given as (instruction, images, state), on a model and
    prompts loaded here, on a slot table of its own."""
    spec = read_oft_spec(oft_dir, oft_preset('libero', center_crop=False))
    model = load_oft_checkpoint(oft_dir, spec=spec)
    prompts = OFTPromptBuilder.from_checkpoint(oft_dir, spec)

    def run(steps) -> np.ndarray:
        built = [prompts.build(instruction) for instruction, _, _ in steps]
        row_len = max(len(p.token_ids) for p in built)
        table = torch.arange(len(steps) * row_len, dtype=torch.int32).view(len(steps), row_len)
        images, ids, slots = [], [], []
        for row, (prompt, (_, pixels, _)) in enumerate(zip(built, steps, strict=True)):
            layout = prompt.layout
            images.append(
                tuple(
                    ImageInput(1000 * row + c, layout.image_offset(c), layout.num_image_tokens, p)
                    for c, p in enumerate(pixels)
                )
            )
            ids += prompt.token_ids
            slots.append(table[row, : len(prompt.token_ids)])
        lens = torch.tensor([len(p.token_ids) for p in built], dtype=torch.int64)
        batch = ForwardBatch(
            forward_mode=ForwardMode.EXTEND,
            rids=tuple(f'ref{i}' for i in range(len(steps))),
            req_pool_indices=torch.arange(len(steps), dtype=torch.int64),
            prefix_lens=torch.zeros_like(lens),
            extend_lens=lens,
            seq_lens=lens,
            input_ids=torch.tensor(ids, dtype=torch.int64),
            out_cache_loc=torch.cat(slots).to(torch.int64),
            sample=(True,) * len(steps),
            sampling=(SamplingParams(0, 1),) * len(steps),
            images=tuple(images),
        )
        runner = ParallelActionRunner(model, req_to_token=table, num_kv_slots=table.numel())
        return runner.forward_actions(batch, states=[state for _, _, state in steps])

    return run


def _images(seed: int, num_images: int = 2) -> tuple[np.ndarray, ...]:
    rng = np.random.default_rng(seed)
    return tuple(rng.integers(0, 256, (40, 48, 3), dtype=np.uint8) for _ in range(num_images))


def _request(robot_id, step_seq, images, *, state=STATE, instruction='stack the cups'):
    now = time.time_ns()
    return StepRequest(
        robot_id=robot_id, step_seq=step_seq, stamp_ns=now, deadline_ns=now + 120 * 10**9,
        received_ns=now, images=images, state=state, instruction=instruction,
        instruction_version=1,
    )  # fmt: skip


def _drain(core: ScheduledCore, max_iterations: int = 50) -> dict[str, StepResult | StepFailure]:
    """Run the scheduler until idle, checking its invariants after every iteration."""
    out = {}
    for _ in range(max_iterations):
        if not core.has_work():
            return out
        out.update((m.robot_id, m) for m in core.step(time.time_ns()))
        core.check_integrity()
    raise AssertionError('the scheduler did not go idle')


def test_the_engine_says_what_the_oft_checkpoint_takes(core):
    info = core.info
    assert (info.num_images, info.num_state) == (2, 8)
    assert (info.action_horizon, info.action_dim) == (8, 7)


def test_two_robots_steps_run_in_one_pass_and_give_the_runners_chunks(core, reference):
    first, second = _images(1), _images(2)
    passes_before = len(core.scheduler.runner.passes)
    assert core.submit(_request('a', 1, first), time.time_ns()) == []
    assert core.submit(_request('b', 1, second, state=-STATE, instruction='open the drawer'),
                       time.time_ns()) == []  # fmt: skip
    results = _drain(core)
    assert core.scheduler.runner.passes[passes_before:] == [('a/1', 'b/1')]
    expected = reference([('stack the cups', first, STATE), ('open the drawer', second, -STATE)])
    for robot, want in zip(('a', 'b'), expected, strict=True):
        out = results[robot]
        assert isinstance(out, StepResult), out
        assert out.actions.dtype == np.float32 and out.actions.shape == (8, 7)
        np.testing.assert_allclose(out.actions, want, rtol=1e-5, atol=1e-6)
        assert out.decode_ms == 0 and out.prefill_ms >= 0
        assert out.num_cached_prefix_tokens == 0
    assert not np.allclose(results['a'].actions, results['b'].actions)
    assert core.memory.num_free_tokens() + core.memory.evictable_size() == (
        core.memory.allocator.num_pages * core.memory.page_size
    )  # no KV kept, nothing cached
    assert list(core.scheduler.sessions()) == []
    stats = core.stats(time.time_ns())
    assert np.isnan(stats.itl_ms_p50) and np.isnan(stats.robots['a'].itl_ms_p50)  # n/a
    assert stats.robots['a'].ttft_ms_p50 > 0


@pytest.mark.parametrize(
    ('images', 'state', 'reason', 'detail'),
    [
        (_images(3, 1), STATE, FailureReason.MALFORMED_IMAGE, 'takes 2 per step'),
        (_images(3), np.full(8, np.nan, np.float32), FailureReason.INVALID_STATE, 'NaN or inf at'),
        (_images(3), STATE[:7], FailureReason.INVALID_STATE, 'state must have 8 values'),
    ],
)  # fmt: skip
def test_a_step_that_does_not_fit_is_refused_and_the_other_robot_is_served(
    core, images, state, reason, detail
):
    (refused,) = core.submit(_request('bad', 1, images, state=state), time.time_ns())
    assert refused.reason is reason and detail in refused.detail
    assert core.submit(_request('good', 1, _images(4)), time.time_ns()) == []
    results = _drain(core)
    assert set(results) == {'good'} and isinstance(results['good'], StepResult)


def test_a_robot_with_center_crop_gets_the_chunk_of_its_cropped_images(core, reference):
    images = _images(5)
    assert core.submit(_request(CROPPED, 1, images), time.time_ns()) == []
    assert core.submit(_request('plain', 1, images), time.time_ns()) == []
    results = _drain(core)
    cropped = tuple(center_crop_image(i) for i in images)
    want_cropped, want_plain = reference([('stack the cups', cropped, STATE),
                                          ('stack the cups', images, STATE)])  # fmt: skip
    np.testing.assert_allclose(results[CROPPED].actions, want_cropped, rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(results['plain'].actions, want_plain, rtol=1e-5, atol=1e-6)
    assert not np.allclose(results[CROPPED].actions, results['plain'].actions, atol=1e-4)


def test_a_pass_holds_several_of_the_longest_steps_a_row_takes(core):
    chunk = core.scheduler.config.chunked_prefill_size
    row = core.memory.config.max_context_len
    prompts = core.served.translator.prompts
    # One token per byte of this text: the tighter bound is the longest instruction accepted.
    text_bound = min(core.config.max_instruction_bytes, core.config.max_instruction_tokens)
    longest = prompts.build('x' * text_bound).token_ids
    assert len(longest) <= row and chunk >= 4 * row and chunk % core.config.page_size == 0


def test_oft_settings_and_folders_that_disagree_are_refused_naming_the_parameter(
    oft_dir, tmp_path
):
    with pytest.raises(ModelPathError, match=r'OpenVLA-OFT checkpoint .*set engine\.oft_preset'):
        check_model_path(EngineConfig(model_path=str(oft_dir)))
    plain = write_openvla_checkpoint(tmp_path / 'plain', datasets=('libero',))
    with pytest.raises(ModelPathError, match=r'engine\.oft_preset set but .* openvla checkpoint'):
        check_model_path(EngineConfig(model_path=str(plain), oft_preset='libero'))
    with pytest.raises(ModelPathError, match=r'engine\.core sequential does not serve'):
        check_model_path(EngineConfig(model_path=str(oft_dir), oft_preset='libero',
                                      core='sequential'))  # fmt: skip
    with pytest.raises(ModelPathError, match=r'use_proprio is false but .*engine\.oft_\*'):
        check_model_path(EngineConfig(model_path=str(oft_dir), oft_preset='libero',
                                      oft_use_proprio=False))  # fmt: skip
    check_model_path(EngineConfig(model_path=str(oft_dir), oft_preset='libero'))


def test_oft_overrides_need_a_preset_and_apply_to_its_settings():
    with pytest.raises(EngineConfigError, match=r'engine\.oft_chunk_len set without engine\.oft'):
        EngineConfig(oft_chunk_len=50)
    assert set(OFT_PRESET_CHOICES) == {'', *OFT_PRESETS}
    config = EngineConfig(oft_preset='aloha', oft_chunk_len=50, oft_use_proprio=False)
    want = oft_preset('aloha', chunk_len=50, use_proprio=False)
    assert oft_settings_of(config.to_mapping()) == want
    assert oft_settings_of(EngineConfig().to_mapping()) is None
