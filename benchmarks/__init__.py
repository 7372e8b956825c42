"""Benchmarks of torch.distributed backends: nccl_core against torch's built-in nccl.

Run from the repository root, one process per GPU, e.g.

    torchrun --nproc-per-node=2 -m benchmarks.collectives --out OUT

Drivers, each with a ``main()`` and its flags and outputs in its docstring:

* ``benchmarks.collectives``: every collective on each backend, over a size sweep;
* ``benchmarks.registration_latency``: one op's latency on registered memory against plain;
* ``benchmarks.reduce_scatter_crossover``: where the copy-engine reduce-scatter starts to win.

What they share: ``cases`` (ops with their inputs and expected results, memory variants),
``expected`` (expected values of rank-dependent fills, also used by the GPU tests), ``timing``
(timed loops, correctness checks, result rows), ``report`` (tables, CSV, plot, run environment)
and ``cli`` (argument parsing and process-group setup).
"""
