"""Test-wide settings that must be in place before any project module imports."""

import os

# Triton reads TRITON_INTERPRET when a kernel is decorated, so set it before any kernel
# module is imported; without a GPU the interpreter is the only Triton backend.
os.environ.setdefault('TRITON_INTERPRET', '1')
os.environ.setdefault('HF_HUB_OFFLINE', '1')
os.environ.setdefault('TRANSFORMERS_OFFLINE', '1')
