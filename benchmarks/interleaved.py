"""Compare backends each in its own processes, runs interleaved, as paired ratios with their spread.

Run from the repository root (it starts torchrun itself):

    python -m benchmarks.interleaved --nproc 2 --repeats 5 --out results/ \\
        --run floor=fake --run nccl=nccl --run nccl_core=nccl_core \\
        --run "no-fr=nccl_core TORCH_FR_BUFFER_SIZE=0" --run "no-nccl=nccl_core --noop-nccl" \\
        -- --ops all_reduce,all_gather_into_tensor --max-bytes 64K

Each ``--run LABEL=BACKEND [NAME=VALUE ...] [--flag ...]`` is one run of ``--module`` (default
``benchmarks.collectives``; ``benchmarks.decode`` too: any driver that takes ``--backends``,
``--init-backend`` and ``--out`` and writes OUT/<name>.csv and OUT/<name>.md) with that backend
alone (default group gloo, so no other backend is set up in its processes), with
those environment variables and extra flags; arguments after ``--`` go to every run. Every repeat
runs each label once, the order rotating from repeat to repeat (A B C, B C A, ...), so that slow
drift of the machine spreads over all of them.

Reported per (variant, op, size): each label's median over the repeats of its time per call and
host time per call; each label's time against the baseline's (``--baseline``, default the first
label) as the median of the per-repeat ratios, with their range; and, given a floor label (by
default the one running torch's ``fake`` backend, which communicates nothing), each label's host
time above that floor: what the backend and NCCL add to ``torch.distributed``'s own cost of a
call. A ``--noop-nccl`` run of ``nccl_core``
splits that further into the backend's share and NCCL's enqueue. With ``--modes overlap`` each
label's matmul slowdown beside its calls is shown too, and a training step's tokens/s, peak
memory, exposed communication and loss (median [range] over the repeats).

Writes OUT/interleaved.md, OUT/interleaved.csv (every run's rows with their repeat) and each run's
own outputs under OUT/runs/.
"""

from __future__ import annotations

import argparse
import csv
import os
import shlex
import statistics
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from .cli import FLOOR_BACKEND
from .report import fmt, human_bytes

ROOT = Path(__file__).resolve().parents[1]


@dataclass
class Run:
    """One label: a backend with its environment and extra collectives flags."""

    label: str
    backend: str
    env: dict[str, str] = field(default_factory=dict)
    flags: list[str] = field(default_factory=list)


def parse_run(text: str) -> Run:
    words = shlex.split(text)
    label, sep, backend = words[0].partition("=") if words else ("", "", "")
    if not sep or not label or not backend:
        raise argparse.ArgumentTypeError(f"bad run {text!r}: expected LABEL=BACKEND [...]")
    run = Run(label, backend)
    for word in words[1:]:
        name, sep, value = word.partition("=")
        if word.startswith("-"):
            run.flags.append(word)
        elif sep and name:
            run.env[name] = value
        else:
            raise argparse.ArgumentTypeError(f"bad run {text!r}: {word!r} is no NAME=VALUE or flag")
    return run


def parse_args(argv: list[str] | None = None) -> tuple[argparse.Namespace, list[str]]:
    argv = sys.argv[1:] if argv is None else argv
    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--run",
        dest="runs",
        type=parse_run,
        action="append",
        required=True,
        help="LABEL=BACKEND [NAME=VALUE ...] [--flag ...]",
    )
    p.add_argument(
        "--module",
        default="benchmarks.collectives",
        help="the driver each run starts (default benchmarks.collectives)",
    )
    p.add_argument("--nproc", type=int, default=2, help="processes per run (default 2)")
    p.add_argument("--repeats", type=int, default=5, help="runs of every label (default 5)")
    p.add_argument("--baseline", help="label the times are compared with (default: the first)")
    p.add_argument("--floor", help="label whose host time is the floor (default: the fake run)")
    p.add_argument("--out", required=True, help="output directory")
    args = p.parse_args(argv[:split])
    labels = [r.label for r in args.runs]
    if len(set(labels)) != len(labels):
        p.error(f"labels must differ: {', '.join(labels)}")
    if args.repeats < 1 or args.nproc < 1:
        p.error("need --repeats >= 1 and --nproc >= 1")
    if args.baseline is None:
        args.baseline = labels[0]
    elif args.baseline not in labels:
        p.error(f"--baseline {args.baseline} is none of the labels {', '.join(labels)}")
    if args.floor is None:
        args.floor = next((r.label for r in args.runs if r.backend == FLOOR_BACKEND), None)
    elif args.floor not in labels:
        p.error(f"--floor {args.floor} is none of the labels {', '.join(labels)}")
    return args, argv[split + 1 :]


