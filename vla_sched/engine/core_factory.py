"""Build the engine core a configuration asks for (imports the model stack lazily)."""

from __future__ import annotations

from vla_sched.engine.config import EngineConfig
from vla_sched.engine.core import EngineCore


def build_core(config: EngineConfig) -> EngineCore:
    """Load the checkpoint and build the core named by ``config.core``."""
    if config.core == 'sequential':
        from vla_sched.engine.sequential_core import SequentialCore

        return SequentialCore.from_config(config)
    from vla_sched.engine.scheduled_core import ScheduledCore

    return ScheduledCore.from_config(config)
