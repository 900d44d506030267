"""TensorRT: the provider options ort-lazy computes (engine cache, float16, shape profiles, device
and stream), its provider list and region form, and the runner's profiles.

The first part runs everywhere: options are plain data, and the runner's profile handling is
driven through a session factory that makes CPU sessions while reporting TensorRT. The second
part (``test_gpu_*``) runs a GPU with onnxruntime-gpu and TensorRT installed
(``ci/gpu_check.sh``) and is skipped, with the reason, elsewhere: parity with eager PyTorch and
proof that TensorRT ran (its node count in ORT's assignment record).
"""

from __future__ import annotations

import copy
import functools
import logging
import os
import stat
import sys
import types
from typing import Any

import pytest
import torch

from helpers import assert_close, captured_exports, compile_ort, max_rel_error, take_sessions, trt_problem
from ort_lazy import Options, metrics
from ort_lazy.export import fx as export_fx
from ort_lazy.export import half
from ort_lazy.export.fx import export_graph
from ort_lazy.options import OptionsError
from ort_lazy.runtime import providers as eps
from ort_lazy.runtime import session as session_mod
from ort_lazy.runtime import session_create, tensorrt
from ort_lazy.runtime.session import OrtRunner
from ort_lazy.runtime.session_cache import session_cache
from ort_lazy.runtime.session_create import OrtInputError, OrtRunError
from ort_lazy.specs import TensorSpec

TRT, CUDA, CPU = "TensorrtExecutionProvider", "CUDAExecutionProvider", "CPUExecutionProvider"
_CPU_DEVICE = torch.device("cpu")


@pytest.fixture(autouse=True)
def _own_cache_home(tmp_path, monkeypatch):
    """The default engine folder (no ``cache_dir``) under the test's own directory, not the
    user's ``~/.cache``."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache-home"))


def _spec(*shape: int | str) -> TensorSpec:
    return TensorSpec(torch.float32, tuple(shape), _CPU_DEVICE)


def _model(name: str = "m", body: bytes = b"model") -> Any:
    from ort_lazy.specs import OrtModel

    return OrtModel(body, ["x"], ["y"], [_spec("s0", 4)], [_spec("s0", 4)], name=name)


# --------------------------------------------------------------------------- options


def test_tensorrt_alone_becomes_tensorrt_cuda_cpu():
    """ORT gives what TensorRT's parser refuses to the providers after it: TensorRT alone is
    TensorRT, CUDA, CPU; a list the user wrote out stays as written."""
    full = (TRT, CUDA, CPU)
    assert Options(providers="tensorrt").providers == full
    assert Options(providers="trt").providers == full
    assert Options(providers=[TRT]).providers == full
    assert Options.from_env({"ORT_LAZY_PROVIDERS": "TensorRT"}).providers == full
    assert Options(providers="tensorrt,cpu").providers == (TRT, CPU)
    assert Options(providers="tensorrt,cuda").providers == (TRT, CUDA)
    assert Options().replace(providers="tensorrt").providers == full


def test_int8_dynamic_is_refused_with_tensorrt():
    with pytest.raises(OptionsError, match="int8-dynamic.*calibration"):
        Options(providers="tensorrt", precision="int8-dynamic")
    with pytest.raises(OptionsError, match="int8-dynamic"):
        Options.from_env({"ORT_LAZY_PRECISION": "int8-dynamic"}, providers="tensorrt,cpu")
    assert Options(providers="cuda", precision="int8-dynamic").precision == "int8-dynamic"
    assert Options(providers="tensorrt", precision="fp16").precision == "fp16"


@pytest.mark.parametrize("bad", ["0.5", "abc", "inf", 0])
def test_trt_profile_scale_is_checked(bad):
    with pytest.raises(OptionsError, match="trt_profile_scale"):
        Options(trt_profile_scale=bad)


def test_trt_profile_scale_from_env():
    assert Options().trt_profile_scale == 2.0
    assert Options.from_env({"ORT_LAZY_TRT_PROFILE_SCALE": "1.5"}).trt_profile_scale == 1.5


def test_region_form_for_tensorrt():
    """TensorRT's parser needs typed values and no local functions, reads standard ops only (a
    contrib op would cut its engine), takes dynamic shapes (profiles) and writes GPU memory."""
    form = eps.region_form((TRT, CUDA, CPU))
    assert not form.own
    assert form.typed_values and form.inline_functions
    assert not form.contrib_ops and not form.fused_attention
    assert not form.static_shapes
    assert form.max_opset is None
    assert not form.host_outputs
    assert eps.kernel_providers((TRT, CUDA, CPU)) == [CUDA, CPU]


# --------------------------------------------------------------------------- profiles


def test_profile_from_symbolic_specs():
    """min 1 for each symbolic dim, opt the call's size, max the scale times it; static dims
    fixed; written in ORT's ``name:AxB,name2:...`` syntax."""
    profiled = tensorrt.profiled_inputs(["x", "w", "n"], [_spec("s0", 3, "s1"), _spec(3, 5), _spec("s0")])
    assert [name for _, name, _ in profiled] == ["x", "n"]
    profile = tensorrt.profile_for(profiled, {"x": (8, 3, 10), "n": (8,)}, 2.0)
    assert profile.provider_options() == {
        "trt_profile_min_shapes": "x:1x3x1,n:1",
        "trt_profile_opt_shapes": "x:8x3x10,n:8",
        "trt_profile_max_shapes": "x:16x3x20,n:16",
    }
    assert profile.covers({"x": (16, 3, 1), "n": (1,)})
    assert not profile.covers({"x": (17, 3, 1), "n": (1,)})
    assert not profile.covers({"x": (8, 3, 21), "n": (8,)})
    assert not profile.covers({"x": (8, 3), "n": (8,)})  # another rank
    odd = tensorrt.profile_for(profiled, {"x": (3, 3, 5), "n": (3,)}, 1.5)
    assert odd.ranges[0].max == (5, 3, 8)  # ceil(1.5 * size)


