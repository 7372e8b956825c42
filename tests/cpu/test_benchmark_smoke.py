"""The benchmark script runs end to end (on CPU with gloo) and writes its table, CSV and plot."""

import csv
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_writes_its_outputs(tmp_path):
    ops = ["all_reduce", "broadcast", "all_gather_into_tensor"]
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        str(ROOT / "benchmarks" / "collectives.py"),
        "--backends", "gloo,gloo", "--max-bytes", "1K", "--repeats", "2", "--ops", ",".join(ops),
        "--out", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "collectives.csv").open()))
    assert {row["op"] for row in rows} == set(ops)
    assert all(float(row["time_us"]) > 0 for row in rows)
    assert "| all_reduce | 8 B |" in (tmp_path / "collectives.md").read_text()
    assert (tmp_path / "collectives_ratio.png").stat().st_size > 0


def test_variant_ratio_pairs_the_repeats():
    """Drift between repeats (a slow second repeat for both) cancels out of the ratio."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import collectives
    finally:
        sys.path.pop(0)

    def row(samples):
        return collectives.Row("v", "all_reduce", 8, "b", 1, min(samples), 1.0, 1.0, samples)

    plain, registered = row([10.0, 20.0, 10.0]), row([10.5, 21.0, 10.5])
    assert collectives.paired_ratio(plain, registered) == 1.05
    # Best time against best time would call this equal: 10.0 / 10.0.
    assert collectives.paired_ratio(row([10.0, 30.0, 30.0]), row([11.0, 10.0, 10.0])) < 0.5
