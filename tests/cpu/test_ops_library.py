"""The nccl_core op library traces in order and compiles without graph breaks (meta tensors)."""

from __future__ import annotations

import torch
from torch.fx.experimental.proxy_tensor import make_fx

import torch_nccl_core  # noqa: F401  (registers torch.ops.nccl_core)


def _exchange(src: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    torch.ops.nccl_core.put_signal(src * 2, window, 1, 0, "g")
    torch.ops.nccl_core.signal(window, 1, "g")
    torch.ops.nccl_core.wait_signal(window, [1], [2], "g")
    return window + 1


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(4, device="meta"), torch.empty(8, device="meta")


def test_schemas():
    ops = torch.ops.nccl_core
    assert str(ops.put_signal.default._schema) == (
        "nccl_core::put_signal(Tensor src, Tensor(a!) window, int peer, int offset, "
        "str group_name) -> ()"
    )
    assert str(ops.signal.default._schema) == (
        "nccl_core::signal(Tensor(a!) window, int peer, str group_name) -> ()"
    )
    assert str(ops.wait_signal.default._schema) == (
        "nccl_core::wait_signal(Tensor(a!) window, int[] peers, int[] op_counts, "
        "str group_name) -> ()"
    )


def test_traced_graph_keeps_the_order_of_computation_and_communication():
    graph = make_fx(_exchange)(*_inputs()).graph
    calls = [str(n.target) for n in graph.nodes if n.op == "call_function"]
    assert calls == [
        "aten.mul.Tensor",
        "nccl_core.put_signal.default",
        "nccl_core.signal.default",
        "nccl_core.wait_signal.default",
        "aten.add.Tensor",
    ]


def test_compiles_with_fullgraph():
    compiled = torch.compile(_exchange, fullgraph=True, backend="aot_eager")
    out = compiled(*_inputs())
    assert out.shape == (8,) and out.device.type == "meta"
