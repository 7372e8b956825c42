"""torchrun for ranks that share GPUs: ``python -m torch_nccl_core.launch``.

Runs a multi-rank program on fewer GPUs than ranks, e.g. a 4-rank job on one GPU::

    python -m torch_nccl_core.launch --mps --nproc-per-node=4 train.py --epochs 1
    python -m torch_nccl_core.launch --mps --nproc-per-node=2 -m pytest tests/gpu -q

Every other argument is torchrun's (``--mps`` comes first). NCCL refuses two ranks of one
communicator on one GPU of one host ("Duplicate GPU detected"), so where ranks share a GPU each
rank claims a host of its own through ``NCCL_HOSTID``, set before NCCL starts in that process:
NCCL then connects the ranks as it connects nodes without InfiniBand, through its socket transport
over loopback. A rank's program must choose its device as
``LOCAL_RANK % torch.cuda.device_count()``.

``--mps`` runs the job under a CUDA MPS daemon of its own (started before the ranks, stopped after
them), so that the ranks' kernels run side by side instead of taking turns on the GPU: a small
all_reduce then costs tens of microseconds instead of milliseconds.

What such a world cannot show: anything that needs peers reachable by load/store (NVLink or PCIe
P2P: window peer pointers, the copy engine, the one-shot kernel, NCCL's symmetric kernels) and any
bandwidth or latency figure of a real interconnect.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator, Sequence
from typing import NamedTuple

from ._as_rank import HOST_ID_PREFIX_VAR

MPS_QUIT_S = 30

# Run by path, not as a module of this package: a rank's first step imports nothing heavy.
_AS_RANK = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_as_rank.py")


def ranks_share_gpus(nproc_per_node: int, gpus: int) -> bool:
    """Whether a node of `nproc_per_node` ranks puts two of them on one of its `gpus` GPUs."""
    return gpus > 0 and nproc_per_node > gpus


_UUID_PREFIXES = ("GPU-", "MIG-")
_EXPECTED = "GPU indices (0, 1, ...) or UUIDs (GPU-..., MIG-...: nvidia-smi -L), comma-separated"


class _Gpu(NamedTuple):
    uuid: str
    mig: bool
    model: str


def _nvidia_smi_gpus() -> dict[str, _Gpu]:
    """nvidia-smi's GPUs by index (PCI bus order)."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        raise RuntimeError(
            "--mps: CUDA_VISIBLE_DEVICES names GPUs by index and nvidia-smi, which gives their "
            "UUIDs for MPS, is not on PATH; name them by UUID (nvidia-smi -L)"
        )
    query = [smi, "--query-gpu=index,uuid,mig.mode.current,name", "--format=csv,noheader"]
    listing = subprocess.run(query, capture_output=True, text=True, check=False)
    rows = re.findall(r"^(\d+), (\S+), ([^,\n]*), (.*)$", listing.stdout, re.MULTILINE)
    if listing.returncode != 0 or not rows:
        raise RuntimeError(
            f"--mps: `{' '.join(query)}` gave no GPU (exit {listing.returncode}: "
            f"{(listing.stderr or listing.stdout).strip()[:300]!r}); expected lines "
            "'index, uuid, MIG mode, name'. Name the GPUs by UUID instead (nvidia-smi -L)"
        )
    return {index: _Gpu(uuid, mig == "Enabled", model) for index, uuid, mig, model in rows}


def _as_uuids(visible_devices: str) -> str:
    """CUDA_VISIBLE_DEVICES with each GPU index replaced by that GPU's UUID. nvidia-smi numbers
    GPUs in PCI bus order, as CUDA does with CUDA_DEVICE_ORDER=PCI_BUS_ID; by default CUDA puts
    the fastest first (the rest unspecified), which among GPUs of one model is that order in
    practice, so indices on a machine of several models need CUDA_DEVICE_ORDER=PCI_BUS_ID."""
    entries = [e.strip() for e in visible_devices.split(",")]
    if not visible_devices.strip():
        raise ValueError(
            "--mps: CUDA_VISIBLE_DEVICES is empty, which hides every GPU; the MPS daemon needs "
            f"at least one: give {_EXPECTED}"
        )
    odd = [e for e in entries if not (e.isdigit() or e.startswith(_UUID_PREFIXES))]
    if odd:
        raise ValueError(
            f"--mps: CUDA_VISIBLE_DEVICES={visible_devices!r} holds {odd}; expected {_EXPECTED}"
        )
    indices = [e for e in entries if e.isdigit()]
    if not indices:
        return ",".join(entries)
    gpus = _nvidia_smi_gpus()
    unknown = [e for e in indices if e not in gpus]
    if unknown:
        raise ValueError(
            f"--mps: CUDA_VISIBLE_DEVICES={visible_devices!r} names GPUs {unknown} that "
            f"nvidia-smi does not list (it lists {sorted(gpus, key=int)})"
        )
    mig = [e for e in indices if gpus[e].mig]
    if mig:
        raise ValueError(
            f"--mps: GPUs {mig} of CUDA_VISIBLE_DEVICES have MIG enabled: name their MIG "
            "instances by UUID (MIG-..., nvidia-smi -L)"
        )
    models = sorted({gpu.model for gpu in gpus.values()})
    if len(models) > 1 and os.environ.get("CUDA_DEVICE_ORDER") != "PCI_BUS_ID":
        raise ValueError(
            f"--mps: CUDA_VISIBLE_DEVICES={visible_devices!r} names GPUs by index on a machine "
            f"of several GPU models ({', '.join(models)}), where CUDA's default order need not "
            "be nvidia-smi's: set CUDA_DEVICE_ORDER=PCI_BUS_ID or name them by UUID "
            "(nvidia-smi -L)"
        )
    return ",".join(gpus[e].uuid if e.isdigit() else e for e in entries)