def test_profile_widens_and_never_narrows():
    profiled = tensorrt.profiled_inputs(["x"], [_spec("s0", 4)])
    first = tensorrt.profile_for(profiled, {"x": (8, 4)}, 2.0)
    wider = tensorrt.profile_for(profiled, {"x": (40, 4)}, 2.0, first)
    assert (wider.ranges[0].min, wider.ranges[0].opt, wider.ranges[0].max) == ((1, 4), (40, 4), (80, 4))
    assert wider.covers({"x": (1, 4)}) and wider.covers({"x": (16, 4)})
    empty = tensorrt.profile_for(profiled, {"x": (0, 4)}, 2.0, wider)  # an empty batch
    assert empty.ranges[0].min == (0, 4) and empty.ranges[0].max == (80, 4)
    assert empty.covers({"x": (0, 4)}) and empty.covers({"x": (80, 4)})


def test_no_profile_for_static_models_or_unwritable_names():
    assert tensorrt.profiled_inputs(["x"], [_spec(2, 3)]) == ()
    assert tensorrt.profiled_inputs(["a,b"], [_spec("s0")]) == ()
    assert tensorrt.profiled_inputs(["a:b"], [_spec("s0")]) == ()


def test_profiles_only_for_tensorrt_and_not_against_the_user():
    assert tensorrt.wants_profiles((TRT, CUDA, CPU), Options())
    assert not tensorrt.wants_profiles((CUDA, CPU), Options())
    mine = Options(provider_options={"tensorrt": {"trt_profile_max_shapes": "x:64x4"}})
    assert not tensorrt.wants_profiles((TRT, CUDA, CPU), mine)


# --------------------------------------------------------------------------- caches, precision


def test_engine_cache_in_the_cache_dir(tmp_path):
    opts = tensorrt.complete({}, Options(cache_dir=str(tmp_path)), _model(), None)
    folder = opts["trt_engine_cache_path"]
    assert os.path.dirname(folder) == str(tmp_path / "tensorrt")
    assert os.path.basename(folder).startswith("ort")
    assert os.path.isdir(folder) and stat.S_IMODE(os.stat(folder).st_mode) == 0o700
    assert opts["trt_engine_cache_enable"] == "1"
    assert opts["trt_timing_cache_enable"] == "1" and opts["trt_timing_cache_path"] == folder
    assert opts["trt_engine_cache_prefix"].startswith("ortlazy-" + _model().digest[:16] + "-")
    assert "trt_fp16_enable" not in opts and not any(k in opts for k in tensorrt.PROFILE_OPTIONS)


