"""What the benchmarks write: tables (markdown), CSV, the ratio plot, the run's environment, and
the number formats they share.
"""

from __future__ import annotations

import csv
import datetime
import os
import socket

import torch

from .timing import MIN_ITERS, Row, paired_ratio


def human_bytes(n: int) -> str:
    if n == 0:
        return "-"
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.4g} {unit}"
    return f"{n} B"


def fmt(value: float | None, spec: str) -> str:
    return "" if value is None else format(value, spec)


def ratio(a: float | None, b: float | None) -> float | None:
    return b / a if a and b is not None else None


def version_str(v) -> str:
    return ".".join(str(x) for x in v) if isinstance(v, tuple | list) else str(v)


def environment_lines(device: torch.device, world: int, core) -> list[str]:
    """Where a run was made: date, host, versions, device."""
    try:
        nccl_torch = version_str(torch.cuda.nccl.version())
    except (RuntimeError, AttributeError):  # CPU-only build
        nccl_torch = "n/a"
    nccl_core = version_str(core.nccl_version()) if core else "n/a (not imported)"
    gpu = torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu"
    now = datetime.datetime.now().isoformat(timespec="seconds")
    return [
        f"- date: {now}, host {socket.gethostname()}",
        f"- torch {torch.__version__}, CUDA {torch.version.cuda}",
        f"- NCCL: torch {nccl_torch}, torch_nccl_core {nccl_core}",
        f"- device: {gpu}, world size {world}",
    ]


# ----------------------------------------------------------------------------
# Collectives: one Row per (variant, op, size, backend).
# ----------------------------------------------------------------------------


def progress_line(r: Row) -> str:
    return (
        f"{r.variant:<6} {r.op:<23} {human_bytes(r.nbytes):>9} {r.backend:<10} "
        f"iters {r.iters:4d}  time {r.time_us:11.2f} us  host {r.host_us:8.2f} us  "
        f"busbw {fmt(r.busbw, '8.2f') or '-':>8} GB/s"
    )


def pivot(rows: list[Row]) -> dict[tuple[str, str, int], dict[str, Row]]:
    """(variant, op, bytes) -> {backend: Row}, in measurement order."""
    table: dict[tuple[str, str, int], dict[str, Row]] = {}
    for r in rows:
        table.setdefault((r.variant, r.op, r.nbytes), {})[r.backend] = r
    return table


def header_lines(args, device: torch.device, world: int, core) -> list[str]:
    return [
        "# Collective benchmark",
        "",
        *environment_lines(device, world, core),
        (f"- backends: {', '.join(args.backend_labels)}; default group: {args.init_backend}"),
        (
            f"- float32; per measurement: {args.warmup} warmup calls, then "
            f"{MIN_ITERS}..{args.iters} timed calls (~{args.target_ms:g} ms)"
        ),
        (
            "- time: wall time of back-to-back synchronous calls / calls; "
            "host: median CPU time of one call; busbw: nccl-tests bus bandwidth; "
            "all max over ranks"
        ),
        ("- bytes: per-rank buffer (all_gather: full output, reduce_scatter: full input)"),
        *(
            [
                f"- variants `<variant>/graph`: {args.graph_calls} calls captured in one CUDA "
                f"graph, replayed {args.graph_replays} times; time and host time of a replay / "
                f"{args.graph_calls}"
            ]
            if "graph" in args.modes
            else []
        ),
        *(
            [
                f"- variants `<variant>/overlap`: beside a loop of {args.matmul_size}^2 bf16 "
                f"matmuls on a side stream (~{args.overlap_ms:g} ms); time: per call while "
                "matmuls run; matmul slowdown: the matmul loop's time beside the calls against "
                "alone, in percent"
            ]
            if "overlap" in args.modes
            else []
        ),
    ]


