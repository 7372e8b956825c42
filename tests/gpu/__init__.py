"""Multi-rank GPU tests for torch_nccl_core (any world size); see conftest.py for how they are run.

A package, so that module names here (test_options, helpers, ...) cannot clash with
same-named modules in tests/cpu.
"""
