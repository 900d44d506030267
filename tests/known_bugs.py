"""Known ort-lazy bugs the zoo and peer tests hit, with their root cause.

A test that fails because of one of them keeps asserting the correct behaviour and is marked
with :func:`xfail` (strict): it turns into a failure (XPASS) as soon as the bug is fixed, and
then the marker goes. ``raises`` limits the expected failure to the exception the bug gives,
so a different failure is never hidden behind a known bug.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest
import torch._dynamo.exc


@dataclass(frozen=True)
class Bug:
    """One known bug: where it is, what goes wrong, and the exception a test sees."""

    name: str
    cause: str
    raises: type[BaseException] = AssertionError


LIFT_FRESH = Bug(
    "lift_fresh",
    "ort_lazy/_compat.py decomposition_table() copies all of torch._decomp.decomposition_table, "
    "including nop_decomposition for aten.lift_fresh/aten.lift (-> aten.alias); AOTAutograd then "
    "decomposes the lift of a torch.tensor(...) constant before FakeTensorMode fakifies it: "
    "BackendCompilerFailed 'Please convert all Tensors to FakeTensors first or instantiate "
    "FakeTensorMode with allow_non_fake_inputs. Found in aten.alias.default(tensor([]))'",
    torch._dynamo.exc.BackendCompilerFailed,
)

LIFT_FRESH_COPY_EXPORT = Bug(
    "lift_fresh_copy_export",
    "(behind lift_fresh) a torch.tensor(...) constant, aten.lift_fresh_copy of a get_attr, cannot be "
    "exported: the get_attr's meta['val'] is a FakeTensor of another FakeTensorMode than the rest of "
    "the aten graph, and the exporter's insert_type_promotion_nodes (export/fx.py _prepare, for the "
    "support probe and the region alike) raises 'Mixing fake modes NYI'; the probe answers 'export "
    "failed', so every such constant stays in PyTorch and splits the graph (4 ops in GPT-2)",
)

NLL_TOTAL_WEIGHT = Bug(
    "nll_total_weight",
    "torchlib's aten_nll_loss_forward fakes total_weight = Size(output) (1 for a scalar mean loss) and "
    "ort_lazy/_compat.py distrusted_ops() does not list aten.nll_loss_forward, so ORT's total_weight "
    "reaches torch's nll_loss_backward decomposition, which divides by 1 instead of the number of "
    "counted targets: under a mean cross-entropy every gradient is N times too large (N = batch "
    "size, or non-ignored tokens); the loss itself is right",
)

BRIDGE_MULTI_OUTPUT = Bug(
    "bridge_multi_output",
    "cpp/bridge.cpp is_supported() accepts aten nodes with several outputs (max_pool2d_with_indices, "
    "native_layer_norm[_backward]); torch's CustomFuseGraph cannot merge a multi-output producer into "
    "a group: 'producer->node()->outputs().size() == 1 INTERNAL ASSERT FAILED at "
    "torch/csrc/jit/passes/graph_fuser.cpp:446', raised by the first sync that runs a graph the "
    "profiling executor has optimized (the zoo's 3rd SGD step, LORT MNIST's 2nd repetition)",
)

TS_SOFTMAX = Bug(
    "ts_softmax",
    "frontends/jit.py _reason() answers from the FX/torchlib support table (support.op_reason), which "
    "accepts aten::_softmax, but the group is exported by export/torchscript.py with the TorchScript "
    "exporter, which has no symbolic for it: \"UnsupportedOperatorError: Exporting the operator "
    "'aten::_softmax' to ONNX opset version 18 is not supported\"; every LazyTensor softmax group is "
    "an export failure and runs in TorchScript",
)

TS_CONV = Bug(
    "ts_conv",
    "frontends/jit.py _reason() refuses aten::_convolution, aten::batch_norm and "
    "aten::adaptive_avg_pool2d as 'no ONNX mapping' because the torchlib registry it asks does not "
    "list them, yet the TorchScript exporter that exports the groups (export/torchscript.py) maps all "
    "three: a traced CNN's convolutions, batch norms and pooling never reach ORT",
)


def xfail(*bugs: Bug) -> Any:
    """A strict xfail marker for ``bugs`` (in the order a test meets them)."""
    reason = " | then: ".join(f"[{b.name}] {b.cause}" for b in bugs)
    raises = tuple(dict.fromkeys(b.raises for b in bugs))
    return pytest.mark.xfail(strict=True, reason=reason, raises=raises)
