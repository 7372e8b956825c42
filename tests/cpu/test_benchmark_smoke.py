"""The collectives benchmark runs end to end (on CPU with gloo) and writes its table, CSV and plot;
every benchmark driver, the GPU-only ones included, imports and parses its command line.

`benchmarks` is a package at the repository root, importable when pytest runs as `python -m pytest`
from there (the README's command); the driver runs from the root as `-m benchmarks.collectives`.
"""

import csv
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest

from benchmarks.timing import Row, paired_ratio

ROOT = Path(__file__).resolve().parents[2]


def test_benchmark_writes_its_outputs(tmp_path):
    ops = ["all_reduce", "broadcast", "all_gather_into_tensor"]
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=2",
        "-m", "benchmarks.collectives",
        "--backends", "gloo,gloo", "--max-bytes", "1K", "--repeats", "2", "--ops", ",".join(ops),
        "--out", str(tmp_path),
    ]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=240)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "collectives.csv").open()))
    assert {row["op"] for row in rows} == set(ops)
    assert all(float(row["time_us"]) > 0 for row in rows)
    assert "| all_reduce | 8 B |" in (tmp_path / "collectives.md").read_text()
    assert (tmp_path / "collectives_ratio.png").stat().st_size > 0


def test_interleaved_runs_each_backend_apart_and_pairs_the_repeats(tmp_path):
    """Every label runs in its own processes once per repeat, in rotating order; the report pairs
    each repeat's ratio and gives host time above torch's fake backend (the floor)."""
    command = [
        sys.executable, "-m", "benchmarks.interleaved", "--nproc", "2", "--repeats", "2",
        "--out", str(tmp_path), "--run", "base=gloo", "--run", "floor=fake",
        "--run", "other=gloo BENCH_MARKER=1", "--", "--ops", "all_reduce", "--max-bytes", "64",
    ]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    order = [
        line.split()[2].rstrip(":")
        for line in result.stdout.splitlines()
        if line.startswith("repeat ")
    ]
    assert order == ["base", "floor", "other", "floor", "other", "base"]
    rows = list(csv.DictReader((tmp_path / "interleaved.csv").open()))
    assert {(row["label"], row["repeat"]) for row in rows} == {
        (label, str(repeat)) for label in ("base", "floor", "other") for repeat in (0, 1)
    }
    text = (tmp_path / "interleaved.md").read_text()
    assert "time other/base" in text and "other host above floor us" in text
    line = next(x for x in text.splitlines() if x.startswith("| all_reduce | 8 B |"))
    assert "[" in line  # a median with its range over the two repeats


@pytest.mark.parametrize(
    "driver",
    [
        "collectives",
        "decode",
        "interleaved",
        "registration_latency",
        "reduce_scatter_crossover",
        "train_step",
    ],
)
def test_driver_imports_and_parses(driver):
    """Every driver, GPU-only ones included, imports and answers --help as a module."""
    command = [sys.executable, "-m", f"benchmarks.{driver}", "--help"]
    result = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.startswith("usage:")


def test_decode_measures_a_decode_steps_sizes(tmp_path):
    """The decode driver's all_reduces: the small sizes, then [tokens, hidden] in bf16; one
    backend per run, which interleaved names as --module."""
    from benchmarks import decode, interleaved

    out = str(tmp_path)
    args = decode.parse_args(["--backends", "nccl_core", "--out", out, "--tokens", "1,512"])
    got = [n * 2 for _, n in decode.sizes(args)]
    assert got == [8, 64, 512, 4096, 8192, 4 << 20, 16384, 8 << 20]
    assert decode.sizes(args)[4][0] == "all_reduce h4096"
    with pytest.raises(SystemExit):
        decode.parse_args(["--backends", "nccl,nccl_core", "--out", str(tmp_path)])
    found, _ = interleaved.parse_args(
        ["--module", "benchmarks.decode", "--run", "b=nccl", "--out", str(tmp_path)]
    )
    assert interleaved.report_name(found) == "decode"


def test_train_step_runs_and_reports_losses_per_label(tmp_path):
    """The training-step driver through interleaved, tiny, on gloo without a GPU (DDP: FSDP2 on
    gloo sometimes ends its process in std::terminate at exit, torch's, not the driver's): a row
    per config and label, with the same losses for two runs of the same backend (same seed, same
    data), shown per label in the report."""
    command = [
        sys.executable, "-m", "benchmarks.interleaved", "--module", "benchmarks.train_step",
        "--nproc", "2", "--repeats", "1", "--out", str(tmp_path), "--run", "a=gloo",
        "--run", "b=gloo", "--", "--layers", "1", "--width", "32", "--heads", "2", "--vocab", "64",
        "--seq", "8", "--steps", "2", "--warmup", "1", "--parallel", "ddp",
    ]  # fmt: skip
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    rows = list(csv.DictReader((tmp_path / "interleaved.csv").open()))
    variants = {"ddp-comm", "ddp-compute"}
    assert {(r["variant"], r["label"]) for r in rows} == {(v, x) for v in variants for x in "ab"}
    loss = {(r["variant"], r["label"]): float(r["loss"]) for r in rows}
    assert all(math.isclose(loss[(v, "a")], loss[(v, "b")], rel_tol=1e-6) for v in variants), loss
    text = (tmp_path / "interleaved.md").read_text()
    assert "a loss" in text and "b tokens/s" in text


