#!/usr/bin/env bash
# The GPU checks: run on a machine with an NVIDIA GPU, a CUDA build of torch and onnxruntime-gpu
# installed (CI machines have no GPU, so .ci/run skips these tests).
#
#   bash ci/gpu_check.sh [OUT_DIR] [BENCH_SECONDS]
#
# 1. environment report (GPU, torch, CUDA, onnxruntime and its providers)  -> OUT/env.txt
# 2. build and install ort-lazy with the bridge against the installed torch -> OUT/build.log
# 3. the CUDA parity tests: tests/test_cuda.py and the zoo on the GPU      -> OUT/tests.log, tests.xml
# 4. the TensorRT tests: tests/test_tensorrt.py (its GPU tests skip, with the reason, where
#    onnxruntime has no TensorrtExecutionProvider or libnvinfer does not load) -> OUT/tests-trt.log, tests-trt.xml
# 5. the benchmark on the GPU (eager, dynamo, Inductor, ort-lazy, its ORT floor, the best
#    direct ORT run), if BENCH_SECONDS > 0                                 -> OUT/bench.log, bench-cuda.json
# Every step runs even when an earlier one failed; the exit status is the tests' (steps 3 and 4).
# TESTS_TIMEOUT (seconds, default 1800) bounds step 3, TRT_TESTS_TIMEOUT (default 1200) step 4
# (TensorRT builds each engine once: seconds to minutes); TESTS_WORKERS (default 3) pytest-xdist
# workers share the GPU (a worker that crashes is replaced, the rest still run). BENCH_MODELS,
# BENCH_BACKENDS and BENCH_MAX_TIME narrow step 5 (bench.py's --models, --backends, --max-time).
set -u
cd "$(dirname "$0")/.."
out="${1:-gpu-check}"
bench_s="${2:-240}"
mkdir -p "$out"
py="${PYTHON:-python3}"

# onnxruntime-gpu finds cuBLAS, cuDNN, cuFFT and cuRAND through the loader: add the lib
# folders of the nvidia-* wheels torch was installed with, and TensorRT's (pip install
# tensorrt-cu12: the tensorrt_libs package).
purelib="$("$py" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
for d in "$purelib"/nvidia/*/lib "$purelib"/nvidia/cu*/lib "$purelib"/tensorrt_libs; do
    [ -d "$d" ] && LD_LIBRARY_PATH="$d:${LD_LIBRARY_PATH:-}"
done
export LD_LIBRARY_PATH

{
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv 2>&1
    "$py" - <<'EOF'
import platform
import torch
print("python", platform.python_version(), "torch", torch.__version__, "cuda", torch.version.cuda,
      "gpu", torch.cuda.get_device_name() if torch.cuda.is_available() else None)
import onnxruntime as ort
print("onnxruntime", ort.__version__, ort.__file__)
print("providers", ort.get_available_providers())
EOF
} > "$out/env.txt" 2>&1
cat "$out/env.txt"

echo "== build" | tee "$out/build.log"
if "$py" build.py --no_venv --skip_deps --use_cuda --enable_lazy_tensor --install >> "$out/build.log" 2>&1; then
    echo "built and installed" | tee -a "$out/build.log"
else
    echo "build failed (see build.log); the tests run from src/ without the bridge" | tee -a "$out/build.log"
    export PYTHONPATH="$PWD/src:${PYTHONPATH:-}"
fi

"$py" -m ort_lazy.cli info >> "$out/env.txt" 2>&1  # versions, providers, how the kernel list is read
"$py" -c 'from ort_lazy.runtime.tensorrt import library_problem as p; e = p(); print("tensorrt", "usable" if e is None else "not usable: " + e)' \
    >> "$out/env.txt" 2>&1
grep '^tensorrt' "$out/env.txt"

echo "== tests"
timeout "${TESTS_TIMEOUT:-1800}" "$py" -m pytest -p no:cacheprovider -rA -q -n "${TESTS_WORKERS:-3}" tests/test_cuda.py tests/models/test_zoo.py \
    -k "cuda" --junitxml="$out/tests.xml" > "$out/tests.log" 2>&1
status=$?
tail -n 60 "$out/tests.log"

echo "== tensorrt tests"
timeout "${TRT_TESTS_TIMEOUT:-1200}" "$py" -m pytest -p no:cacheprovider -rA -q -n 1 tests/test_tensorrt.py \
    --junitxml="$out/tests-trt.xml" > "$out/tests-trt.log" 2>&1
trt_status=$?
grep '^SKIPPED' "$out/tests-trt.log" | head -n 3  # the reason, where TensorRT cannot run
tail -n 30 "$out/tests-trt.log"
[ "$status" -eq 0 ] && status=$trt_status

if [ "$bench_s" -gt 0 ]; then
    echo "== bench"
    timeout "$bench_s" "$py" benchmarks/bench.py --device cuda --models "${BENCH_MODELS:-transformer,bert,gpt2,resnet,vit}" \
        --modes inference,train --backends "${BENCH_BACKENDS:-eager,dynamo,inductor,ort,floor,best-ort,ort-fp16}" \
        --max-time "${BENCH_MAX_TIME:-0.5}" --rounds 5 --warmup 10 --no-memory --json "$out/bench-cuda.json" --png "" -q \
        > "$out/bench.log" 2>&1
    echo "bench exit $?"
    tail -n 40 "$out/bench.log"
fi
exit $status
