"""torch_nccl_core.launch: torchrun for ranks that share GPUs (each rank a host of its own for
NCCL, CUDA MPS on request). Run here with the GPU count faked: no GPU is needed to see what each
rank's process is given."""

from __future__ import annotations

import json
import os
import pathlib
import sys
import tempfile

import pytest

from torch_nccl_core import launch

RANK_SCRIPT = """
import json, os, sys
with open(os.path.join(sys.argv[1], f"rank{os.environ['RANK']}.json"), "w") as out:
    json.dump({"host_id": os.environ.get("NCCL_HOSTID"), "argv": sys.argv[2:]}, out)
"""


def _ranks(folder: pathlib.Path, count: int) -> list[dict]:
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(count)]


@pytest.fixture(autouse=True)
def _no_host_ids(monkeypatch):
    """The launcher sets the node's host-id prefix in its own environment, for its ranks."""
    monkeypatch.delenv(launch.HOST_ID_PREFIX_VAR, raising=False)
    monkeypatch.delenv("NCCL_HOSTID", raising=False)


@pytest.fixture
def script(tmp_path: pathlib.Path) -> pathlib.Path:
    path = tmp_path / "show_rank.py"
    path.write_text(RANK_SCRIPT)
    return path


def test_ranks_that_share_a_gpu_each_get_a_host_id(tmp_path, script, monkeypatch):
    monkeypatch.setattr(launch, "_gpu_count", lambda: 1)
    argv = [str(script), str(tmp_path), "-x", "--mps"]  # the program's, --mps too
    rc = launch.main(["--standalone", "--nproc-per-node=2", *argv])
    ranks = _ranks(tmp_path, 2)
    assert rc == 0
    assert [r["argv"] for r in ranks] == [["-x", "--mps"]] * 2
    ids = [r["host_id"] for r in ranks]
    assert ids[0].endswith("-r0") and ids[1].endswith("-r1")
    assert ids[0][:-3] == ids[1][:-3]  # one node: one prefix


def test_a_rank_per_gpu_keeps_nccls_own_host_ids(tmp_path, script, monkeypatch):
    monkeypatch.setattr(launch, "_gpu_count", lambda: 2)
    rc = launch.main(["--standalone", "--nproc-per-node=2", str(script), str(tmp_path)])
    assert rc == 0
    assert [r["host_id"] for r in _ranks(tmp_path, 2)] == [None, None]


def test_a_module_runs_as_with_torchrun(tmp_path, script, monkeypatch):
    monkeypatch.setattr(launch, "_gpu_count", lambda: 1)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(script.parent), *sys.path]))
    rc = launch.main(["--standalone", "--nproc-per-node=2", "-m", script.stem, str(tmp_path)])
    assert rc == 0
    assert all(r["host_id"] for r in _ranks(tmp_path, 2))


def test_refuses_what_it_cannot_do(script, monkeypatch):
    monkeypatch.setattr(launch, "_gpu_count", lambda: 1)
    with pytest.raises(ValueError, match="--no-python"):
        launch.main(["--nproc-per-node=2", "--no-python", "true"])
    with pytest.raises(ValueError, match="--nproc-per-node must be a number"):
        launch.main(["--nproc-per-node=gpu", str(script)])
    monkeypatch.setenv("PATH", "")
    with pytest.raises(RuntimeError, match="nvidia-cuda-mps-control"):
        launch.main(["--mps", "--standalone", "--nproc-per-node=2", str(script)])


def test_shares_gpus_only_past_one_rank_per_gpu():
    assert not launch.ranks_share_gpus(2, 2)
    assert launch.ranks_share_gpus(3, 2)
    assert not launch.ranks_share_gpus(4, 0)  # no GPU: nothing to share


FAKE_MPS_CONTROL = """#!/bin/sh
# nvidia-cuda-mps-control's stand-in: records what the daemon was started with; quits at once.
[ "$1" = -d ] && echo "${CUDA_VISIBLE_DEVICES:-unset}" >"$FAKE_MPS_RECORD"
exit 0
"""


