"""What each c10d op asks NCCL (csrc/backend/ops/nccl_calls.h): its calls made on a communicator of
the fake NCCL, which records their arguments (buffers, counts, dtypes, reduce ops, roots, peers,
streams, NCCL groups), with CPU tensors standing for the op's."""

from __future__ import annotations

from datetime import timedelta

import pytest
import torch

testing = pytest.importorskip(
    "torch_nccl_core._testing", reason="built without TORCH_NCCL_CORE_TESTING=1"
)


# nccl.h's enums.
UINT8, FLOAT32, BFLOAT16 = 1, 7, 9
SUM, MAX = 0, 2
START = {"call": "ncclGroupStart"}
END = {"call": "ncclGroupEnd"}
STREAM = 0x5000


def ptr(tensor: torch.Tensor, offset_bytes: int = 0) -> int:
    return tensor.data_ptr() + offset_bytes


def communicator(fake, rank: int):
    """A communicator of 4 ranks of the fake, this process rank `rank`, recording its calls."""
    comm = testing.create_communicator(4, rank, timedelta(seconds=5), True, "group 'g'")
    fake.record()
    return comm


@pytest.fixture(params=[1, 0], ids=["rank1", "rank0"])
def comm(fake, request):
    comm = communicator(fake, request.param)
    yield comm
    testing.abort(comm)


@pytest.fixture
def root(fake):
    comm = communicator(fake, 0)
    yield comm
    testing.abort(comm)


@pytest.fixture
def not_root(fake):
    comm = communicator(fake, 1)
    yield comm
    testing.abort(comm)


def calls(fake, comm, name: str, **args) -> list[dict]:
    """The calls of op `name` with their arguments (a group's bounds with the call alone)."""
    testing.enqueue_op(comm, name, testing.OpArgs(**args), STREAM)
    made = []
    for record in fake.recorded():
        if record["call"] in ("ncclGroupStart", "ncclGroupEnd"):
            made.append({"call": record["call"]})
            continue
        assert record["stream"] == STREAM and record["rank"] == comm.rank
        made.append({k: v for k, v in record.items() if k not in ("stream", "rank")})
    return made


def call(name, buffers, count, dtype, op=-1, peer=-1) -> dict:
    return {
        "call": name,
        "buffers": buffers,
        "count": count,
        "dtype": dtype,
        "op": op,
        "peer": peer,
    }


def test_all_reduce_counts_elements_of_the_tensors_dtype(fake, comm):
    x = torch.zeros(6, dtype=torch.bfloat16)
    made = calls(fake, comm, "allreduce", inputs=[x], op=MAX)
    assert made == [call("ncclAllReduce", [ptr(x), ptr(x)], 6, BFLOAT16, MAX)]


def test_complex_tensors_travel_as_twice_as_many_reals(fake, comm):
    x = torch.zeros(3, dtype=torch.complex64)
    made = calls(fake, comm, "allreduce", inputs=[x], op=SUM)
    assert made == [call("ncclAllReduce", [ptr(x), ptr(x)], 6, FLOAT32, SUM)]


def test_broadcast_and_reduce_name_the_root(fake, comm):
    x = torch.zeros(5, dtype=torch.float32)
    assert calls(fake, comm, "broadcast", inputs=[x], root=3) == [
        call("ncclBroadcast", [ptr(x), ptr(x)], 20, UINT8, peer=3)  # bytes: any dtype
    ]
    assert calls(fake, comm, "reduce", inputs=[x], root=2, op=SUM) == [
        call("ncclReduce", [ptr(x), ptr(x)], 5, FLOAT32, SUM, peer=2)
    ]


def test_coalesced_all_reduce_is_one_group(fake, comm):
    xs = [torch.zeros(n) for n in (1, 2, 3)]
    made = calls(fake, comm, "allreduce_coalesced", inputs=xs, op=SUM)
    body = [call("ncclAllReduce", [ptr(x), ptr(x)], x.numel(), FLOAT32, SUM) for x in xs]
    assert made == [START, *body, END]


def test_all_gather_into_a_tensor_sends_this_ranks_bytes(fake, comm):
    x = torch.zeros(3, dtype=torch.float32)
    out = torch.zeros(12, dtype=torch.float32)
    made = calls(fake, comm, "allgather_into_tensor", outputs=[out], inputs=[x])
    assert made == [call("ncclAllGather", [ptr(x), ptr(out)], 12, UINT8)]