def test_engine_cache_default_folder_is_per_user(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    opts = tensorrt.complete({}, Options(), _model(), None)
    assert opts["trt_engine_cache_path"].startswith(str(tmp_path / "xdg" / "ort-lazy" / "tensorrt") + os.sep)


def test_unsafe_cache_folder_turns_the_engine_cache_off(tmp_path, caplog):
    """Engines are code the GPU runs: a folder others can write is refused, with a warning,
    as the compile cache refuses it."""
    folder = tmp_path / "tensorrt"
    folder.mkdir()
    os.chmod(folder, 0o777)
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        assert tensorrt._private_dir(str(folder)) is None
    assert "not cached" in caplog.text and "writable by other users" in caplog.text


def test_engine_prefix_tells_models_and_settings_apart(tmp_path):
    """ORT names an engine from value names only, which regions share: the prefix carries the
    model's digest and the options that shape the engine (not the device or stream)."""
    options = Options(cache_dir=str(tmp_path))
    a, b = _model(body=b"one"), _model(body=b"two")
    assert a.digest != b.digest
    prefix = functools.partial(lambda m, o: tensorrt.complete(o, options, m, None)["trt_engine_cache_prefix"])
    assert prefix(a, {}) != prefix(b, {})
    assert prefix(a, {}) != prefix(a, {"trt_builder_optimization_level": "5"})
    assert prefix(a, {}) == prefix(a, {"device_id": "1", "user_compute_stream": "77", "has_user_compute_stream": "1"})
    profiled = tensorrt.profiled_inputs(["x"], [_spec("s0", 4)])
    p8, p9 = (tensorrt.profile_for(profiled, {"x": (n, 4)}, 2.0) for n in (8, 9))
    with_profile = [tensorrt.complete({}, options, a, p)["trt_engine_cache_prefix"] for p in (p8, p9, p8)]
    assert with_profile[0] != with_profile[1] and with_profile[0] == with_profile[2]


def test_user_options_win(tmp_path, caplog):
    options = Options(cache_dir=str(tmp_path), precision="fp16")
    narrowed = _model()
    narrowed.facts[tensorrt.FLOAT16_FACT] = True
    profiled = tensorrt.profiled_inputs(["x"], [_spec("s0", 4)])
    profile = tensorrt.profile_for(profiled, {"x": (8, 4)}, 2.0)
    mine = {"trt_engine_cache_path": str(tmp_path / "mine"), "trt_fp16_enable": "0", "trt_profile_min_shapes": "x:2x4"}
    opts = tensorrt.complete(dict(mine), options, narrowed, profile)
    assert opts["trt_engine_cache_path"] == opts["trt_timing_cache_path"] == str(tmp_path / "mine")
    assert opts["trt_fp16_enable"] == "0"
    assert opts["trt_profile_min_shapes"] == "x:2x4" and "trt_profile_max_shapes" not in opts
    off = tensorrt.complete({"trt_engine_cache_enable": "False"}, options, narrowed, None)
    assert off["trt_engine_cache_enable"] == "False"
    assert not any(k in off for k in ("trt_engine_cache_path", "trt_timing_cache_enable", "trt_engine_cache_prefix"))
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        named = tensorrt.complete({"trt_engine_cache_prefix": "mine"}, options, narrowed, None)
    assert named["trt_engine_cache_prefix"] == "mine"
    assert "names every region's engines alike" in caplog.text


def test_fp16_only_for_models_ort_lazy_narrowed(tmp_path):
    """``precision="fp16"`` builds float16 engines of the inference regions the exporter
    narrowed; other models (training graphs, regions without weights) keep their dtypes."""
    options = Options(cache_dir=str(tmp_path), precision="fp16")
    narrowed = _model()
    narrowed.facts[tensorrt.FLOAT16_FACT] = True
    opts = tensorrt.complete({}, options, narrowed, None)
    assert opts["trt_fp16_enable"] == "1" and opts["trt_layer_norm_fp32_fallback"] == "1"
    assert "trt_fp16_enable" not in tensorrt.complete({}, options, _model(), None)
    assert "trt_fp16_enable" not in tensorrt.complete({}, Options(cache_dir=str(tmp_path)), narrowed, None)


def test_export_marks_the_models_it_narrows(monkeypatch):
    """The exporter records :data:`tensorrt.FLOAT16_FACT` on inference models it narrowed to
    float16, and only there (the float16 narrowing is simulated as for a GPU, see test_half)."""
    monkeypatch.setattr(export_fx, "narrow_to_float16", functools.partial(half.narrow_to_float16, exact=False))
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)).eval()
    x = torch.randn(3, 16)
    with torch.no_grad(), captured_exports() as fp16:
        compile_ort(model, precision="fp16")(x)
    with torch.no_grad(), captured_exports() as fp32:
        compile_ort(model)(x)
    assert fp16 and all(m.facts.get(tensorrt.FLOAT16_FACT) for m in fp16)
    assert fp32 and not any(m.facts.get(tensorrt.FLOAT16_FACT) for m in fp32)


