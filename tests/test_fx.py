"""ort_lazy.fx.compile for torch.fx GraphModules."""

from __future__ import annotations

import torch

import ort_lazy
from helpers import assert_close, assert_ran_on_ort


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(6, 4)

    def forward(self, x, y):
        return torch.relu(self.lin(x)) * y, x.sum()


def test_fx_graph_module_forward_and_backward():
    torch.manual_seed(0)
    net = Net()
    gm = torch.fx.symbolic_trace(net)
    x = torch.randn(3, 6, requires_grad=True)
    y = torch.randn(3, 4)
    compiled = ort_lazy.fx.compile(gm, [x, y])
    out, total = compiled(x, y)
    ref_out, ref_total = net(x, y)
    assert_close(out.detach(), ref_out.detach())
    assert_close(total.detach(), ref_total.detach())
    out.sum().backward()
    g_ort = (x.grad.clone(), net.lin.weight.grad.clone())
    x.grad = None
    net.zero_grad()
    ref_out.sum().backward()
    assert_close(g_ort[0], x.grad)
    assert_close(g_ort[1], net.lin.weight.grad)
    assert_ran_on_ort(2)


def test_fx_compile_with_options():
    gm = torch.fx.symbolic_trace(lambda a: torch.relu(a) + torch.tanh(a))
    a = torch.randn(5)
    compiled = ort_lazy.fx.compile(gm, [a], torch_executed_ops=["aten.tanh"])
    with torch.no_grad():
        assert_close(compiled(a)[0] if isinstance(compiled(a), (tuple, list)) else compiled(a), torch.relu(a) + torch.tanh(a))
    assert "aten.tanh.default" in ort_lazy.metrics.fallbacks()
    assert_ran_on_ort()