def test_all_gather_into_a_list_broadcasts_from_each_rank(fake, comm):
    x = torch.zeros(2)
    parts = [torch.zeros(2) for _ in range(4)]
    made = calls(fake, comm, "allgather", outputs=parts, inputs=[x])
    body = [
        call("ncclBroadcast", [ptr(x if r == comm.rank else p), ptr(p)], 8, UINT8, peer=r)
        for r, p in enumerate(parts)
    ]
    assert made == [START, *body, END]


def test_coalesced_all_gather_takes_every_ranks_inputs_in_order(fake, comm):
    xs = [torch.zeros(1), torch.zeros(2)]
    lists = [[torch.zeros(1), torch.zeros(2)] for _ in range(4)]
    made = calls(fake, comm, "allgather_coalesced", lists=lists, inputs=xs)
    body = [
        call(
            "ncclBroadcast",
            [ptr(xs[i] if r == comm.rank else lists[r][i]), ptr(lists[r][i])],
            4 * (i + 1),
            UINT8,
            peer=r,
        )
        for r in range(4)
        for i in range(2)
    ]
    assert made == [START, *body, END]
    outs = [torch.zeros(4), torch.zeros(8)]
    made = calls(fake, comm, "allgather_into_tensor_coalesced", outputs=outs, inputs=xs)
    body = [
        call("ncclAllGather", [ptr(x), ptr(o)], 4 * x.numel(), UINT8)
        for x, o in zip(xs, outs, strict=True)
    ]
    assert made == [START, *body, END]


def test_reduce_scatter_counts_the_output(fake, comm):
    x = torch.zeros(8)
    out = torch.zeros(2)
    made = calls(fake, comm, "reduce_scatter_tensor", outputs=[out], inputs=[x], op=SUM)
    assert made == [call("ncclReduceScatter", [ptr(x), ptr(out)], 2, FLOAT32, SUM)]
    outs = [torch.zeros(1), torch.zeros(3)]
    xs = [torch.zeros(4), torch.zeros(12)]
    made = calls(fake, comm, "reduce_scatter_tensor_coalesced", outputs=outs, inputs=xs, op=MAX)
    body = [
        call("ncclReduceScatter", [ptr(x), ptr(o)], o.numel(), FLOAT32, MAX)
        for x, o in zip(xs, outs, strict=True)
    ]
    assert made == [START, *body, END]


def test_reduce_scatter_of_a_list_reduces_part_r_to_rank_r(fake, comm):
    out = torch.zeros(2)
    parts = [torch.zeros(2) for _ in range(4)]
    made = calls(fake, comm, "reduce_scatter", outputs=[out], inputs=parts, op=SUM)
    body = [
        call("ncclReduce", [ptr(p), ptr(out)], 2, FLOAT32, SUM, peer=r) for r, p in enumerate(parts)
    ]
    assert made == [START, *body, END]


def test_send_and_recv_move_bytes_with_the_peer(fake, comm):
    x = torch.zeros(3, dtype=torch.int64)
    assert calls(fake, comm, "send", inputs=[x], peer=2) == [
        call("ncclSend", [ptr(x)], 24, UINT8, peer=2)
    ]
    assert calls(fake, comm, "recv", outputs=[x], peer=3) == [
        call("ncclRecv", [ptr(x)], 24, UINT8, peer=3)
    ]


@pytest.mark.parametrize("to_root", [True, False], ids=["gather", "scatter"])
def test_gather_and_scatter_exchange_with_the_root(fake, comm, to_root):
    mine = torch.arange(3, dtype=torch.float32) + 10 * comm.rank
    root_list = [torch.full((3,), -1.0) for _ in range(4)]
    others = "ncclRecv" if to_root else "ncclSend"
    args = (
        {"outputs": root_list, "inputs": [mine]}
        if to_root
        else {"outputs": [mine], "inputs": root_list}
    )
    if comm.rank != 0:  # not the root: one call with the root, in a group
        args = {"outputs": [], "inputs": [mine]} if to_root else {"outputs": [mine], "inputs": []}
        made = calls(fake, comm, "gather" if to_root else "scatter", root=0, **args)
        mine_call = "ncclSend" if to_root else "ncclRecv"
        assert made == [START, call(mine_call, [ptr(mine)], 12, UINT8, peer=0), END]
        return
    made = calls(fake, comm, "gather" if to_root else "scatter", root=0, **args)
    # The root's own part is a copy, the others one call each.
    body = [call(others, [ptr(t)], 12, UINT8, peer=r) for r, t in enumerate(root_list) if r != 0]
    assert made == [START, *body, END]
    own = root_list[0] if to_root else mine
    assert torch.equal(
        own, torch.arange(3, dtype=torch.float32) if to_root else torch.full((3,), -1.0)
    )