class _Stream:
    cuda_stream = 4321


def test_provider_options_on_cuda(monkeypatch, tmp_path, caplog):
    """On a CUDA device TensorRT gets the device and torch's current stream as CUDA does (no
    ``use_tf32``: ORT's TensorRT provider has no such option; said once when torch forbids
    TF32), then its caches; CPU sessions get none of it."""
    monkeypatch.setattr(torch.cuda, "current_stream", lambda index=None: _Stream())
    monkeypatch.setattr(session_create, "cuda_tf32", lambda: False)
    options = Options(providers="tensorrt", cache_dir=str(tmp_path))
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        opts = session_create.provider_options_for(TRT, options, torch.device("cuda", 1), _model())
        session_create.provider_options_for(TRT, options, torch.device("cuda", 1), _model())
    assert opts["device_id"] == "1"
    assert opts["has_user_compute_stream"] == "1" and opts["user_compute_stream"] == "4321"
    assert "use_tf32" not in opts
    assert opts["trt_engine_cache_enable"] == "1"
    assert caplog.text.count("TF32") == 1
    cuda = session_create.provider_options_for(CUDA, options, torch.device("cuda", 1))
    assert cuda["user_compute_stream"] == "4321" and cuda["use_tf32"] == "0"
    mine = Options(providers="tensorrt", provider_options={"tensorrt": {"device_id": 0, "user_compute_stream": "9"}})
    opts = session_create.provider_options_for(TRT, mine, torch.device("cuda", 1), _model())
    assert opts["device_id"] == "0" and opts["user_compute_stream"] == "9"
    cpu = session_create.provider_options_for(TRT, options, _CPU_DEVICE, _model())
    assert "device_id" not in cpu and "user_compute_stream" not in cpu


# --------------------------------------------------------------------------- the runner's profiles


def _symbolic_model(fn, *example) -> Any:
    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(fn, tracing_mode="symbolic")(*example)
    return export_graph(gm, "trt_test")


class _Sessions:
    """A ``create_session`` making CPU sessions that report TensorRT, recording each profile;
    ``refuse(profile)`` True makes one fail as an engine build would."""

    def __init__(self, refuse=lambda profile: False) -> None:
        self.profiles: list[Any] = []
        self.refuse = refuse
        self.real = session_create.create_session

    def __call__(self, model, options, device, spinning, threads=None, initializers=None, profile=None):
        self.profiles.append(profile)
        if profile is not None and self.refuse(profile):
            raise OrtRunError("TensorRT could not build the engine")
        sess, _, nodes = self.real(model, options.replace(providers="cpu"), device, spinning, threads, initializers)
        return sess, (TRT, CUDA, CPU), nodes


