"""Options: defaults, ORT_LAZY_* variables, validation with clear errors."""

from __future__ import annotations

import pytest
import torch

from ort_lazy.options import TORCH_PREFERRED_OPS, Options, OptionsError


def test_defaults():
    o = Options()
    assert o.providers is None
    assert o.resolve_providers(torch.device("cpu")) == ("CPUExecutionProvider",)
    assert o.resolve_providers(torch.device("cuda", 0)) == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert o.min_block_size == 1 and o.run_type == "ort" and o.dynamic is True


def test_env_sets_every_field():
    env = {
        "ORT_LAZY_PROVIDERS": "cpu",
        "ORT_LAZY_PROVIDER_OPTIONS": '{"CPUExecutionProvider": {"arena": "1"}}',
        "ORT_LAZY_SESSION_OPTIONS": '{"intra_op_num_threads": 2}',
        "ORT_LAZY_MIN_BLOCK_SIZE": "3",
        "ORT_LAZY_TORCH_EXECUTED_OPS": "aten::relu, aten.gelu.default",
        "ORT_LAZY_FREEZE_WEIGHTS": "1",
        "ORT_LAZY_DYNAMIC": "false",
        "ORT_LAZY_CACHE_SIZE": "5",
        "ORT_LAZY_RUN_TYPE": "DEBUG",
        "ORT_LAZY_RTOL": "0.01",
        "ORT_LAZY_ATOL": "0",
        "ORT_LAZY_ALLOW_SPINNING": "0",
        "ORT_LAZY_DUMP_DIR": "/tmp/d",
        "ORT_LAZY_CACHE_DIR": "/tmp/c",
        "ORT_LAZY_AUTOTUNE": "1",
        "ORT_LAZY_STRICT": "1",
        "ORT_LAZY_NVTX": "1",
        "ORT_LAZY_PREPACK_WEIGHTS": "0",
        "ORT_LAZY_PRECISION": "int8-dynamic",
        "ORT_LAZY_FAST_MATH": "yes",
        "ORT_LAZY_PARK_TORCH_THREADS": "0",
        "ORT_LAZY_TORCH_PREFERRED_OPS": "none",
        "ORT_LAZY_EP_LIBRARIES": "MyExecutionProvider=/opt/lib/libmy_ep.so, onnxruntime_ep_openvino",
        "ORT_LAZY_EP_DEVICE": "NPU",
        "ORT_LAZY_EP_POLICY": "prefer-gpu",
        "ORT_LAZY_TRT_PROFILE_SCALE": "4",
    }
    o = Options.from_env(env)
    assert o.ep_libraries == {"MyExecutionProvider": "/opt/lib/libmy_ep.so", "": "onnxruntime_ep_openvino"}
    assert o.ep_device == "npu" and o.ep_policy == "prefer_gpu"
    assert o.providers == ("CPUExecutionProvider",)
    assert o.provider_options == {"CPUExecutionProvider": {"arena": "1"}}
    assert o.session_options == {"intra_op_num_threads": 2}
    assert o.min_block_size == 3
    assert o.torch_executed_ops == frozenset({"aten.relu", "aten.gelu.default"})
    assert o.freeze_weights is True and o.dynamic is False and o.autotune is True
    assert o.cache_size == 5 and o.run_type == "debug" and o.rtol == 0.01 and o.atol == 0.0
    assert o.allow_spinning is False and o.dump_dir == "/tmp/d" and o.cache_dir == "/tmp/c"
    assert o.park_torch_threads is False and o.fast_math is True and o.trt_profile_scale == 4.0
    assert o.torch_preferred_ops == frozenset() and Options().torch_preferred_ops == TORCH_PREFERRED_OPS
    fields = {f.upper() for f in Options.__dataclass_fields__}
    assert {k[len("ORT_LAZY_"):] for k in env} == fields  # every field has a variable


def test_explicit_options_win_over_env():
    o = Options.from_env({"ORT_LAZY_MIN_BLOCK_SIZE": "4"}, min_block_size=2)
    assert o.min_block_size == 2