def test_all_to_all_splits_rows_along_dim_0(fake, comm):
    # 4 rows of 2 float32 (8 bytes a row) each side: rows 1, 0, 2, 1 sent; 0, 3, 1, 0 received.
    x = torch.zeros(4, 2)
    out = torch.zeros(4, 2)
    made = calls(
        fake,
        comm,
        "alltoall_base",
        outputs=[out],
        inputs=[x],
        input_splits=[1, 0, 2, 1],
        output_splits=[0, 3, 1, 0],
    )
    sent, got = [0, 8, 8, 24], [0, 0, 24, 32]  # each part's byte offset
    body = []
    for r, (n_in, n_out) in enumerate(zip([1, 0, 2, 1], [0, 3, 1, 0], strict=True)):
        body.append(call("ncclSend", [ptr(x, sent[r])], 8 * n_in, UINT8, peer=r))
        body.append(call("ncclRecv", [ptr(out, got[r])], 8 * n_out, UINT8, peer=r))
    assert made == [START, *body, END]


def test_all_to_all_without_splits_takes_equal_parts(fake, comm):
    x = torch.zeros(8, dtype=torch.float16)
    out = torch.zeros(8, dtype=torch.float16)
    made = calls(fake, comm, "alltoall_base", outputs=[out], inputs=[x])
    body = []
    for r in range(4):
        body.append(call("ncclSend", [ptr(x, 4 * r)], 4, UINT8, peer=r))
        body.append(call("ncclRecv", [ptr(out, 4 * r)], 4, UINT8, peer=r))
    assert made == [START, *body, END]
    xs = [torch.zeros(r + 1) for r in range(4)]
    outs = [torch.zeros(2) for _ in range(4)]
    made = calls(fake, comm, "alltoall", outputs=outs, inputs=xs)
    body = []
    for r in range(4):
        body.append(call("ncclSend", [ptr(xs[r])], 4 * (r + 1), UINT8, peer=r))
        body.append(call("ncclRecv", [ptr(outs[r])], 8, UINT8, peer=r))
    assert made == [START, *body, END]


def test_splits_that_do_not_sum_to_dim_0_are_refused(fake, comm):
    x = torch.zeros(4, 2)
    with pytest.raises(ValueError, match="splits sum to 3 but dim 0 of the input is 4"):
        calls(fake, comm, "alltoall_base", outputs=[x], inputs=[x], input_splits=[1, 1, 1, 0])
    assert fake.recorded() == []  # refused before any NCCL call


def test_a_failed_call_inside_a_group_names_the_call_and_closes_the_group(fake, comm):
    xs = [torch.zeros(1), torch.zeros(1)]
    fake.fail_next("ncclAllReduce", 5)  # ncclInvalidUsage
    with pytest.raises(torch.distributed.DistBackendError, match="ncclAllReduce on group 'g'"):
        calls(fake, comm, "allreduce_coalesced", inputs=xs, op=SUM)
    assert [r["call"] for r in fake.recorded()] == [
        "ncclGroupStart",
        "ncclAllReduce",
        "ncclGroupEnd",
    ]


@pytest.mark.parametrize("to_root", [True, False], ids=["gather", "scatter"])
def test_the_roots_own_part_is_copied_whatever_its_shape(fake, root, to_root):
    # The checks compare element counts only: a [2, 3] tensor and [6] parts are fine.
    mine = torch.arange(6.0).view(2, 3) if to_root else torch.full((2, 3), -1.0)
    root_list = [torch.zeros(6) if to_root else torch.full((6,), float(r)) for r in range(4)]
    args = (root_list, [mine]) if to_root else ([mine], root_list)
    calls(fake, root, "gather" if to_root else "scatter", root=0, outputs=args[0], inputs=args[1])
    if to_root:
        assert torch.equal(root_list[0], torch.arange(6.0))
    else:
        assert torch.equal(mine, torch.zeros(2, 3))  # part 0, rank 0's own, holds zeros


@pytest.mark.parametrize("to_root", [True, False], ids=["gather", "scatter"])
def test_a_failed_call_names_what_this_rank_called(fake, not_root, to_root):
    mine = torch.zeros(2)
    call_made = "ncclSend" if to_root else "ncclRecv"
    fake.fail_next(call_made, 5)  # ncclInvalidUsage
    lists = ([], [mine]) if to_root else ([mine], [])
    with pytest.raises(torch.distributed.DistBackendError, match=f"{call_made} on group 'g'"):
        calls(
            fake,
            not_root,
            "gather" if to_root else "scatter",
            root=0,
            outputs=lists[0],
            inputs=lists[1],
        )
    fake.recorded()