def test_runner_builds_the_profile_at_the_first_call_and_widens_it(monkeypatch):
    sessions = _Sessions()
    monkeypatch.setattr(session_mod, "create_session", sessions)
    model = _symbolic_model(lambda x: (x * 2).sum(0), torch.randn(5, 3))
    assert all(isinstance(d, str) for d in model.input_specs[0].shape)  # both dims symbolic
    name = model.input_names[0]
    runner = OrtRunner(model, Options(providers="tensorrt"), _CPU_DEVICE)
    assert runner.session is None and sessions.profiles == []  # waits for a call's sizes
    for n in (6, 3, 12, 1):  # opt 6: 1..12 covered
        x = torch.randn(n, 3)
        assert_close(runner.run([x])[0], (x * 2).sum(0))
    assert len(sessions.profiles) == 1
    assert sessions.profiles[0].provider_options() == {
        "trt_profile_min_shapes": f"{name}:1x1",
        "trt_profile_opt_shapes": f"{name}:6x3",
        "trt_profile_max_shapes": f"{name}:12x6",
    }
    first_key = runner.cache_key
    x = torch.randn(13, 3)  # past the profile: a wider one
    assert_close(runner.run([x])[0], (x * 2).sum(0))
    assert len(sessions.profiles) == 2 and runner.profile is sessions.profiles[1]
    assert runner.profile.provider_options() == {
        "trt_profile_min_shapes": f"{name}:1x1",
        "trt_profile_opt_shapes": f"{name}:13x3",
        "trt_profile_max_shapes": f"{name}:26x6",
    }
    assert metrics.counters()["trt_profile_rebuilds"] == 1
    assert first_key not in session_cache() and runner.cache_key in session_cache()
    for n in (2, 26):
        x = torch.randn(n, 3)
        assert_close(runner.run([x])[0], (x * 2).sum(0))
    assert len(sessions.profiles) == 2


def test_runner_keeps_its_profile_when_a_wider_one_fails(monkeypatch):
    """A call past the profile whose engine cannot be built runs in PyTorch (this call only);
    calls inside the profile keep running on the session they had, and no second attempt is
    made for later calls past it."""
    sessions = _Sessions(refuse=lambda profile: profile.ranges[0].opt[0] > 8)
    monkeypatch.setattr(session_mod, "create_session", sessions)
    model = _symbolic_model(lambda x: x + 1, torch.randn(5, 2))
    runner = OrtRunner(model, Options(providers="tensorrt", trt_profile_scale=1), _CPU_DEVICE)
    x = torch.randn(4, 2)
    assert_close(runner.run([x])[0], x + 1)
    with pytest.raises(OrtInputError, match="no TensorRT profile"):
        runner.run([torch.randn(9, 2)])
    with pytest.raises(OrtInputError, match="outside its TensorRT profile"):
        runner.run([torch.randn(10, 2)])
    assert len(sessions.profiles) == 2
    x = torch.randn(3, 2)
    assert_close(runner.run([x])[0], x + 1)


def test_runner_waiting_for_a_profile_has_no_lean_call(monkeypatch):
    """``tensor_call`` runs the session it was made for and fits no profile: a runner whose
    TensorRT profile is still to fit (before and after its first session) gives none, so its
    callers use ``run``, which widens; a TensorRT session without profiles has one."""
    sessions = _Sessions()
    monkeypatch.setattr(session_mod, "create_session", sessions)
    runner = OrtRunner(_symbolic_model(lambda x: x + 1, torch.randn(5, 2)), Options(providers="tensorrt"), _CPU_DEVICE)
    assert runner.tensor_call() is None
    x = torch.randn(4, 2)
    assert_close(runner.run([x])[0], x + 1)
    assert runner.tensor_call() is None
    static = OrtRunner(export_graph(_static_graph(), "static"), Options(providers="tensorrt"), _CPU_DEVICE)
    call = static.tensor_call()
    assert call is not None and static.profile is None
    x = torch.randn(2, 2)
    assert_close(call([x])[0], x + 1)


def test_runner_first_session_failure_is_lasting(monkeypatch):
    monkeypatch.setattr(session_mod, "create_session", _Sessions(refuse=lambda profile: True))
    runner = OrtRunner(_symbolic_model(lambda x: x + 1, torch.randn(5, 2)), Options(providers="tensorrt"), _CPU_DEVICE)
    with pytest.raises(OrtRunError) as info:
        runner.run([torch.randn(4, 2)])
    assert info.value.lasting


