"""LazyTensor (``device="lazy"``) on ORT through the bridge, compared with eager CPU PyTorch."""

from __future__ import annotations

import itertools

import pytest
import torch

from helpers import bridge_marks
from ort_lazy import metrics

pytestmark = bridge_marks()


@pytest.fixture(scope="module")
def ltm():
    import torch._lazy

    import ort_lazy

    ort_lazy.lazy.init()
    yield torch._lazy
    ort_lazy.lazy.shutdown()


# -- the seed script, with its asserts ------------------------------------------------------


def model(x):
    y = x * x
    z = y + x
    p = z * x
    q = p - x
    r = q / x
    return r


def run_forward(ltm, x):
    y = model(x)
    ltm.mark_step()
    return y


def run_forward_backward(ltm, x):
    assert x.requires_grad
    y = run_forward(ltm, x)
    y.sum().backward()
    ltm.mark_step()
    return y, x.grad


def run(ltm, x, dtype, can_run_backward):
    x_cpu = torch.tensor(x, device="cpu", dtype=dtype)
    x_lazy = torch.tensor(x, device="lazy", dtype=dtype)
    expected = run_forward(ltm, x_cpu)
    generated = run_forward(ltm, x_lazy)
    assert torch.allclose(expected, generated.to("cpu"), equal_nan=True), (x, dtype)
    if not can_run_backward:
        return
    expected, expected_grad = run_forward_backward(ltm, x_cpu.requires_grad_())
    generated, generated_grad = run_forward_backward(ltm, x_lazy.requires_grad_())
    assert torch.allclose(expected, generated.to("cpu"), equal_nan=True), (x, dtype)
    assert torch.allclose(expected_grad, generated_grad.to("cpu"), equal_nan=True), (x, dtype)


X_FLOATS = [-1.0, 1, [-1.0, 1.0, 2.0], [-0.0, 0.0, 7.0]]
X_INTS = [[1, -1], [2, 1], [-2, -2]]
FLOAT_TYPES = [torch.float64, torch.float, torch.float16]
INT_TYPES = [torch.int64, torch.int32]


def _seed_script(ltm):
    for x, dtype in itertools.product(X_FLOATS, FLOAT_TYPES):
        run(ltm, x, dtype, can_run_backward=True)
    for x, dtype in itertools.product(X_INTS, INT_TYPES):
        run(ltm, x, dtype, can_run_backward=False)


def test_seed_script(ltm):
    _seed_script(ltm)
    c = metrics.counters()
    assert c["ort_runs"] > 0, metrics.report()
    assert c["export_failures"] == 0 and c["ort_failures"] == 0, metrics.report()


def test_ops_reading_one_value_twice_or_a_constant_run_on_ort(ltm):
    """Nodes whose inputs are one value twice (x * x, x / x, x ** x) or a scalar LazyTensor
    folded into a constant (x ** 2, the mean's division) are probed with one example per
    tensor input and run on ORT, forward and backward: nothing is left in TorchScript."""
    x_cpu = torch.rand(6, dtype=torch.float64) + 0.5

    def f(x):
        return (x * x + x / x + torch.pow(x, x) + x.pow(2) * 3.0).mean()

    xr = x_cpu.clone().requires_grad_()
    f(xr).backward()
    expected, expected_grad = f(x_cpu), xr.grad
    for _ in range(3):
        x = x_cpu.to("lazy").requires_grad_()
        y = f(x)
        y.backward()
        ltm.mark_step()
    assert torch.allclose(y.cpu(), expected) and torch.allclose(x.grad.cpu(), expected_grad)
    assert metrics.counters()["ort_runs"] > 0
    assert metrics.fallbacks() == {}, metrics.fallbacks()


