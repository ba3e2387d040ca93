"""Installs the engine soak's probe in an engine process (see ``bench/soak_probe.py``).

Python imports ``sitecustomize`` at start-up from its path; the soak puts this folder first
on the engine process's ``PYTHONPATH``. Nothing happens unless ``VLA_SCHED_SOAK_PROBE`` is set.
"""

import os
import sys

if os.environ.get('VLA_SCHED_SOAK_PROBE'):
    sys.path.insert(
        0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    )
    from bench.soak_probe import install_from_env

    install_from_env()