def test_static_models_and_other_providers_open_at_once(monkeypatch):
    sessions = _Sessions()
    monkeypatch.setattr(session_mod, "create_session", sessions)
    static = export_graph(_static_graph(), "static")
    runner = OrtRunner(static, Options(providers="tensorrt"), _CPU_DEVICE)
    assert runner.session is not None and sessions.profiles == [None]
    mine = Options(providers="tensorrt", provider_options={"tensorrt": {"trt_profile_min_shapes": "x:1x2"}})
    OrtRunner(_symbolic_model(lambda x: x + 1, torch.randn(5, 2)), mine, _CPU_DEVICE)
    assert sessions.profiles == [None, None]


def _static_graph() -> torch.fx.GraphModule:
    from torch.fx.experimental.proxy_tensor import make_fx

    return make_fx(lambda x: x + 1, tracing_mode="fake")(torch.randn(2, 2))


def test_dynamo_graph_on_tensorrt_profiles(monkeypatch):
    """End to end through torch.compile: a symbolic graph's runner profiles its first call's
    sizes and widens once a call passes them; every result is eager's."""
    sessions = _Sessions()
    monkeypatch.setattr(session_mod, "create_session", sessions)
    monkeypatch.setattr("ort_lazy.frontends.settings.provider_problem", lambda providers: None)

    def f(x, y):
        return torch.tanh(x @ y) + x.sum(-1, keepdim=True)

    torch._dynamo.reset()
    compiled = torch.compile(f, backend="ort", dynamic=True, options={"providers": "tensorrt"})
    y = torch.randn(8, 8)
    for n in (5, 7, 10, 11, 3):
        x = torch.randn(n, 8)
        assert_close(compiled(x, y), f(x, y))
    profiled = [p for p in sessions.profiles if p is not None]
    assert [p.ranges[0].opt[0] for p in profiled] == [5, 11]
    assert metrics.counters()["trt_profile_rebuilds"] == 1
    assert metrics.counters()["ort_runs"] == 5


# --------------------------------------------------------------------------- when TensorRT cannot load


class _FallingBackOrt:
    """onnxruntime as onnxruntime-gpu without libnvinfer: it lists TensorRT, and a session asked
    for it comes back with CUDA and CPU (ORT's Python fallback drops the provider options)."""

    def __init__(self, real: types.ModuleType) -> None:
        self.real = real
        self.__version__ = real.__version__
        self.__file__ = real.__file__
        self.SessionOptions = real.SessionOptions
        self.RunOptions = real.RunOptions
        self.calls: list[tuple[list[str], list[dict[str, str]]]] = []
        outer = self

        class InferenceSession:
            def __init__(self, model, sess_options=None, providers=(), provider_options=(), **kwargs):
                outer.calls.append((list(providers), list(provider_options)))
                self._real = real.InferenceSession(model, sess_options=sess_options, providers=[CPU], **kwargs)
                self._sess = self._real._sess
                self._providers = [p for p in providers if p != TRT]

            def get_providers(self):
                return self._providers

            def __getattr__(self, name):
                return getattr(self._real, name)

        self.InferenceSession = InferenceSession

    def get_available_providers(self) -> list[str]:
        return [TRT, CUDA, CPU]