@pytest.mark.parametrize("size", [16, 10])
def test_adaptive_average_pooling(ltm, size):
    """LazyTensor records ``aten::_adaptive_avg_pool2d``, which the TorchScript exporter has no
    symbolic for: the bridge hands it the public op, so pooling whose output size divides the
    input's runs on ORT; other sizes stay in TorchScript. Results and gradients as eager."""
    pool = torch.nn.AdaptiveAvgPool2d(4)
    x_cpu = torch.rand(2, 3, size, size)  # float32: ORT's AveragePool has no float64 kernel
    xr = x_cpu.clone().requires_grad_()
    expected = pool(xr * 2.0) + 1.0
    expected.sum().backward()
    for _ in range(3):
        x = x_cpu.to("lazy").requires_grad_()
        y = pool(x * 2.0) + 1.0
        y.sum().backward()
        ltm.mark_step()
    assert torch.allclose(y.cpu(), expected) and torch.allclose(x.grad.cpu(), xr.grad)
    assert metrics.counters()["ort_runs"] > 0
    kept = metrics.fallbacks()
    if size == 16:  # forward and backward (upsampled gradient over the window's area) on ORT
        assert not any("adaptive_avg_pool2d" in op for op in kept), kept
    else:  # 10 -> 4: not an average pooling with one kernel; the exporter refuses it
        assert "aten.adaptive_avg_pool2d.default" in kept, kept
        assert "aten._adaptive_avg_pool2d_backward.default" in kept, kept


@pytest.mark.parametrize("shape", [(2, 3, 8, 8), (2, 4, 6, 10), (3, 12, 12)], ids=str)
def test_global_average_pooling_backward_on_ort(ltm, shape):
    """A CNN head's global average pooling: its backward (an ``_adaptive_avg_pool2d_backward``
    the TorchScript exporter cannot export) is rewritten by the bridge and runs on ORT, with
    eager's gradient; 3-D input (no batch) too."""
    x_cpu = torch.randn(*shape)
    xr = x_cpu.clone().requires_grad_()
    pool = torch.nn.AdaptiveAvgPool2d(1)
    (pool(xr * 3.0) * torch.arange(1.0, 1.0 + shape[-3]).view(-1, 1, 1)).sum().backward()
    for _ in range(3):
        x = x_cpu.to("lazy").requires_grad_()
        (pool(x * 3.0) * torch.arange(1.0, 1.0 + shape[-3]).view(-1, 1, 1).to("lazy")).sum().backward()
        ltm.mark_step()
    assert torch.allclose(x.grad.cpu(), xr.grad, atol=1e-6)
    assert metrics.counters()["ort_runs"] > 0
    assert not any("adaptive_avg_pool2d" in op for op in metrics.fallbacks()), metrics.fallbacks()


def test_seed_script_repeated_switches_to_ort(ltm):
    """Every lazy graph of the seed runs on ORT once the profiling executor optimized it."""
    runs = []
    for _ in range(3):
        before = metrics.counters()["ort_runs"]
        _seed_script(ltm)
        runs.append(metrics.counters()["ort_runs"] - before)
    # each pass executes 12 forward, 12 forward+backward and 6 int forward steps; from the
    # second pass on, each of their graphs was already profiled, so all of them hit ORT
    # (backward graphs have detach_copy left in TorchScript, so some steps hold 2 groups)
    assert runs[1] >= 12 * 2 + 6, runs
    assert runs[2] == runs[1], runs
    # a graph never seen before: profiled in TorchScript first, then ORT for good
    x = torch.linspace(-3.0, 3.0, 17, dtype=torch.float64).to("lazy")
    per_run = []
    for _ in range(4):
        before = metrics.counters()["ort_runs"]
        y = run_forward(ltm, x * 1.0)
        per_run.append(metrics.counters()["ort_runs"] - before)
    assert per_run[0] == 0 and per_run[-2:] == [1, 1], per_run
    assert torch.allclose(y.cpu(), model(x.cpu()), equal_nan=True)
    c = metrics.counters()
    assert c["torch_runs"] == 0 and c["ort_failures"] == 0 and c["export_failures"] == 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.bool])