def markdown(rows: list[Row], labels: list[str], head: list[str]) -> str:
    base, others = labels[0], labels[1:]
    slowdowns = any(r.matmul_slowdown_pct is not None for r in rows)
    cols = ["op", "bytes"]
    for label in labels:
        cols += [f"{label} time us", f"{label} host us", f"{label} busbw GB/s"]
        cols += [f"{label} matmul slowdown %"] if slowdowns else []
    for o in others:
        cols += [f"time {o}/{base}", f"busbw {o}/{base}"]
    out = list(head)
    table = pivot(rows)
    for variant in dict.fromkeys(r.variant for r in rows):
        out += ["", f"## variant `{variant}`", ""]
        out += ["| " + " | ".join(cols) + " |", "|---|---|" + "---:|" * (len(cols) - 2)]
        for (v, op, nbytes), by in table.items():
            if v != variant:
                continue
            cells = [op, human_bytes(nbytes)]
            for label in labels:
                r = by[label]
                cells += [
                    fmt(r.time_us, ".2f"),
                    fmt(r.host_us, ".2f"),
                    fmt(r.busbw, ".2f"),
                ]
                cells += [fmt(r.matmul_slowdown_pct, ".2f")] if slowdowns else []
            for o in others:
                cells += [
                    fmt(ratio(by[base].time_us, by[o].time_us), ".3f"),
                    fmt(ratio(by[base].busbw, by[o].busbw), ".3f"),
                ]
            out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out + memory_table(rows, labels)) + "\n"


def memory_table(rows: list[Row], labels: list[str]) -> list[str]:
    """Each backend's other memory variants against its own `plain` run, and bus bandwidth
    against the baseline backend on plain memory."""
    variants = [v for v in dict.fromkeys(r.variant for r in rows) if v != "plain"]
    if not variants or not any(r.variant == "plain" for r in rows):
        return []
    base = labels[0]
    table = pivot(rows)
    cols = ["op", "bytes", "backend", "plain time us"]
    for v in variants:
        cols += [f"{v} time / plain", f"{v} busbw / {base} plain"]
    out = ["", "## memory variants against plain memory", ""]
    out += [
        "time ratios below 1 mean the variant is faster than the same backend on plain memory",
        "(median over the repeats of the ratio within each repeat, where the two ran next to",
        f"each other); bandwidth ratios (best times) compare with {base} on plain memory.",
        "",
        "| " + " | ".join(cols) + " |",
        "|---|---|---|" + "---:|" * (len(cols) - 3),
    ]
    for (variant, op, nbytes), by in table.items():
        if variant != "plain":
            continue
        for label in labels:
            plain = by[label]
            cells = [op, human_bytes(nbytes), label, fmt(plain.time_us, ".2f")]
            for v in variants:
                other = table.get((v, op, nbytes), {}).get(label)
                cells += [
                    fmt(paired_ratio(plain, other) if other else None, ".3f"),
                    fmt(ratio(by[base].busbw, other.busbw) if other else None, ".3f"),
                ]
            out.append("| " + " | ".join(cells) + " |")
    return out


