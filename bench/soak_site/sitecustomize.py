"""Installs the engine soak's probe in an engine process (see ``bench/soak_probe.py``).

Python imports ``sitecustomize`` at start-up from its path; the soak puts this folder first
on the engine process's ``PYTHONPATH``, and the repository root after it (so ``bench``
imports). Nothing happens unless ``VLA_SCHED_SOAK_PROBE`` is set.
"""

import os

if os.environ.get('VLA_SCHED_SOAK_PROBE'):
    from bench.soak_probe import install_from_env

    install_from_env()