def test_train_step_shards_with_fsdp2_and_takes_a_step(tmp_path):
    """FSDP2's wiring (each block sharded, bf16 parameters, fp32 reduction) in this process, one
    rank on gloo: a step gives a finite loss."""
    import torch
    import torch.distributed as dist

    from benchmarks import train_step

    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        args = train_step.parse_args(
            ["--backends", "gloo", "--out", str(tmp_path), "--layers", "2", "--width", "32",
             "--heads", "2", "--vocab", "64", "--seq", "8"]
        )  # fmt: skip
        group = dist.new_group(backend="gloo")
        cpu = torch.device("cpu")
        model, params = train_step.wrapped(args, "fsdp2", group, cpu)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
        loss = train_step.train_step(model, optimizer, train_step.batch(args, 1, 0, cpu), "fsdp2")
        assert params == sum(p.numel() for p in train_step.Model(args).parameters())
        assert bool(torch.isfinite(loss))
    finally:
        dist.destroy_process_group()


def test_variant_ratio_pairs_the_repeats():
    """Drift between repeats (a slow second repeat for both) cancels out of the ratio."""

    def row(samples):
        return Row("v", "all_reduce", 8, "b", 1, min(samples), 1.0, 1.0, samples)

    plain, registered = row([10.0, 20.0, 10.0]), row([10.5, 21.0, 10.5])
    assert paired_ratio(plain, registered) == 1.05
    # Best time against best time would call this equal: 10.0 / 10.0.
    assert paired_ratio(row([10.0, 30.0, 30.0]), row([11.0, 10.0, 10.0])) < 0.5


def test_overlap_rows_carry_the_matmul_slowdown(tmp_path):
    """Mode overlap's slowdown reaches the CSV and both reports; other modes leave it empty."""
    from benchmarks import interleaved, report

    rows = [
        Row("plain", "all_gather_into_tensor", 1 << 28, "b", 5, 900.0, 20.0, 0.5, [900.0]),
        Row("plain/overlap", "all_gather_into_tensor", 1 << 28, "b", 5, 950.0, 20.0, 0.5, [950.0],
            12.5),
    ]  # fmt: skip
    report.write_csv(str(tmp_path / "collectives.csv"), rows)
    written = list(csv.DictReader((tmp_path / "collectives.csv").open()))
    assert [r["matmul_slowdown_pct"] for r in written] == ["", "12.500"]
    assert "| 12.50 |" in report.markdown(rows, ["b"], [])

    # interleaved: per label, the median and range over the repeats
    (tmp_path / "runs" / "r0-b").mkdir(parents=True)
    (tmp_path / "runs" / "r0-b" / "collectives.md").write_text("- date: now\n")
    args, _ = interleaved.parse_args(["--run", "b=nccl_core", "--out", str(tmp_path)])
    repeats = [
        {**row, "label": "b", "repeat": repeat}
        | ({"matmul_slowdown_pct": value} if row["matmul_slowdown_pct"] else {})
        for repeat, value in enumerate(["10.0", "14.0", "12.0"])
        for row in written
    ]
    text = interleaved.markdown(args, repeats, [])
    assert "b matmul slowdown %" in text and "| 12.00 [10.00, 14.00] |" in text
    eager = next(line for line in text.splitlines() if line.startswith("| all_gather"))
    assert eager.endswith("|  |")  # the eager row has no slowdown: an empty cell


AGREEMENT_SCRIPT = """
import torch
import torch.distributed as dist
from benchmarks.overlap import Agreement

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
calls = dist.new_group(backend="gloo")  # the collectives beside, on a group of their own
agreement, rounds = Agreement(), 0
while True:
    rounds += 1
    dist.all_reduce(torch.ones(1), group=calls)
    if agreement.all_done(rounds >= 3 * rank + 1):  # the last rank is done last
        break
answers = [None] * world
dist.all_gather_object(answers, rounds)
if rank == 0:
    print("rounds", answers)
dist.destroy_process_group()
"""


def test_overlap_ranks_agree_to_stop_in_the_same_round(tmp_path):
    """The overlap mode's matmul loop ends when every rank is done, agreed without pausing the
    calls beside it: every rank must stop after the same round (else their calls would not
    match up), the one after the last rank got done."""
    script = tmp_path / "agreement.py"
    script.write_text(AGREEMENT_SCRIPT)
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node=3", str(script)]
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "PYTHONPATH": str(ROOT)}
    result = subprocess.run(command, capture_output=True, text=True, env=env, cwd=ROOT, timeout=120)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    assert "rounds [8, 8, 8]" in result.stdout, result.stdout[-2000:]