def write_csv(path: str, rows: list[Row]) -> None:
    head = "variant op bytes backend iters time_us host_us algbw_gbs busbw_gbs matmul_slowdown_pct"
    with open(path, "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(head.split())
        for r in rows:
            values = (r.time_us, r.host_us, r.algbw, r.busbw, r.matmul_slowdown_pct)
            nums = [fmt(v, ".3f") for v in values]
            w.writerow([r.variant, r.op, r.nbytes, r.backend, r.iters, *nums])


def write_plot(path: str, rows: list[Row], labels: list[str]) -> None:
    """One line per op (and variant/backend if several): time ratio vs the first backend."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not available: no plot written")
        return
    base, others = labels[0], labels[1:]
    variants = list(dict.fromkeys(r.variant for r in rows))
    series: dict[str, tuple[list[int], list[float]]] = {}
    for (variant, op, nbytes), by in pivot(rows).items():
        for o in others:
            if nbytes == 0:  # barrier: no size axis
                continue
            name = " ".join(
                [op]
                + ([f"[{variant}]"] if len(variants) > 1 else [])
                + ([o] if len(others) > 1 else [])
            )
            xs, ys = series.setdefault(name, ([], []))
            xs.append(nbytes)
            ys.append(by[o].time_us / by[base].time_us)
    fig, ax = plt.subplots(figsize=(10, 6))
    for name, (xs, ys) in series.items():
        ax.plot(xs, ys, marker="o", markersize=3, label=name)
    ax.axhline(1.0, color="black", linewidth=1)
    ax.axhline(0.5, color="gray", linewidth=1, linestyle="--")
    ax.set_xscale("log", base=2)
    ticks = sorted({x for xs, _ in series.values() for x in xs})
    ax.set_xticks(ticks, [human_bytes(t) for t in ticks], rotation=45, ha="right")
    ax.set_xlabel("bytes")
    ax.set_ylabel(f"time {' | '.join(others)} / {base}  (lower: faster than {base})")
    ax.set_title(f"{' | '.join(others)} vs {base}: time per op ratio")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def write_reports(args, device: torch.device, world: int, core, rows: list[Row]) -> None:
    os.makedirs(args.out, exist_ok=True)
    text = markdown(rows, args.backend_labels, header_lines(args, device, world, core))
    with open(os.path.join(args.out, "collectives.md"), "w") as f:
        f.write(text)
    write_csv(os.path.join(args.out, "collectives.csv"), rows)
    if len(args.backend_labels) > 1:
        write_plot(os.path.join(args.out, "collectives_ratio.png"), rows, args.backend_labels)
    print(text)
    print(
        f"wrote {args.out}/collectives.{{md,csv}}"
        + (" and collectives_ratio.png" if len(args.backend_labels) > 1 else "")
    )


# ----------------------------------------------------------------------------
# Registration latency: rows are dicts of op, bytes, backend and one "<variant>_us" per variant.
# ----------------------------------------------------------------------------


def latency_line(row: dict, variants: list[str]) -> str:
    ratios = "  ".join(
        f"{v}/plain {row[f'{v}_us'] / row['plain_us']:.3f}" for v in variants if v != "plain"
    )
    return (
        f"{row['op']:<23} {human_bytes(row['bytes']):>9} {row['backend']:<10} "
        f"plain {row['plain_us']:8.2f} us  {ratios}"
    )


def latency_markdown(args, rows: list[dict], head: list[str]) -> str:
    others = [v for v in args.variants if v != "plain"]
    cols = ["op", "bytes", "backend", "plain us"] + [f"{v} / plain" for v in others]
    out = [
        *head,
        f"- latency: median of {args.calls} calls + synchronize per variant, "
        "variants in turn; max over ranks",
        "",
        "## Worst ratio to plain over all sizes",
        "",
        "| op | backend | " + " | ".join(f"{v} / plain (max)" for v in others) + " |",
        "|---|---|" + "---:|" * len(others),
    ]
    for op in args.ops:
        for label in args.backend_labels:
            mine = [r for r in rows if r["op"] == op and r["backend"] == label]
            worst = [max(r[f"{v}_us"] / r["plain_us"] for r in mine) for v in others]
            out.append(f"| {op} | {label} | " + " | ".join(f"{w:.3f}" for w in worst) + " |")
    out += [
        "",
        "## Every size",
        "",
        "| " + " | ".join(cols) + " |",
        "|---|---|---|" + "---:|" * (len(cols) - 3),
    ]
    for r in rows:
        cells = [r["op"], human_bytes(r["bytes"]), r["backend"], f"{r['plain_us']:.2f}"]
        cells += [f"{r[f'{v}_us'] / r['plain_us']:.3f}" for v in others]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out) + "\n"


def write_latency_reports(args, device: torch.device, world: int, core, rows: list[dict]) -> None:
    head = ["# Registration latency benchmark", "", *environment_lines(device, world, core)]
    text = latency_markdown(args, rows, head)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "registration_latency.md"), "w") as f:
        f.write(text)
    with open(os.path.join(args.out, "registration_latency.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    print(text)


def write_rows(out: str, name: str, title: str, head: list[str], rows: list[dict]) -> None:
    """OUT/name.csv (every row, its keys as columns) and OUT/name.md (a title, the lines of `head`,
    then the rows as a table), for drivers that measure one backend per run."""
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.csv"), "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    def cell(value) -> str:
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = [f"# {title}", "", *head, "", "| " + " | ".join(rows[0]) + " |"]
    lines += ["|" + "---|" * len(rows[0])]
    lines += ["| " + " | ".join(cell(v) for v in row.values()) + " |" for row in rows]
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
