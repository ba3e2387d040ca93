"""Fixtures for tests and benchmarks: checkpoint writers, a simulated runner. The product never
imports this package."""
