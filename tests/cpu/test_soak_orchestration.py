"""The soak's orchestrator (tests/gpu/soak_world.py) with CPU stand-ins for its workers: kills
are answered by standbys started ahead, every planned kill gets a successor, and the run ends
clean with no process left behind."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gpu"))
import soak_world as soak  # noqa: E402


@pytest.fixture
def stand_in_workers(monkeypatch):
    """Runs tests/cpu/soak_stand_in_worker.py, with the real worker's command line, wherever
    the soak would start a worker; yields the processes started."""
    started: list[subprocess.Popen] = []
    command, start = soak.Soak.worker_command, soak.Soak.start_process

    def stand_in_command(self, rank, start_args):
        real = command(self, rank, start_args)
        return [real[0], str(HERE / "soak_stand_in_worker.py"), *real[2:]]

    def recorded_start(self, rank, start_args, label):
        started.append(start(self, rank, start_args, label))
        return started[-1]

    monkeypatch.setattr(soak.Soak, "worker_command", stand_in_command)
    monkeypatch.setattr(soak.Soak, "start_process", recorded_start)
    yield started
    for process in started:
        process.kill()
        process.wait()


def test_every_kill_is_answered_by_a_standby(stand_in_workers, tmp_path):
    out = tmp_path / "report.json"
    args = soak.parse_args(["--cycles", "24", "--seed", "3", "--world", "3", "--out", str(out)])
    kills = sum(soak.plan_cycle(3, c, args.warmup, 3).fault.kind == "kill" for c in range(24))
    assert soak.orchestrate(args) == 0, out.read_text()
    report = json.loads(out.read_text())
    assert report["cycles_run"] == 24 and report["faults"]["kill"] == kills > 1
    assert report["respawns"] == kills
    standbys = [p for p in stand_in_workers if "--standby" in p.args]
    # One standby per kill, each started ahead of it; none is left once no kill is planned.
    assert len(standbys) == kills
    assert all(p.poll() is not None for p in stand_in_workers)