@pytest.mark.parametrize(
    "var,value,words",
    [
        ("ORT_LAZY_PROVIDERS", "NopeExecutionProvider", ["ORT_LAZY_PROVIDERS", "unknown execution provider", "CPUExecutionProvider"]),
        ("ORT_LAZY_RTOL", "abc", ["ORT_LAZY_RTOL", "non-negative number"]),
        ("ORT_LAZY_ATOL", "-1", ["ORT_LAZY_ATOL", "non-negative"]),
        ("ORT_LAZY_FREEZE_WEIGHTS", "2", ["ORT_LAZY_FREEZE_WEIGHTS", "0/1"]),
        ("ORT_LAZY_DYNAMIC", "maybe", ["ORT_LAZY_DYNAMIC", "boolean"]),
        ("ORT_LAZY_RUN_TYPE", "fast", ["ORT_LAZY_RUN_TYPE", "ort, pytorch, debug"]),
        ("ORT_LAZY_MIN_BLOCK_SIZE", "0", ["ORT_LAZY_MIN_BLOCK_SIZE", ">= 1"]),
        ("ORT_LAZY_CACHE_SIZE", "x", ["ORT_LAZY_CACHE_SIZE", "integer"]),
        ("ORT_LAZY_SESSION_OPTIONS", "{bad", ["ORT_LAZY_SESSION_OPTIONS", "JSON"]),
    ],
)
def test_invalid_env_values_name_the_variable(var, value, words):
    with pytest.raises(OptionsError) as e:
        Options.from_env({var: value})
    for w in words:
        assert w in str(e.value)


def test_unknown_option_keyword():
    with pytest.raises(OptionsError, match="unknown option"):
        Options.from_env({}, no_such_thing=1)


def test_invalid_option_through_torch_compile_is_clear():
    f = torch.compile(lambda x: x + 1, backend="ort", options={"run_type": "fastest"})
    with pytest.raises(Exception, match="run_type"):
        f(torch.ones(1))


def test_provider_aliases_and_order():
    assert Options(providers="cuda,cpu").providers == ("CUDAExecutionProvider", "CPUExecutionProvider")
    assert Options(providers=["CPUExecutionProvider"]).providers == ("CPUExecutionProvider",)


@pytest.mark.parametrize(
    "value,words",
    [
        ("aten.reluu", ["torch has no operator 'aten.reluu'", "did you mean aten.relu"]),
        ("aten::reluu", ["'aten::reluu'", "did you mean aten.relu"]),
        ("aten.add.Tensr", ["aten.add has no overload 'Tensr'", "did you mean aten.add.Tensor"]),
        ("sigmoidd", ["did you mean aten.sigmoid"]),
        ("aten.", ["torch has no operator"]),
    ],
)
def test_torch_executed_ops_are_checked_against_torch(value, words):
    with pytest.raises(OptionsError) as e:
        Options(torch_executed_ops=value)
    for w in words:
        assert w in str(e.value)


def test_session_options_enum_names_and_config_entries():
    import onnxruntime

    from ort_lazy.options import apply_session_options

    so = onnxruntime.SessionOptions()
    apply_session_options(so, {"graph_optimization_level": "enable_basic", "execution_mode": 1, "session.x.y": True})
    assert so.graph_optimization_level == onnxruntime.GraphOptimizationLevel.ORT_ENABLE_BASIC
    assert so.execution_mode == onnxruntime.ExecutionMode.ORT_PARALLEL
    assert so.get_session_config_entry("session.x.y") == "1"
    with pytest.raises(OptionsError, match="did you mean enable_mem_pattern"):
        Options(session_options={"enable_mem_patern": False})


def test_unknown_variables_suggest_the_closest_name():
    from ort_lazy.options import unknown_variables

    found = dict(unknown_variables({"ORT_LAZY_DYNMAIC": "0", "ORT_LAZY_METRICS_FILE": "x", "ORT_LAZY_DYNAMIC": "1", "OTHER": "1"}))
    assert list(found) == ["ORT_LAZY_DYNMAIC"] and "did you mean ORT_LAZY_DYNAMIC?" in found["ORT_LAZY_DYNMAIC"]


def test_replace_refuses_unknown_fields():
    with pytest.raises(OptionsError, match="unknown option"):
        Options().replace(min_blocksize=2)