def test_session_without_tensorrt_is_made_again_with_our_options(monkeypatch, caplog):
    from ort_lazy.runtime import flavour

    fake = _FallingBackOrt(flavour.onnxruntime())
    monkeypatch.setattr(session_create, "onnxruntime", lambda: fake)
    monkeypatch.setattr(tensorrt, "onnxruntime", lambda: fake)
    monkeypatch.setattr(tensorrt, "_unusable", {})
    monkeypatch.setattr(tensorrt, "_library_names", lambda: ["/nonexistent/libnvinfer.so.10"])
    model = _symbolic_model(lambda x: x * 3, torch.randn(4, 2))
    options = Options(providers="tensorrt", provider_options={"cuda": {"arena_extend_strategy": "kSameAsRequested"}})
    with caplog.at_level(logging.WARNING, logger="ort_lazy"):
        sess, made, _ = session_create.create_session(model, options, _CPU_DEVICE, False)
        session_create.create_session(model, options, _CPU_DEVICE, False)
    assert made == (CUDA, CPU)
    assert [providers for providers, _ in fake.calls] == [[TRT, CUDA, CPU], [CUDA, CPU], [CUDA, CPU]]
    assert fake.calls[1][1][0] == {"arena_extend_strategy": "kSameAsRequested"}  # ours, not ORT's bare fallback
    assert caplog.text.count("TensorRT cannot run here") == 1 and "libnvinfer does not load" in caplog.text
    assert tensorrt.usable_providers((TRT, CUDA, CPU)) == (CUDA, CPU)
    x = torch.randn(4, 2)
    runner = OrtRunner(model, options, _CPU_DEVICE)  # no profiles without TensorRT
    assert runner.session is not None and runner.profile is None
    assert_close(runner.run([x])[0], x * 3)


def test_library_problem(monkeypatch):
    from ort_lazy.runtime import flavour

    real = flavour.onnxruntime()
    if TRT not in real.get_available_providers():
        assert "is not in the installed onnxruntime" in tensorrt.library_problem()
    listed = types.SimpleNamespace(get_available_providers=lambda: [TRT, CUDA, CPU], __version__="1.99", __file__=real.__file__)
    monkeypatch.setattr(tensorrt, "onnxruntime", lambda: listed)

    def no_library(name: str) -> None:
        raise OSError(f"{name}: cannot open shared object file")

    monkeypatch.setattr(tensorrt.ctypes, "CDLL", no_library)
    problem = tensorrt.library_problem()
    assert problem is not None and "libnvinfer does not load" in problem
    monkeypatch.setattr(tensorrt.ctypes, "CDLL", lambda name: object())
    assert tensorrt.library_problem() is None


def test_library_names_look_in_pip_and_onnxruntime_folders(monkeypatch, tmp_path):
    (tmp_path / "libnvinfer.so.10").write_bytes(b"")
    (tmp_path / "libnvinfer_plugin.so.10").write_bytes(b"")
    spec = types.SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    monkeypatch.setattr(tensorrt.importlib.util, "find_spec", lambda name: spec if name == "tensorrt_libs" else None)
    names = tensorrt._library_names()
    if sys.platform != "win32":
        assert names[0] == str(tmp_path / "libnvinfer.so.10")
        assert str(tmp_path / "libnvinfer_plugin.so.10") not in names
        assert "libnvinfer.so.10" in names


# --------------------------------------------------------------------------- on a GPU with TensorRT

_PROBLEM = trt_problem()
gpu = pytest.mark.skipif(_PROBLEM is not None, reason=f"TensorRT: {_PROBLEM}")


def _trt_sessions() -> list[Any]:
    sessions = take_sessions()
    assert sessions, "no ORT session was created"
    for s in sessions:
        assert s.get_providers()[0] == TRT, s.get_providers()
    return sessions


def _assert_ran_on_tensorrt() -> None:
    """TensorRT took nodes (ORT's assignment record, 1.23+) and ORT ran."""
    assert metrics.counters()["ort_runs"] > 0, metrics.counters()
    assert metrics.counters()["ort_failures"] == 0, metrics.fallbacks()
    if eps.records_assignment():
        assert metrics.ep_nodes().get(TRT, 0) > 0, metrics.ep_nodes()


def _engines(folder: str) -> dict[str, float]:
    return {f: os.stat(os.path.join(folder, f)).st_mtime for f in os.listdir(folder) if f.endswith(".engine")}


