"""The soak's orchestrator (tests/gpu/soak_world.py) with CPU stand-ins for its workers: every
kill but one in the last cycle is answered by a standby started ahead of it, and no standby is
started for nothing."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "gpu"))
import soak_world as soak  # noqa: E402


@pytest.fixture
def stand_in_workers(monkeypatch, tmp_path):
    """Runs tests/cpu/soak_stand_in_worker.py, with the real worker's command line, wherever
    the soak would start a worker; yields {pid: (label, time started)} of every process the
    soak started (the same clock for every process: CLOCK_MONOTONIC) and a function that reads
    the stand-ins' records."""
    folder = tmp_path / "records"
    folder.mkdir()
    monkeypatch.setenv("STAND_IN_RECORDS", str(folder))
    command, start = soak.Soak.worker_command, soak.Soak.start_process
    started: dict[int, tuple[str, float]] = {}

    def stand_in_command(self, rank, start_args):
        real = command(self, rank, start_args)
        return [real[0], str(HERE / "soak_stand_in_worker.py"), *real[2:]]

    def timed_start(self, rank, start_args, label):
        process = start(self, rank, start_args, label)
        started[process.pid] = (label, time.monotonic())
        return process

    monkeypatch.setattr(soak.Soak, "worker_command", stand_in_command)
    monkeypatch.setattr(soak.Soak, "start_process", timed_start)
    return started, lambda: [
        {**json.loads(path.read_text()), "pid": int(path.stem)} for path in folder.iterdir()
    ]


# (seed, cycles): kills at 2, 4, 8, 9, 10 (in a row); kills at 2, 9 and 11, the last cycle.
@pytest.mark.parametrize(("seed", "cycles"), [(3, 12), (4, 12)])
def test_every_kill_is_answered_by_a_standby_started_ahead(
    stand_in_workers, tmp_path, seed, cycles
):
    started, read_records = stand_in_workers
    out = tmp_path / "report.json"
    args = soak.parse_args(
        ["--cycles", str(cycles), "--seed", str(seed), "--world", "3", "--out", str(out)]
    )
    kinds = [soak.plan_cycle(seed, c, args.warmup, 3).fault.kind for c in range(cycles)]
    kills = kinds.count("kill")
    answered = kills - (kinds[-1] == "kill")  # a kill in the last cycle has no successor
    assert soak.orchestrate(args) == 0, out.read_text()
    report = json.loads(out.read_text())
    assert report["cycles_run"] == cycles and report["faults"]["kill"] == kills
    assert report["respawns"] == answered
    # A standby per answered kill, none for nothing, every one of them took over.
    assert sum(label == "standby" for label, _ in started.values()) == answered, started
    records = read_records()
    standbys = [r for r in records if r["standby"]]
    assert len(standbys) == answered and all("took_over" in r for r in standbys), records
    # Each was started before the kill it answered: the last kill before it took over.
    kill_times = sorted(r["killed"] for r in records if "killed" in r)
    assert len(kill_times) == kills
    for standby in standbys:
        answered_kill = max(t for t in kill_times if t <= standby["took_over"])
        assert started[standby["pid"]][1] < answered_kill, (standby, kill_times)