def order(runs: list[Run], repeat: int) -> list[Run]:
    """The runs of one repeat: rotated by one per repeat."""
    shift = repeat % len(runs)
    return runs[shift:] + runs[:shift]


def run_once(args, run: Run, repeat: int, passthrough: list[str]) -> list[dict]:
    """One collectives run of `run`; its CSV rows, tagged with label and repeat."""
    out = Path(args.out) / "runs" / f"r{repeat}-{run.label}"
    # torchrun, whose ranks take hosts of their own where they outnumber the GPUs.
    command = [
        sys.executable, "-m", "torch_nccl_core.launch", f"--nproc-per-node={args.nproc}",
        "-m", args.module, "--backends", run.backend, "--init-backend", "gloo",
        "--out", str(out), *run.flags, *passthrough,
    ]  # fmt: skip
    print(f"repeat {repeat} {run.label}: {describe(run)}", flush=True)
    env = {**os.environ, **run.env}
    log = out.with_suffix(".log")
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as f:
        result = subprocess.run(command, env=env, cwd=ROOT, stdout=f, stderr=subprocess.STDOUT)
    if result.returncode != 0:
        print(f"run {run.label} (repeat {repeat}) failed: see {log}", flush=True)
        return []
    with (out / f"{report_name(args)}.csv").open() as f:
        return [{**row, "label": run.label, "repeat": repeat} for row in csv.DictReader(f)]


def report_name(args) -> str:
    """The name of the driver's own reports: benchmarks.decode writes decode.csv, decode.md."""
    return args.module.rpartition(".")[2]


def by_case(rows: list[dict]) -> dict[tuple[str, str, int], dict[str, dict[int, dict]]]:
    """(variant, op, bytes) -> label -> repeat -> row, in measurement order."""
    table: dict = {}
    for r in rows:
        key = (r["variant"], r["op"], int(r["bytes"]))
        table.setdefault(key, {}).setdefault(r["label"], {})[r["repeat"]] = r
    return table


def describe(run: Run) -> str:
    return shlex.join([run.backend, *(f"{k}={v}" for k, v in run.env.items()), *run.flags])


def paired(base: dict[int, dict], other: dict[int, dict], value) -> list[float]:
    """value(other's row, base's row) for every repeat both have."""
    return [value(other[k], base[k]) for k in base if k in other]


def time_ratio(other: dict, base: dict) -> float:
    return float(other["time_us"]) / float(base["time_us"])


def host_above(other: dict, base: dict) -> float:
    return float(other["host_us"]) - float(base["host_us"])


def values_of(repeats: dict[int, dict], key: str) -> list[float]:
    """The repeats' values of `key`, where they have one (CSV cells may be empty)."""
    return [float(r[key]) for r in repeats.values() if r.get(key)]


def median_of(repeats: dict[int, dict], key: str) -> str:
    values = values_of(repeats, key)
    return fmt(statistics.median(values), ".2f") if values else ""


def spread(values: list[float], spec: str) -> str:
    """median [min - max]"""
    if not values:
        return ""
    mid = format(statistics.median(values), spec)
    return mid if len(values) == 1 else f"{mid} [{min(values):{spec}}, {max(values):{spec}}]"


