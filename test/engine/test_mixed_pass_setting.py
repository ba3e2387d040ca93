"""Where the engine turns mixed passes on: wherever a path runs them, never against the
setting."""

from __future__ import annotations

from vla_sched.engine.assembly import scheduler_config_for
from vla_sched.engine.config import EngineConfig


def test_mixed_passes_run_on_the_cpu_and_on_a_gpu_with_cuda_graphs():
    config = EngineConfig()
    assert scheduler_config_for(config, 'cpu').enable_mixed_chunk
    assert scheduler_config_for(config, 'cuda').enable_mixed_chunk  # captured prefill path


def test_a_gpu_without_cuda_graphs_keeps_separate_passes():
    config = EngineConfig(cuda_graphs=False)
    assert not scheduler_config_for(config, 'cuda').enable_mixed_chunk
    assert scheduler_config_for(config, 'cpu').enable_mixed_chunk


def test_the_setting_turns_mixed_passes_off_on_every_device():
    config = EngineConfig(enable_mixed_chunk=False)
    assert not scheduler_config_for(config, 'cpu').enable_mixed_chunk
    assert not scheduler_config_for(config, 'cuda').enable_mixed_chunk
