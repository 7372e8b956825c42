"""The flight recorder's dumps against torch's own analyzer (torch.distributed.flight_recorder).

A recorder of its own (`torch_nccl_core._testing.FlightRecorder`) is fed the ops two ranks
issued, as the backend feeds the process's recorder; each dump is written where torch's dump
would go, and torch's analyzer must find what a user looks for: the collective one rank never
joined, and which rank that was.
"""

from __future__ import annotations

import pickle

import pytest
import torch

import torch_nccl_core
from torch_nccl_core import _C

testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


NAME, DESC = "0", "default_pg"


def recorder_of(rank: int, ops: int, finished: int) -> testing.FlightRecorder:
    """`ops` synchronous all_reduces of one rank, the first `finished` of them done."""
    recorder = testing.FlightRecorder(64)
    group = recorder.add_group(NAME, [0, 1])
    tensor = torch.ones(4, 8)
    for seq in range(1, ops + 1):
        recorder.record(
            group, DESC, "allreduce", seq, True, rank, inputs=[tensor], outputs=[tensor]
        )
    recorder.sync_ops_finished_before(group, finished + 1)
    return recorder


def test_dump_has_torchs_format_and_states():
    recorder = testing.FlightRecorder(64)
    group = recorder.add_group(NAME, [0, 1])
    tensor = torch.ones(3, 2, dtype=torch.bfloat16)
    sync_id = recorder.record(
        group, DESC, "allreduce", 1, True, 0, inputs=[tensor], outputs=[tensor]
    )
    send_id = recorder.record(group, DESC, "send", 2, False, 0, peer=1, inputs=[tensor])
    async_id = recorder.record(group, DESC, "allgather_into_tensor", 3, False, 0, outputs=[tensor])
    recorder.sync_ops_finished_before(group, 2)
    recorder.complete(send_id)
    dump = pickle.loads(recorder.dump())
    assert dump["version"] == "2.10"
    assert dump["pg_config"][NAME] == {"name": NAME, "desc": DESC, "ranks": "[0, 1]"}
    entries = dump["entries"]
    assert [e["record_id"] for e in entries] == [sync_id, send_id, async_id]
    assert [e["profiling_name"] for e in entries] == [
        "nccl:all_reduce",
        "nccl:send 0->1",
        "nccl:_all_gather_base",
    ]
    # torch numbers collectives and point-to-point ops apart.
    assert [(e["collective_seq_id"], e["p2p_seq_id"], e["op_id"]) for e in entries] == [
        (1, 0, 1),
        (1, 1, 2),
        (2, 1, 3),
    ]
    assert [e["state"] for e in entries] == ["completed", "completed", "scheduled"]
    assert [e["is_p2p"] for e in entries] == [False, True, False]
    assert entries[0]["input_sizes"] == [[3, 2]] and entries[0]["input_dtypes"] == ["BFloat16"]
    assert entries[1]["output_sizes"] == [] and entries[2]["output_sizes"] == [[3, 2]]
    assert entries[0]["process_group"] == (NAME, DESC)
    active = pickle.loads(recorder.dump(only_active=True))["entries"]
    assert [e["record_id"] for e in active] == [async_id]


def test_ring_keeps_the_newest_entries_in_order():
    recorder = testing.FlightRecorder(3)
    group = recorder.add_group(NAME, [0])
    ids = [recorder.record(group, DESC, "barrier", seq, False, 0) for seq in range(1, 6)]
    recorder.complete(ids[0])  # overwritten since: ignored
    recorder.complete(ids[3])
    entries = pickle.loads(recorder.dump())["entries"]
    assert [e["record_id"] for e in entries] == ids[2:]
    assert [e["state"] for e in entries] == ["scheduled", "completed", "scheduled"]


def test_torchs_analyzer_names_the_collective_a_rank_skipped(tmp_path):
    """Rank 1 skipped the 5th all_reduce: rank 0's is stuck, rank 1 finished its 4."""
    from torch.distributed.flight_recorder.components.builder import build_db
    from torch.distributed.flight_recorder.components.config_manager import JobConfig
    from torch.distributed.flight_recorder.components.loader import read_dir

    for rank, recorder in enumerate([recorder_of(0, 5, 4), recorder_of(1, 4, 4)]):
        (tmp_path / f"nccl_trace_rank_{rank}").write_bytes(recorder.dump())
    args = JobConfig().parse_args([str(tmp_path), "--prefix", "nccl_trace_rank_"])
    details, version = read_dir(args)
    db = build_db(details, args, version)
    flagged = [(c.collective_seq_id, c.missing_ranks) for c in db.collectives if c.missing_ranks]
    assert flagged == [(5, {1})]


def test_a_group_remade_under_its_name_starts_afresh():
    """Re-init after a failure reuses torch's group names: the new group's ops are its own."""
    recorder = testing.FlightRecorder(64)
    old = recorder.add_group(NAME, [0, 1])
    for seq in range(1, 4):
        recorder.record(old, DESC, "allreduce", seq, True, 0)
    recorder.sync_ops_finished_before(old, 4)
    new = recorder.add_group(NAME, [0, 1])
    recorder.record(new, DESC, "allreduce", 1, True, 0)
    entries = pickle.loads(recorder.dump())["entries"]
    assert [(e["collective_seq_id"], e["state"]) for e in entries] == [
        (1, "completed"),
        (2, "completed"),
        (3, "completed"),
        (1, "scheduled"),
    ]


def test_an_empty_or_disabled_recorder_dumps_a_valid_trace():
    for capacity in (0, 8):
        dump = pickle.loads(testing.FlightRecorder(capacity).dump())
        assert dump["entries"] == [] and dump["version"] == "2.10"


def test_timeline_reports_which_synchronous_ops_finished():
    timeline = testing.SyncOpTimeline(span_ms=10.0)
    for seq in (1, 2, 3):
        timeline.note(seq, now_ms=float(seq))  # one span
    timeline.complete_through(2)
    assert timeline.oldest(now_ms=4.0) is not None
    assert timeline.finished_before() == 1  # the span's event waits for op 3
    timeline.complete_through(3)
    assert timeline.oldest(now_ms=5.0) is None
    assert timeline.finished_before() == 4


def test_process_recorder_is_on_until_torch_records_groups_itself():
    torch_records = tuple(int(v) for v in torch.__version__.split(".")[:2]) >= (2, 15)
    assert _C.flight_recorder_enabled() is not torch_records
    dump = pickle.loads(torch_nccl_core.dump_flight_recorder())
    assert dump["version"] == "2.10" and isinstance(dump["entries"], list)
