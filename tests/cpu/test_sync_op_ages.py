"""The watchdog's bound on synchronous ops (backend/runtime/sync_ops.h), run against a simulated
GPU.

Synchronous ops share one CUDA event per span of ops, so the watchdog sees a lower bound of how
long the oldest unfinished op has been unfinished. These tests check that bound against the truth
of a simulated GPU that runs ops in order: never above it (so no healthy op is ever called stuck,
whatever the queue's depth), and never more than one span below it (so a stuck op is reported at
most one span after its timeout).
"""

from __future__ import annotations

import random

import pytest

_testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


POLL_MS = 50.0  # the watchdog's poll interval


def _simulate(rng: random.Random, span_ms: float, ops: int, stall_at: int | None = None):
    """Ops issued by a host that may run far ahead, run in order by a GPU; yields, at every poll,
    (reported, truth): the timeline's answer and the oldest unfinished op's (seq, age)."""
    timeline = _testing.SyncOpTimeline(span_ms)
    issue, end = [], []
    now = gpu_free = 0.0
    for seq in range(1, ops + 1):
        now += rng.choice([0.01, 0.1, 1.0, 5.0, rng.uniform(0, 300)])  # bursts and idle gaps
        issue.append(now)
        start = max(now, gpu_free)
        duration = rng.choice([0.05, 1.0, rng.uniform(0, 200)])
        gpu_free = float("inf") if stall_at is not None and seq >= stall_at else start + duration
        end.append(gpu_free)
    polls = [POLL_MS * k for k in range(int((issue[-1] + 2_000) / POLL_MS))]
    noted = 0
    for poll in polls:
        while noted < ops and issue[noted] <= poll:
            timeline.note(noted + 1, issue[noted])
            noted += 1
        done = sum(1 for i in range(noted) if end[i] <= poll)  # in order: a prefix
        timeline.complete_through(done)
        truth = (done + 1, poll - issue[done]) if done < noted else None
        yield poll, timeline.oldest(poll), truth, timeline


@pytest.mark.parametrize("seed", range(40))
def test_reported_age_is_a_lower_bound_within_one_span(seed):
    rng = random.Random(seed)
    span_ms = rng.choice([5.0, 50.0, 250.0, 1000.0])
    stall_at = rng.choice([None, rng.randrange(1, 300)])
    for poll, reported, truth, _ in _simulate(rng, span_ms, 300, stall_at):
        if truth is None:
            assert reported is None, (poll, reported)
            continue
        assert reported is not None, (poll, truth)
        _, true_age = truth
        _, age = reported
        assert age <= true_age + 1e-6, (poll, reported, truth)  # never too old: no false abort
        assert age >= true_age - span_ms - 1e-6, (poll, reported, truth)  # at most a span late


def test_deep_healthy_queue_is_never_old():
    """1 op per ms for a minute, the GPU 40 ms behind: the oldest op is never reported older
    than the GPU's lag, though the queue never drains (one shared event would say 60 s)."""
    timeline = _testing.SyncOpTimeline(250.0)
    worst = 0.0
    for ms in range(1, 60_001):
        timeline.note(ms, float(ms))
        timeline.complete_through(max(0, ms - 40))
        if ms % 50 == 0:
            found = timeline.oldest(float(ms))
            worst = max(worst, found[1] if found else 0.0)
    assert worst <= 40.0
    assert timeline.span_count() <= 2  # finished spans are dropped


def test_stuck_op_is_reported_within_timeout_plus_one_span():
    timeout_ms, span_ms = 3_000.0, 750.0
    timeline = _testing.SyncOpTimeline(span_ms)
    for ms in range(1, 10_001):  # an op per ms; op 2000 never finishes, the host goes on
        timeline.note(ms, float(ms))
        timeline.complete_through(min(ms - 1, 1_999))
    reported_at = None
    for poll in range(2_000, 20_000, 50):
        found = timeline.oldest(float(poll))
        assert found is not None and found[0] <= 2_000
        if found[1] > timeout_ms:
            reported_at = poll
            break
    assert reported_at is not None
    assert 2_000 + timeout_ms < reported_at <= 2_000 + timeout_ms + span_ms + 50