@contextlib.contextmanager
def mps_daemon() -> Iterator[None]:
    """A CUDA MPS control daemon of this job's own, whose clients this process and what it starts
    meanwhile are: their environment is set for it, and restored after.

    A user-space daemon of the CUDA driver: it changes no GPU setting, and ``quit`` (once every
    client has gone) leaves the GPU as it was. ``CUDA_VISIBLE_DEVICES`` chooses the daemon's GPUs;
    daemon and clients get them by UUID, as NVIDIA's MPS guide recommends ("CUDA_VISIBLE_DEVICES"):
    the server numbers its GPUs from 0, so a client's indices would name other devices or none,
    and a client without the variable would count every GPU of the machine through NVML
    (``torch.cuda.device_count()`` before CUDA starts) while CUDA shows it the daemon's only.
    """
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise RuntimeError("--mps: nvidia-cuda-mps-control is not on PATH (CUDA MPS is needed)")
    devices = {}
    if "CUDA_VISIBLE_DEVICES" in os.environ:
        devices["CUDA_VISIBLE_DEVICES"] = _as_uuids(os.environ["CUDA_VISIBLE_DEVICES"])
    root = tempfile.mkdtemp(prefix="nccl_core_mps_")
    env = {
        "CUDA_MPS_PIPE_DIRECTORY": os.path.join(root, "pipe"),
        "CUDA_MPS_LOG_DIRECTORY": os.path.join(root, "log"),
    }
    for folder in env.values():
        os.makedirs(folder)
    env.update(devices)
    daemon_env = {**os.environ, **env}
    subprocess.run([control, "-d"], env=daemon_env, check=True)
    clients = daemon_env
    saved = dict(os.environ)
    os.environ.clear()
    os.environ.update(clients)
    try:
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)
        try:
            # quit waits for the daemon's clients: a rank's child that outlived it holds it up.
            subprocess.run(
                [control], input=b"quit\n", env=daemon_env, check=False, timeout=MPS_QUIT_S
            )
        except subprocess.TimeoutExpired:
            print(
                f"torch_nccl_core.launch: the MPS daemon did not quit within {MPS_QUIT_S} s "
                "(a client is still running); stop it with `echo quit | "
                f"CUDA_MPS_PIPE_DIRECTORY={env['CUDA_MPS_PIPE_DIRECTORY']} {control}`. "
                f"Its log, which names its clients' pids:\n{_log_tail(env)}",
                file=sys.stderr,
            )
        else:
            shutil.rmtree(root, ignore_errors=True)


def _log_tail(env: dict[str, str], lines: int = 20) -> str:
    try:
        with open(os.path.join(env["CUDA_MPS_LOG_DIRECTORY"], "control.log")) as log:
            return "".join(log.readlines()[-lines:])
    except OSError as error:
        return f"(unreadable: {error})"


def _parse(argv: Sequence[str]) -> tuple[bool, list[str]]:
    """(--mps given, torchrun's arguments). --mps comes first: everything after it is
    torchrun's, the program's arguments included."""
    if argv[:1] == ["--mps"]:
        return True, list(argv[1:])
    return False, list(argv)


def _torchrun_args(rest: list[str]) -> argparse.Namespace:
    from torch.distributed.run import get_args_parser

    args = get_args_parser().parse_args(rest)
    if args.no_python:
        raise ValueError("--no-python is not supported: ranks start as Python programs here")
    # Each rank starts as `python _as_rank.py [-m] PROGRAM ARGS`, which sets its host id and
    # then becomes the program.
    program = ["-m"] if args.module else []
    args.training_script_args = [
        _AS_RANK,
        *program,
        args.training_script,
        *args.training_script_args,
    ]
    args.training_script = os.environ.get("PYTHON_EXEC", sys.executable)  # as torchrun
    args.module = False
    args.no_python = True
    return args


def _gpu_count() -> int:
    import torch

    return torch.cuda.device_count()


def _nproc_per_node(args: argparse.Namespace) -> int:
    value = str(args.nproc_per_node)
    if value.isdigit():
        return int(value)
    raise ValueError(f"--nproc-per-node must be a number of ranks here, got {value!r}")


def launch(argv: Sequence[str]) -> int:
    mps, rest = _parse(argv)
    args = _torchrun_args(rest)
    if ranks_share_gpus(_nproc_per_node(args), _gpu_count()):
        os.environ[HOST_ID_PREFIX_VAR] = f"{socket.gethostname()}-{uuid.uuid4().hex[:8]}"
    else:
        os.environ.pop(HOST_ID_PREFIX_VAR, None)  # one inherited from an outer launch
    from torch.distributed.run import run

    with mps_daemon() if mps else contextlib.nullcontext():
        try:
            run(args)
        except Exception as failed:  # torchrun's ChildFailedError has printed its report
            print(f"torch_nccl_core.launch: {type(failed).__name__}", file=sys.stderr)
            return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    return launch(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