FAKE_NVIDIA_SMI = """#!/bin/sh
# nvidia-smi's stand-in: its --query-gpu=index,uuid,mig.mode.current,name answer.
[ -n "$FAKE_SMI_FAILS" ] && { echo "Failed to initialize NVML: Driver/library mismatch"; exit 9; }
printf '0, GPU-aaaa, Disabled, NVIDIA H200\\n1, GPU-bbbb, Disabled, NVIDIA H200\\n'
printf "2, GPU-cccc, Enabled, NVIDIA H200\\n3, GPU-dddd, [N/A], ${FAKE_SMI_MODEL:-NVIDIA H200}\\n"
"""


def _stand_ins(tmp_path, monkeypatch, *, smi: bool = True):
    tools = {"nvidia-cuda-mps-control": FAKE_MPS_CONTROL}
    if smi:
        tools["nvidia-smi"] = FAKE_NVIDIA_SMI
    for name, text in tools.items():
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    record = tmp_path / "daemon_devices"
    monkeypatch.setenv("PATH", str(tmp_path))  # nothing of the machine's own (a real nvidia-smi)
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    for name in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_DEVICE_ORDER", "FAKE_SMI_FAILS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delenv("FAKE_SMI_MODEL", raising=False)
    return record


def test_the_daemon_and_its_clients_get_cuda_visible_devices_by_uuid(tmp_path, monkeypatch):
    """MPS renumbers the daemon's GPUs from 0 for its clients: a client that kept
    CUDA_VISIBLE_DEVICES=3 found no GPU, and one without it counted all 4 GPUs through NVML
    (torch.cuda.device_count()) while CUDA showed it one (both seen on a 4-GPU machine)."""
    record = _stand_ins(tmp_path, monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3, 1,GPU-aaaa")
    with launch.mps_daemon():
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-dddd,GPU-bbbb,GPU-aaaa"
        pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
        assert os.path.isdir(pipe)
    assert record.read_text().strip() == "GPU-dddd,GPU-bbbb,GPU-aaaa"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3, 1,GPU-aaaa"  # restored
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert not os.path.exists(pipe)  # the daemon quit: its folder is gone


def test_the_daemon_without_cuda_visible_devices_leaves_it_unset(tmp_path, monkeypatch):
    record = _stand_ins(tmp_path, monkeypatch, smi=False)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with launch.mps_daemon():
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert record.read_text().strip() == "unset"


@pytest.mark.parametrize(
    ("devices", "setting", "error", "match"),
    [
        ("0", {"smi": False}, RuntimeError, "nvidia-smi, which gives their UUIDs"),
        ("0", {"FAKE_SMI_FAILS": "1"}, RuntimeError, "exit 9: 'Failed to initialize NVML"),
        ("7", {}, ValueError, r"names GPUs \['7'\] that nvidia-smi does not list .*'3'\]"),
        ("", {}, ValueError, "is empty, which hides every GPU"),
        ("0,-1", {}, ValueError, r"holds \['-1'\]; expected GPU indices"),
        ("1,2", {}, ValueError, r"GPUs \['2'\] of CUDA_VISIBLE_DEVICES have MIG enabled"),
        ("0", {"FAKE_SMI_MODEL": "NVIDIA H100"}, ValueError, "CUDA_DEVICE_ORDER=PCI_BUS_ID"),
    ],
)
def test_gpus_the_daemon_cannot_be_given_by_uuid_are_refused_before_it_starts(
    tmp_path, monkeypatch, devices, setting, error, match
):
    record = _stand_ins(tmp_path, monkeypatch, smi=setting.pop("smi", True))
    for name, value in setting.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("TMPDIR", str(tmp_path))  # where a leaked daemon folder would show
    tempfile.tempdir = None
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", devices)
    try:
        with pytest.raises(error, match=match):
            with launch.mps_daemon():
                pass
    finally:
        tempfile.tempdir = None
    assert not record.exists()
    assert not list(tmp_path.glob("nccl_core_mps_*"))


def test_uuids_and_indices_of_one_order_pass(tmp_path, monkeypatch):
    _stand_ins(tmp_path, monkeypatch, smi=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "MIG-eeee")  # UUIDs alone need no nvidia-smi
    with launch.mps_daemon():
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "MIG-eeee"
    _stand_ins(tmp_path, monkeypatch)
    monkeypatch.setenv("FAKE_SMI_MODEL", "NVIDIA H100")
    monkeypatch.setenv("CUDA_DEVICE_ORDER", "PCI_BUS_ID")  # nvidia-smi's order, whatever models
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with launch.mps_daemon():
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-dddd"