ENVIRONMENT = ("- date", "- torch", "- NCCL", "- device")


def run_environment(args, rows: list[dict]) -> list[str]:
    """The environment lines of the first run's own report (benchmarks/report.py)."""
    run = f"r{rows[0]['repeat']}-{rows[0]['label']}"
    first = Path(args.out) / "runs" / run / f"{report_name(args)}.md"
    return [line for line in first.read_text().splitlines() if line.startswith(ENVIRONMENT)]


# Columns a driver may add to its rows, shown per label as median [range] over the repeats:
# (CSV key, title, format).
EXTRAS = (
    ("matmul_slowdown_pct", "matmul slowdown %", ".2f"),  # collectives --modes overlap
    ("tokens_per_s", "tokens/s", ".0f"),  # train_step
    ("peak_mem_mb", "peak MiB", ".0f"),
    ("exposed_comm_ms", "exposed comm ms", ".2f"),
    ("loss", "loss", ".5f"),
)


def markdown(args, rows: list[dict], passthrough: list[str]) -> str:
    labels = [r.label for r in args.runs]
    base = args.baseline
    others = [label for label in labels if label != base]
    cols = ["op", "bytes"]
    cols += [f"{label} time us" for label in labels] + [f"{label} host us" for label in labels]
    cols += [f"time {o}/{base}" for o in others]
    above = [label for label in labels if label != args.floor] if args.floor else []
    cols += [f"{label} host above {args.floor} us" for label in above]
    extras = [(key, title, spec) for key, title, spec in EXTRAS if any(r.get(key) for r in rows)]
    cols += [f"{label} {title}" for _, title, _ in extras for label in labels]
    out = [
        "# Backends in separate processes, interleaved",
        "",
        *run_environment(args, rows),
        f"- {args.repeats} repeats of every run, {args.nproc} processes each; run order rotating",
        *(f"- `{r.label}`: `{describe(r)}`" for r in args.runs),
        f"- `{args.module}` arguments: `{shlex.join(passthrough)}`",
        "- time, host: median over the repeats of each run's time per call and median host time "
        "of one call (as the driver measures them); ratios and differences: median over the "
        "repeats of the per-repeat value, [range]",
    ]
    table = by_case(rows)
    for variant in dict.fromkeys(key[0] for key in table):
        out += ["", f"## variant `{variant}`", ""]
        out += ["| " + " | ".join(cols) + " |", "|---|---|" + "---:|" * (len(cols) - 2)]
        for (v, op, nbytes), found in table.items():
            if v != variant:
                continue
            by = {label: found.get(label, {}) for label in labels}  # a run may have failed
            cells = [op, human_bytes(nbytes)]
            for key in ("time_us", "host_us"):
                cells += [median_of(by[label], key) for label in labels]
            cells += [spread(paired(by[base], by[o], time_ratio), ".3f") for o in others]
            cells += [spread(paired(by[args.floor], by[a], host_above), ".2f") for a in above]
            for key, _, spec in extras:
                cells += [spread(values_of(by[label], key), spec) for label in labels]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def main(argv: list[str] | None = None) -> None:
    args, passthrough = parse_args(argv)
    rows, failed = [], []
    for repeat in range(args.repeats):
        for run in order(args.runs, repeat):
            got = run_once(args, run, repeat, passthrough)
            rows += got
            if not got:
                failed.append(f"{run.label} (repeat {repeat})")
    if not rows:
        raise SystemExit("every run failed")
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "interleaved.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    text = markdown(args, rows, passthrough)
    if failed:
        text += f"\nFailed runs, left out above: {', '.join(failed)}\n"
    with open(os.path.join(args.out, "interleaved.md"), "w") as f:
        f.write(text)
    print(text)
    print(f"wrote {args.out}/interleaved.{{md,csv}}")
    if failed:
        raise SystemExit(1)


if __name__ == "__main__":
    main()