def test_bfloat16_and_bool(ltm, dtype):
    if dtype is torch.bool:
        a_data, b_data = [True, False, True, False], [True, True, False, False]

        def f(a, b):
            return (a * b + a) == b

    else:
        a_data, b_data = [-1.0, 1.0, 2.0, 0.5], [3.0, -2.0, 0.25, 8.0]

        def f(a, b):
            return model(a) + b * a

    a_cpu, b_cpu = torch.tensor(a_data, dtype=dtype), torch.tensor(b_data, dtype=dtype)
    expected = f(a_cpu, b_cpu)
    for _ in range(3):
        a, b = a_cpu.to("lazy"), b_cpu.to("lazy")
        out = f(a, b)
        ltm.mark_step()
        assert torch.equal(out.cpu(), expected) if dtype is torch.bool else torch.allclose(out.cpu(), expected)
    c = metrics.counters()
    # never a failed session: what ORT cannot run is left to TorchScript up front, counted
    assert c["ort_failures"] == 0 and c["export_failures"] == 0
    assert c["ort_runs"] > 0 or c["fallback_ops"] > 0, metrics.report()


def _mlp_steps(device: str, steps: int, sync) -> tuple[list[float], list[torch.Tensor]]:
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        torch.nn.Linear(12, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)
    ).to(device)
    opt = torch.optim.SGD(net.parameters(), lr=0.05)
    gen = torch.Generator().manual_seed(1)
    losses = []
    for _ in range(steps):
        x = torch.randn(8, 12, generator=gen).to(device)
        target = torch.randn(8, 3, generator=gen).to(device)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(net(x), target)
        loss.backward()
        opt.step()
        sync()
        losses.append(loss.item())
    return losses, [p.detach().cpu() for p in net.parameters()]


