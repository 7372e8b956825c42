"""Command lines and process groups of the benchmark drivers: argument types and the arguments they
share, the default group's setup and teardown, and the per-backend groups.
"""

from __future__ import annotations

import argparse
import os
import re
from collections.abc import Callable

import torch
import torch.distributed as dist

from .cases import ELEM
from .report import environment_lines, write_rows
from .timing import rank_max

_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30}


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"(\d+)\s*([KMG]?)(I?B)?", text.strip().upper())
    if not m:
        raise argparse.ArgumentTypeError(f"bad size {text!r} (examples: 8, 64K, 1M, 1G)")
    return int(m[1]) * _UNITS[m[2]]


def comma_list(choices: list[str] | None = None) -> Callable[[str], list[str]]:
    def parse(text: str) -> list[str]:
        items = [s.strip() for s in text.split(",") if s.strip()]
        if not items:
            raise argparse.ArgumentTypeError("empty list")
        unknown = [s for s in items if choices is not None and s not in choices]
        if unknown:
            raise argparse.ArgumentTypeError(
                f"unknown {', '.join(unknown)} (choose from {', '.join(choices)})"
            )
        return items

    return parse


def size_sweep(lo: int, hi: int, factor: int) -> list[int]:
    """lo, lo*factor, ... up to hi; hi itself is always included."""
    sizes = []
    n = lo
    while n < hi:
        sizes.append(n)
        n *= factor
    return [*sizes, hi]


def backend_labels(backends: list[str]) -> list[str]:
    """Distinct labels, so that naming a backend twice ("nccl,nccl": the noise floor) works."""
    counts = {b: backends.count(b) for b in backends}
    return [b if counts[b] == 1 else f"{b}#{i + 1}" for i, b in enumerate(backends)]


def add_backend_arguments(p: argparse.ArgumentParser, backends_help: str) -> None:
    """--backends and --out."""
    p.add_argument(
        "--backends",
        type=comma_list(),
        default=["nccl", "nccl_core"],
        help=f"{backends_help} (default nccl,nccl_core)",
    )
    p.add_argument("--out", required=True, help="output directory (written by rank 0)")


def add_size_arguments(p: argparse.ArgumentParser, max_bytes: str) -> None:
    """--min-bytes, --max-bytes (default `max_bytes`) and --step-factor; see check_sizes."""
    p.add_argument("--min-bytes", type=parse_bytes, default=8, help="smallest size (default 8)")
    p.add_argument(
        "--max-bytes",
        type=parse_bytes,
        default=parse_bytes(max_bytes),
        help=f"largest size (default {max_bytes})",
    )
    p.add_argument(
        "--step-factor",
        type=int,
        default=4,
        help="size multiplier between steps (default 4)",
    )


def add_init_backend_argument(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--init-backend",
        default="cpu:gloo,cuda:nccl",
        help="backend of the default process group (default cpu:gloo,cuda:nccl)",
    )


def check_sizes(p: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Check the add_size_arguments flags; set args.sizes to the sweep they give."""
    if args.min_bytes < ELEM or args.min_bytes % ELEM or args.max_bytes % ELEM:
        p.error(f"--min-bytes and --max-bytes must be positive multiples of {ELEM}")
    if args.max_bytes < args.min_bytes:
        p.error("--max-bytes is smaller than --min-bytes")
    if args.step_factor < 2:
        p.error("need --step-factor >= 2")
    args.sizes = size_sweep(args.min_bytes, args.max_bytes, args.step_factor)


# torch's FakeProcessGroup: communicates nothing and completes every op at once, so its host time
# per call is torch.distributed's own floor; its results are never checked.
FLOOR_BACKEND = "fake"


def import_core(backends: list[str]):
    """Import torch_nccl_core (registers the "nccl_core" backend); None if absent and unneeded.

    Also registers torch's "fake" backend when `backends` names it.
    """
    if FLOOR_BACKEND in backends:
        import torch.testing._internal.distributed.fake_pg  # noqa: F401
    try:
        import torch_nccl_core
    except ImportError as e:
        if "nccl_core" in backends:
            raise SystemExit(
                f"--backends names nccl_core but torch_nccl_core cannot be imported: {e}"
            ) from e
        return None
    return torch_nccl_core


def noop_nccl(core):
    """The package's fake NCCL, whose calls enqueue nothing: nccl_core groups of new_groups(args,
    noop) call it, which tells their host time per call from NCCL's. Keep it alive until the last
    of them is destroyed."""
    if core is None:
        raise SystemExit("--noop-nccl needs torch_nccl_core")
    try:
        import torch_nccl_core._testing
    except ImportError:
        raise SystemExit(
            "--noop-nccl needs the extension built with TORCH_NCCL_CORE_TESTING=1"
        ) from None
    return torch_nccl_core._testing.FakeNccl(real_cuda=True)


def init_distributed(args) -> tuple[torch.device, Callable[[], None]]:
    """Initialise the default group; return this rank's device and its synchronize()."""
    if not torch.cuda.is_available():
        dist.init_process_group("gloo")
        return torch.device("cpu"), lambda: None
    # Ranks may outnumber GPUs (python -m torch_nccl_core.launch): they share them then.
    device = torch.device(
        "cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    )
    torch.cuda.set_device(device)
    bind = {} if args.init_backend == "gloo" else {"device_id": device}
    dist.init_process_group(args.init_backend, **bind)
    return device, torch.cuda.synchronize


def new_groups(args, noop=None) -> dict[str, dist.ProcessGroup]:
    """One group per backend of --backends, by label (args.backend_labels); nccl_core's on the
    `noop` fake where one is given."""

    def options(backend: str):
        if noop is None or backend != "nccl_core":
            return None
        import torch_nccl_core

        injected = torch_nccl_core.Options()
        noop.inject(injected)
        return injected

    pairs = zip(args.backend_labels, args.backends, strict=True)
    return {
        label: dist.new_group(backend=backend, pg_options=options(backend))
        for label, backend in pairs
    }


def finish() -> None:
    """Wait for every rank (rank 0 may still be writing), then end the default group."""
    rank_max(0.0)
    dist.destroy_process_group()


def run_one_backend(args, measure, name: str, title: str, about: str = "") -> None:
    """The body of a driver that measures the one backend of --backends: set up (the default group
    of --init-backend, a group of that backend), rows = measure(args, group, device, sync), rank 0
    writes OUT/name.csv and OUT/name.md (`about`: a line of what was run), tear down."""
    core = import_core(args.backends)
    device, sync = init_distributed(args)
    (group,) = new_groups(args).values()
    rows = measure(args, group, device, sync)
    if dist.get_rank() == 0:
        head = environment_lines(device, dist.get_world_size(), core)
        head.append(f"- backend {args.backends[0]}{'; ' + about if about else ''}")
        write_rows(args.out, name, title, head, rows)
    dist.barrier(group=group)  # every rank's work on the group is done before it goes
    dist.destroy_process_group(group)
    finish()
