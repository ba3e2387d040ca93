"""Benchmarks: one driver per question (``python -m bench.<driver>``), on one shared library.

``bench/lib`` holds what several drivers share (percentiles, tables, fleets of simulated
robots, capacity search, the cost model, checkpoint folders); docs/benchmarks.md says how to
run each driver and gives the latest numbers per machine.
"""