def test_mlp_sgd_matches_cpu(ltm):
    cpu_losses, cpu_params = _mlp_steps("cpu", 5, lambda: None)
    lazy_losses, lazy_params = _mlp_steps("lazy", 5, ltm.mark_step)
    assert torch.allclose(torch.tensor(lazy_losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-6)
    for a, b in zip(lazy_params, cpu_params):
        assert torch.allclose(a, b, rtol=1e-4, atol=1e-5)
    c = metrics.counters()
    assert c["ort_runs"] > 0, metrics.report()
    assert c["ort_failures"] == 0 and c["export_failures"] == 0


def test_sync_multi_and_threads(ltm):
    """`.cpu()` and `sync_multi` are sync points; steps traced from several threads work."""
    import threading

    def step(seed: int, out: dict) -> None:
        g = torch.Generator().manual_seed(seed)
        x_cpu = torch.randn(5, 6, generator=g)
        x = x_cpu.to("lazy")
        a, b = torch.sigmoid(x) * x, (x * x - 1.0).sum(dim=1)
        for _ in range(2):
            ltm.sync_multi([a, b], devices=[])
        out[seed] = (a.cpu(), b.cpu(), x_cpu)

    results: dict = {}
    threads = [threading.Thread(target=step, args=(s, results)) for s in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for _ in range(2):
        step(10, results)
    for a, b, x_cpu in results.values():
        assert torch.allclose(a, torch.sigmoid(x_cpu) * x_cpu, atol=1e-6)
        assert torch.allclose(b, (x_cpu * x_cpu - 1.0).sum(dim=1), atol=1e-5)
    assert metrics.counters()["ort_runs"] > 0, metrics.report()


_EDGES = torch.tensor([1e10 + 0.5, -7.5, 3e19, float("inf"), float("nan"), 2.0**60 + 3, -2.5], dtype=torch.float64)


@pytest.mark.parametrize(
    "name,fn,args",
    [
        ("trunc division", lambda a, b: torch.div(a, b, rounding_mode="trunc").abs() + a, (_EDGES, torch.ones(7, dtype=torch.float64))),
        ("trunc division float32", lambda a, b: torch.div(a, b, rounding_mode="trunc").abs() + a, (_EDGES.float(), torch.ones(7))),
        ("trunc division by bool", lambda a, b: torch.div(a, b, rounding_mode="trunc").abs() + a, (_EDGES[:2].float(), torch.tensor([False, True]))),
        ("floor division", lambda a, b: torch.div(a, b, rounding_mode="floor").abs() + a, (_EDGES, torch.ones(7, dtype=torch.float64))),
        ("integer power", lambda a, b: (a**b).abs() + a, (torch.tensor([3, 0, 2, 7]), torch.tensor([39, -2, 5, 30]))),
        ("bool to integer power", lambda a, b: (a**b).abs() + b, (torch.tensor([False, True, False]), torch.tensor([-1, 2, 3], dtype=torch.int32))),
        ("float64 log2", lambda a, b: a.abs().log2().neg() + b, (_EDGES[:3], torch.ones(3, dtype=torch.float64))),
        ("remainder by infinity", lambda a, b: torch.remainder(a, 1e300).neg() + b,
         (torch.tensor([-1.5, 2.0, 3.0]), torch.ones(1))),
        ("remainder by an infinite tensor", lambda a, b: torch.remainder(a, b).neg() + a,
         (torch.tensor([-1.5, 2.0, 3.0]), torch.tensor([float("inf"), float("-inf"), 2.0]))),
        ("softmax to float64", lambda a, b: torch.softmax(a, 1, dtype=torch.float64).neg() + b,
         (torch.randn(3, 5) * 4, torch.ones(1, dtype=torch.float64))),
        ("log_softmax to float64", lambda a, b: torch.log_softmax(a, 0, dtype=torch.float64).neg() + b,
         (torch.randn(3, 5) * 4, torch.ones(1, dtype=torch.float64))),
        ("softmin to float64", lambda a, b: torch.nn.functional.softmin(a, 1, dtype=torch.float64).neg() + b,
         (torch.randn(3, 5) * 4, torch.ones(1, dtype=torch.float64))),
        ("softplus threshold", lambda a, b: torch.nn.functional.softplus(a, 3, 0.2).neg() + b,
         (torch.linspace(-2, 2, 9), torch.ones(1))),
        ("softplus threshold float64", lambda a, b: torch.nn.functional.softplus(a, 0.5, 5).neg() + b,
         (torch.linspace(-20, 20, 9, dtype=torch.float64), torch.ones(1, dtype=torch.float64))),
        # the checks of the FX path (DISTRUSTED_WHEN) apply too: ORT's AveragePool ignores it
        ("avg_pool divisor_override", lambda a, b: torch.nn.functional.avg_pool2d(a, 2, divisor_override=3).neg() + b,
         (torch.arange(32.0).reshape(2, 1, 4, 4), torch.ones(1))),
    ],
)
def test_translations_wrong_for_some_values_stay_in_torchscript(ltm, name, fn, args):
    """The TorchScript exporter's ``div(rounding_mode='trunc')`` casts through int64 (3e19, inf
    and NaN came back as 9.2e18), its ``floor`` gives infinity where eager gives NaN, and its
    integer ``pow`` goes through floating point (3**39 lost its digits, 0**-2 was INT64_MIN),
    its float64 ``log2`` divides by ln 2 in float32 (3e-9 off), its float ``remainder`` by an
    infinity is NaN (eager: the dividend or an infinity), and ``divisor_override`` was
    ignored as on the FX path (an average of 4 where eager divides by 3): those nodes
    stay in TorchScript, the rest of the graph runs on ORT."""
    expected = fn(*args)
    for _ in range(3):
        got = fn(*(a.to("lazy") for a in args))
        ltm.mark_step()
    got = got.cpu()
    assert got.dtype == expected.dtype and torch.equal(got.isnan(), expected.isnan())
    assert torch.equal(got.nan_to_num(), expected.nan_to_num()), (got, expected)
    assert metrics.counters()["ort_runs"] > 0, metrics.report()
    kept = ("div", "pow", "log2", "avg_pool2d", "remainder", "softmax", "log_softmax", "softplus")
    assert any(op.split(".")[1] in kept for op in metrics.fallbacks()), metrics.fallbacks()


def test_failed_exports_print_nothing_and_leave_the_onnx_log_off(ltm, capfd):
    """A node the TorchScript exporter cannot export stays in TorchScript, quietly: the
    exporter itself would switch TorchScript's ONNX log on for good and print the graph of
    every failed export ("Torch IR graph at exception")."""
    torch._C._jit_set_onnx_log_enabled(False)  # a direct TorchScript export earlier may have set it
    x_cpu = torch.randn(4, 4)
    metrics.reset()
    x = x_cpu.to("lazy")
    for _ in range(3):  # the profiling executor fuses from the third run
        y = (x.frac() * 2).abs()
        ltm.mark_step()
        got = y.cpu()
    torch.testing.assert_close(got, (x_cpu.frac() * 2).abs())
    assert "aten.frac.default" in metrics.fallbacks(), metrics.fallbacks()  # the export failed
    assert metrics.counters()["ort_runs"] > 0  # the rest ran on ORT
    out, err = capfd.readouterr()
    assert "Torch IR graph" not in out + err
    assert not torch._C._jit_is_onnx_log_enabled()


def _f64(v, dtype=torch.float64):
    return torch.tensor(v, dtype=dtype)


#: float64 graphs where two 0-d tensors meet before a tensor: (function, inputs)
ZERO_D_ARITHMETIC = {
    "product": (lambda a, b, c: a * b * c, (_f64(1 / 3), _f64(3.14159265358979), _f64([1.0, 2.0]))),
    "sum": (lambda a, b, c: (a + b) + c, (_f64(1 / 3), _f64(1e-12), _f64([1.0, 2.0]))),
    "difference": (lambda a, b, c: (a - b) * c, (_f64(1 / 3), _f64(1e-12), _f64([[1.0, 2.0]]))),
    "quotient": (lambda a, b, c: (a / b) * c, (_f64(1.0), _f64(3.0), _f64([1.0, 2.0]))),
    "only-0-d": (lambda a, b, c: (a * b).neg() / 3.0, (_f64(1 / 3), _f64(3.14159265358979), _f64(1.0))),
    "float32-0-d": (lambda a, b, c: (a * b) * c, (_f64(1 / 3, torch.float32), _f64(0.1, torch.float32), _f64([1.0, 2.0]))),
    "integer-times-float": (lambda a, b, c: a * 0.1 + c * b, (_f64([1, 2, 3], torch.int64), _f64(1 / 3), _f64([1.0, 2.0, 3.0]))),
}


@pytest.mark.parametrize("name", list(ZERO_D_ARITHMETIC))
def test_float64_arithmetic_of_0_d_tensors_stays_float64(ltm, name):
    """The TorchScript exporter types arithmetic between 0-d tensors with the default dtype:
    a float64 graph computed ``a * b`` of two 0-d tensors in float32 before it met a tensor
    (1e-8 off, silently). Bit for bit with eager now, on ORT."""
    fn, args = ZERO_D_ARITHMETIC[name]
    want = fn(*args)
    metrics.reset()
    for _ in range(3):  # the profiling executor fuses from the third run
        y = fn(*(a.to("lazy") for a in args)).neg().neg()
        ltm.mark_step()
        got = y.cpu()
    assert metrics.counters()["ort_runs"] > 0
    assert got.dtype == want.dtype and torch.equal(got, want), (got, want)


#: float64 losses whose backward meets 0-d values (scales, counts, norms): (loss of x, y)
FLOAT64_BACKWARDS = {
    "dot": lambda x, y: torch.dot(x.flatten(), y.flatten()),
    "l1-loss": lambda x, y: torch.nn.functional.l1_loss(x, y),
    "mean": lambda x, y: (x * y).mean(),
    "norm": lambda x, y: x.norm() + y.sum(),
    "dist": lambda x, y: torch.dist(x, y),
    # a 0-d deviation times an integer count (a number LazyTensor passes as a 0-d int64)
}


@pytest.mark.parametrize("name", ["std_mean", "var_mean"])
def test_float64_gradient_of_a_deviation_over_all_elements(ltm, name):
    """The backward of a 0-d deviation divides by the deviation times the element count (an
    integer LazyTensor passes as a 0-d int64 tensor): both 0-d, computed in float32 under the
    structural check (5e-9 off). No integer tensor of rank 1 or more meets a number in such a
    graph (a 0-d integer is taken for such a number), so it is exported under float64."""
    op = getattr(torch, name)
    x0 = torch.randn(5, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    w = torch.tensor(-0.75, dtype=torch.float64)

    def grad(device):
        x = x0.to(device).requires_grad_()
        out = op(x, 0, unbiased=False)
        (g,) = torch.autograd.grad((out[0] if isinstance(out, tuple) else out) * w.to(device), x)
        if device == "lazy":
            ltm.mark_step()
        return g.cpu()

    want = grad("cpu")
    metrics.reset()
    for _ in range(3):
        got = grad("lazy")
    assert metrics.counters()["ort_runs"] > 0
    assert float((got - want).abs().max()) <= 1e-14, (got, want)


@pytest.mark.parametrize("name", list(FLOAT64_BACKWARDS))
def test_float64_gradients_through_0_d_values(ltm, name):
    """A scaled loss's backward: the scale times the 0-d gradient of the loss, divided by an
    integer count or a norm, meets the inputs. float64 gradients as eager's (to 1e-13; they
    were 1e-8 off, computed in float32), on ORT."""
    torch.manual_seed(0)
    a, b = torch.randn(3, 4, dtype=torch.float64), torch.randn(3, 4, dtype=torch.float64)
    w = torch.randn((), dtype=torch.float64)
    loss = FLOAT64_BACKWARDS[name]

    def grads(device):
        x, y = a.to(device).requires_grad_(), b.to(device).requires_grad_()
        gx, gy = torch.autograd.grad(loss(x, y) * w.to(device), [x, y])
        if device == "lazy":
            ltm.mark_step()
        return gx.cpu(), gy.cpu()

    want = grads("cpu")
    metrics.reset()
    for _ in range(3):
        got = grads("lazy")
    assert metrics.counters()["ort_runs"] > 0
    for g, e in zip(got, want):
        assert g.dtype == torch.float64
        assert float((g - e).abs().max()) <= 1e-13 * float(e.abs().max()), (g, e)


#: graphs on empty tensors: (function, input shapes)
EMPTY_CASES = {
    "reshape": (lambda x: (x * 2).reshape(-1, 3).neg(), [(0, 3)]),
    "view-of-slice": (lambda x: x[:0].view(-1, 3).abs() * 2, [(4, 3)]),
    "bilinear": (lambda a, b, w: torch.nn.functional.bilinear(a, b, w).neg(), [(0, 3), (0, 4), (5, 3, 4)]),
    "matmul-sum": (lambda a, b: (a @ b).sum(0).neg(), [(2, 0), (0, 3)]),
}


@pytest.mark.parametrize("name", list(EMPTY_CASES))
def test_empty_tensors_stay_in_torchscript_without_crashing(ltm, name):
    """Nodes on empty tensors stay in TorchScript (nothing to compute): the TorchScript
    exporter's shape inference divides by zero reshaping an empty tensor, which killed the
    process (SIGFPE) from the backward of ``bilinear`` on an empty batch. Forward and
    backward as eager's."""
    fn, shapes = EMPTY_CASES[name]
    inputs = [torch.randn(s, generator=torch.Generator().manual_seed(i)) for i, s in enumerate(shapes)]
    ref = [t.clone().requires_grad_() for t in inputs]
    want = fn(*ref)
    want_grads = torch.autograd.grad(want.sum(), ref, allow_unused=True)
    metrics.reset()
    for _ in range(3):  # the profiling executor fuses from the third run
        lazy = [t.to("lazy").requires_grad_() for t in inputs]
        y = fn(*lazy)
        grads = torch.autograd.grad(y.sum(), lazy, allow_unused=True)
        ltm.mark_step()
        got, got_grads = y.cpu(), [g.cpu() if g is not None else None for g in grads]
    torch.testing.assert_close(got, want.detach())
    for g, e in zip(got_grads, want_grads):
        assert (g is None) == (e is None)
        if g is not None:
            torch.testing.assert_close(g, e)


# -- ops made of views ------------------------------------------------------------------------

#: ops written with views (reshapes, permutes, slices, expands), which LazyTensor replays
#: through its own view tracking: ``pixel_shuffle`` came back as values of unrelated memory
LAYOUT_OPS = (
    "nn.functional.pixel_shuffle", "nn.functional.pixel_unshuffle", "nn.functional.channel_shuffle",
    "movedim", "permute", "flatten", "unflatten", "narrow", "unfold", "transpose", "t", "expand",
    "repeat", "tile", "roll", "flip", "rot90", "diagonal", "diag_embed", "tril", "triu", "split",
    "chunk", "unbind", "stack", "cat", "squeeze", "unsqueeze", "reshape", "select",
    "take_along_dim", "swapaxes", "ravel", "hstack", "vstack", "dstack", "block_diag", "kron",
)


def _layout_op_infos() -> list:
    from torch.testing._internal.common_methods_invocations import op_db

    return [op for op in op_db if op.name in LAYOUT_OPS and not op.variant_test_name]


def _to(value, device):
    if isinstance(value, torch.Tensor):
        return value.detach().to(device)
    if isinstance(value, (list, tuple)):
        return type(value)(_to(v, device) for v in value)
    return value


@pytest.mark.parametrize("op", _layout_op_infos(), ids=lambda op: op.name)
def test_ops_made_of_views_match_eager(ltm, op) -> None:
    checked = 0
    for sample in list(op.sample_inputs("cpu", torch.float32))[:3]:
        expected = op(sample.input, *sample.args, **sample.kwargs)
        actual = op(_to(sample.input, "lazy"), *_to(sample.args, "lazy"), **_to(sample.kwargs, "lazy"))
        ltm.mark_step()
        expected = list(expected) if isinstance(expected, (list, tuple)) else [expected]
        actual = list(actual) if isinstance(actual, (list, tuple)) else [actual]
        assert len(actual) == len(expected)
        for a, e in zip(actual, expected):
            torch.testing.assert_close(a.cpu(), e, rtol=0, atol=0)
        checked += 1
    assert checked


def test_pixel_shuffle_forward_and_backward(ltm) -> None:
    for shape, factor in (((9, 2, 3), 3), ((2, 8, 3, 5), 2), ((2, 3, 18, 2, 2), 3)):
        x = torch.randn(*shape)
        weights = torch.arange(x.numel(), dtype=torch.float32)
        eager_x = x.clone().requires_grad_()
        expected = torch.nn.functional.pixel_shuffle(eager_x, factor)
        (expected * weights.reshape(expected.shape)).sum().backward()
        lazy_x = x.to("lazy").requires_grad_()
        actual = torch.nn.functional.pixel_shuffle(lazy_x, factor)
        (actual * weights.reshape(expected.shape).to("lazy")).sum().backward()
        ltm.mark_step()
        torch.testing.assert_close(actual.cpu(), expected.detach(), rtol=0, atol=0)
        torch.testing.assert_close(lazy_x.grad.cpu(), eager_x.grad, rtol=0, atol=0)
    with pytest.raises(RuntimeError, match="divisible by the square of upscale_factor"):
        torch.nn.functional.pixel_shuffle(torch.randn(1, 5, 2, 2).to("lazy"), 2)


def test_pixel_shuffle_in_a_step_that_runs_on_ort(ltm) -> None:
    """The lazy pixel_shuffle kernel's copies fuse with the step's other ops into an ORT group
    (TorchScript's executor fuses from the second run of a step on)."""

    def step(t):
        y = torch.nn.functional.pixel_shuffle(t, 2)
        w = y.relu()
        return (w * w + 1.5 + y) * y

    x = torch.randn(2, 8, 3, 5)
    expected = step(x)
    before = metrics.counters()["ort_runs"]
    for _ in range(5):
        actual = step(x.to("lazy"))
        ltm.mark_step()
        torch.testing.assert_close(actual.cpu(), expected, rtol=0, atol=0)
    assert metrics.counters()["ort_runs"] > before
