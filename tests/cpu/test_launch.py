"""torch_nccl_core.launch: torchrun for ranks that share GPUs (each rank a host of its own for
NCCL, CUDA MPS on request). Run here with the GPU count faked: no GPU is needed to see what each
rank's process is given."""

from __future__ import annotations

import json
import os
import pathlib
import sys

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
printf '0, GPU-aaaa\\n1, GPU-bbbb\\n2, GPU-cccc\\n3, GPU-dddd\\n'
"""


def _stand_ins(tmp_path, monkeypatch, *, smi: bool = True):
    tools = {"nvidia-cuda-mps-control": FAKE_MPS_CONTROL}
    if smi:
        tools["nvidia-smi"] = FAKE_NVIDIA_SMI
    for name, text in tools.items():
        (tmp_path / name).write_text(text)
        (tmp_path / name).chmod(0o755)
    record = tmp_path / "daemon_devices"
    monkeypatch.setenv("PATH", f"{tmp_path}{os.pathsep}/usr/bin{os.pathsep}/bin")
    monkeypatch.setenv("FAKE_MPS_RECORD", str(record))
    monkeypatch.delenv("CUDA_MPS_PIPE_DIRECTORY", raising=False)
    return record


def test_the_daemon_and_its_clients_get_cuda_visible_devices_by_uuid(tmp_path, monkeypatch):
    """MPS renumbers the daemon's GPUs from 0 for its clients: a client that kept
    CUDA_VISIBLE_DEVICES=3 found no GPU, and one without it counted all 4 GPUs through NVML
    (torch.cuda.device_count()) while CUDA showed it one (both seen on a 4-GPU machine)."""
    record = _stand_ins(tmp_path, monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,1")
    with launch.mps_daemon():
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-dddd,GPU-bbbb"
        pipe = os.environ["CUDA_MPS_PIPE_DIRECTORY"]
        assert os.path.isdir(pipe)
    assert record.read_text().strip() == "GPU-dddd,GPU-bbbb"
    assert os.environ["CUDA_VISIBLE_DEVICES"] == "3,1"  # restored
    assert "CUDA_MPS_PIPE_DIRECTORY" not in os.environ
    assert not os.path.exists(pipe)  # the daemon quit: its folder is gone


def test_the_daemon_without_cuda_visible_devices_leaves_it_unset(tmp_path, monkeypatch):
    record = _stand_ins(tmp_path, monkeypatch)
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    with launch.mps_daemon():
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
    assert record.read_text().strip() == "unset"


def test_gpu_indices_without_nvidia_smi_or_unknown_are_refused_before_the_daemon(
    tmp_path, monkeypatch
):
    record = _stand_ins(tmp_path, monkeypatch, smi=False)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    with pytest.raises(RuntimeError, match="nvidia-smi"):
        with launch.mps_daemon():
            pass
    _stand_ins(tmp_path, monkeypatch)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "7")
    with pytest.raises(ValueError, match=r"names GPUs \['7'\]"):
        with launch.mps_daemon():
            pass
    assert not record.exists()
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-cccc")  # UUIDs pass as they are
    with launch.mps_daemon():
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "GPU-cccc"
