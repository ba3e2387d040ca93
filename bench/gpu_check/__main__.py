"""``python -m bench.gpu_check``: the prepared GPU run (``bench/gpu_check/__init__.py``)."""

import sys

from bench.gpu_check.driver import main

sys.exit(main())