@gpu
def test_gpu_inference_parity_and_engine_cache(tmp_path):
    """An inference model on TensorRT: eager's results (float32 products in TF32: TensorRT's
    default), the engine written to ort-lazy's cache folder under the model's prefix, and read
    back (not rebuilt) by a second compile."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.ReLU(), torch.nn.Flatten(), torch.nn.Linear(8 * 16 * 16, 10)
    ).cuda().eval()
    x = torch.randn(2, 3, 16, 16, device="cuda")
    with torch.no_grad():
        expected = model(x)
        actual = compile_ort(model, providers="tensorrt", cache_dir=str(tmp_path))(x)
    assert max_rel_error(actual, expected) < 5e-3
    _assert_ran_on_tensorrt()
    (session,) = _trt_sessions()
    opts = session.get_provider_options()[TRT]
    folder = opts["trt_engine_cache_path"]
    assert folder.startswith(str(tmp_path / "tensorrt"))
    assert opts["trt_engine_cache_prefix"].startswith("ortlazy-")
    engines = _engines(folder)
    assert engines and all(name.startswith(opts["trt_engine_cache_prefix"]) for name in engines)
    with torch.no_grad():
        again = compile_ort(model, providers="tensorrt", cache_dir=str(tmp_path))(x)
    assert_close(again, actual, rtol=1e-5, atol=1e-6)
    assert _engines(folder) == engines  # loaded, not built again


@gpu
def test_gpu_dynamic_shapes_profile_and_widening(tmp_path):
    """A symbolic graph: the session's profile is built for its first call, sizes up to twice
    that run on it, a larger one on a wider profile; every result is eager's."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.GELU(), torch.nn.Linear(64, 8)).cuda().eval()
    torch._dynamo.reset()
    compiled = torch.compile(model, backend="ort", dynamic=True, options={"providers": "tensorrt", "cache_dir": str(tmp_path)})
    with torch.no_grad():
        for n in (4, 8, 2, 9):
            x = torch.randn(n, 32, device="cuda")
            assert max_rel_error(compiled(x), model(x)) < 5e-3
    _assert_ran_on_tensorrt()
    assert metrics.counters()["trt_profile_rebuilds"] == 1
    sessions = _trt_sessions()
    maxima = sorted(s.get_provider_options()[TRT]["trt_profile_max_shapes"] for s in sessions)
    assert any(m.endswith(":18x32") or ":18x32," in m for m in maxima), maxima


@gpu
def test_gpu_fp16_engine(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.TransformerEncoderLayer(64, 4, 128, dropout=0.0, batch_first=True).cuda().eval()
    x = torch.randn(2, 16, 64, device="cuda")
    with torch.no_grad():
        expected = model(x)
        actual = compile_ort(model, providers="tensorrt", precision="fp16", cache_dir=str(tmp_path))(x)
    assert actual.dtype == torch.float32
    assert max_rel_error(actual, expected) < 2e-2
    _assert_ran_on_tensorrt()
    fp16 = [s.get_provider_options()[TRT].get("trt_fp16_enable") for s in _trt_sessions()]
    assert "1" in fp16, fp16


@gpu
def test_gpu_runs_on_torchs_current_stream(tmp_path):
    model = torch.nn.Linear(64, 64).cuda().eval()
    x = torch.randn(16, 64, device="cuda")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.no_grad(), torch.cuda.stream(side):
        out = compile_ort(model, providers="tensorrt", cache_dir=str(tmp_path))(x)
        expected = model(x)
    torch.cuda.synchronize()
    assert max_rel_error(out, expected) < 5e-3
    (session,) = _trt_sessions()
    opts = session.get_provider_options()[TRT]
    assert opts["has_user_compute_stream"] == "1"
    assert int(opts["user_compute_stream"]) == side.cuda_stream
    _assert_ran_on_tensorrt()


@gpu
def test_gpu_training_step_parity(tmp_path):
    """A training step with TensorRT first in the list: what it takes of the forward and
    backward graphs, the rest on CUDA; gradients as eager's within TF32's error."""
    torch.manual_seed(0)
    ref = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 4)).cuda()
    mine = copy.deepcopy(ref)
    compiled = compile_ort(mine, providers="tensorrt", cache_dir=str(tmp_path))
    x = torch.randn(16, 32, device="cuda")
    ref(x).pow(2).mean().backward()
    compiled(x).pow(2).mean().backward()
    for a, b in zip(mine.parameters(), ref.parameters()):
        assert max_rel_error(a.grad, b.grad) < 5e-3
    assert metrics.counters()["ort_runs"] >= 2 and metrics.counters()["ort_failures"] == 0, metrics.fallbacks()

