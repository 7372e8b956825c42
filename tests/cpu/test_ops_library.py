"""The nccl_core op library traces in order and compiles without graph breaks (meta tensors);
torch.compile's functionalization hands the ops the window itself, in program order."""

from __future__ import annotations

import operator

import torch
from torch._dynamo.backends.common import aot_autograd
from torch._functorch.aot_autograd import make_boxed_func
from torch._higher_order_ops.effects import has_effects
from torch.fx.experimental.proxy_tensor import make_fx

import torch_nccl_core  # noqa: F401  (registers torch.ops.nccl_core)

OPS = ("put_signal", "signal", "wait_signal")


def _exchange(src: torch.Tensor, window: torch.Tensor) -> torch.Tensor:
    torch.ops.nccl_core.put_signal(src * 2, window, 1, 0, "g")
    torch.ops.nccl_core.signal(window, 1, "g")
    received = torch.ops.nccl_core.wait_signal(window, [1], [2], "g")
    return received + 1


def _inputs() -> tuple[torch.Tensor, torch.Tensor]:
    return torch.empty(4, device="meta"), torch.empty(8, device="meta")


def test_schemas():
    """Functional: nothing is declared mutated (functionalization would hand a mutated argument
    over as a copy), and a wait returns what arrived."""
    ops = torch.ops.nccl_core
    assert str(ops.put_signal.default._schema) == (
        "nccl_core::put_signal(Tensor src, Tensor window, int peer, int offset, "
        "str group_name) -> ()"
    )
    assert str(ops.signal.default._schema) == (
        "nccl_core::signal(Tensor window, int peer, str group_name) -> ()"
    )
    assert str(ops.wait_signal.default._schema) == (
        "nccl_core::wait_signal(Tensor window, int[] peers, int[] op_counts, "
        "str group_name) -> Tensor"
    )


def test_ops_are_effectful():
    """Registered at import: compiled graphs thread an effect token through them."""
    assert all(has_effects(getattr(torch.ops.nccl_core, name).default) for name in OPS)


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


def test_compiled_graph_hands_the_ops_the_window_in_program_order():
    """What AOTAutograd makes of the ops (aot_eager, inductor alike): each op inside
    with_effects, in program order, given the window as it came in (no copy, nothing copied
    back into it), and the read after the wait reading what the wait returned. Was: the window
    was a mutated argument, which auto_functionalized handed over as a clone."""
    graphs = []

    def capture(gm: torch.fx.GraphModule, _inputs) -> object:
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    compiled = torch.compile(_exchange, backend=aot_autograd(fw_compiler=capture), fullgraph=True)
    out = compiled(*_inputs())
    assert out.shape == (8,) and out.device.type == "meta"
    (graph,) = [gm.graph for gm in graphs]
    nodes = list(graph.nodes)
    placeholders = [n for n in nodes if n.op == "placeholder"]
    effects = [n for n in nodes if n.target is torch.ops.higher_order.with_effects]
    assert [str(n.args[1]) for n in effects] == [f"nccl_core.{name}.default" for name in OPS]
    window = placeholders[-1]  # after the effect token and src
    put, signal, wait = effects
    assert put.args[3] is window and signal.args[2] is window and wait.args[2] is window
    targets = {str(n.target) for n in nodes if n.op == "call_function"}
    assert not any("copy" in t or "clone" in t or "auto_functionalized" in t for t in targets)
    # received + 1 reads the wait's result: item 1 of with_effects' (token, result).
    (add,) = [n for n in nodes if n.target is torch.ops.aten.add.Tensor]
    received = add.args[0]
    assert received.target is operator.getitem and received.args == (wait, 1)
