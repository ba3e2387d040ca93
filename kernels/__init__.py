"""Triton kernels for paged KV attention, each beside its float32 torch reference.

Installed and imported as ``vla_sched.kernels``.
"""
