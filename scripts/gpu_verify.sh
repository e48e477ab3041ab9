#!/usr/bin/env bash
# One device call to verify and measure: every cuda-marked test (kernels, workloads, SDPA
# layouts, random programs on kernels), the demo, the host probe, the benchmark suite
# and Nsight Compute on the workloads named in NCU (';'-separated), each under its own time
# limit. Logs and results come back as one archive, $OUT/gpu.tgz.
# Usage there: source .whl/env.sh || exit; bash scripts/gpu_verify.sh [TEST_S] [SUITE_S]
# PARTS="tests" or PARTS="suite" runs one half (the two fit one call's 10 minutes only barely).
# TESTS names the test files (default: all the files with cuda tests); since session 16 the
# cuda tests take about 9 minutes cold, so two calls: TESTS=tests/test_cuda_kernels.py, then the rest.
export PYTHONPATH="$(pwd):${PYTHONPATH}" PYTHONUNBUFFERED=1 THUNDER_FUSER_CACHE=/tmp/tf-cache
R=/tmp/gpu; mkdir -p "$R/results" "$R/ncu"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
# the packed wheels come without bytecode (pip compiles it at install): without it every
# process re-compiles TVM-FFI's and CuTe DSL's sources, which the cache timings would count
python -m compileall -q -j 0 /tmp/site > /dev/null 2>&1
if [[ "${PARTS:-tests suite}" == *tests* ]]; then
timeout "${1:-280}" python -m pytest -q -p no:cacheprovider -rfEs -m cuda ${TESTS:-tests/test_cuda_kernels.py \
  tests/test_cuda_workloads.py tests/test_layout.py tests/test_matmul_layouts.py \
  tests/test_pointwise_properties.py tests/test_resize_properties.py tests/test_inplace_properties.py} > "$R/pytest.log" 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|^FAILED|^ERROR|^E  " "$R/pytest.log" | tail -30
python examples/demo.py 2>&1 | tail -1
fi
if [[ "${PARTS:-tests suite}" == *suite* ]]; then
timeout 60 python scripts/host_probe.py 2>&1 | tail -17
timeout "${2:-240}" python -m benchmarks.run --out "$R/results" > "$R/results/stdout.txt" 2>&1; echo "suite rc=$?"
python -m benchmarks.summary "$R/results" 2>&1 | head -40
fi
IFS=';' read -ra names <<< "${NCU:-}"
for w in "${names[@]}"; do
  f="$R/ncu/$(echo "$w" | tr -c 'a-zA-Z0-9' '_').txt"
  timeout 90 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
    --section WarpStateStats -k regex:kernel_cutlass --launch-skip 2 --launch-count 4 python -m benchmarks.profile_one "$w" > "$f" 2>&1
  echo "== $w"; grep -E "^  [a-z_]+kernel|Memory Throughput|DRAM Throughput|Duration|Compute \(SM\)|Registers Per|Achieved Occupancy|Grid Size" "$f" | head -20
done
tar czf "$OUT/gpu.tgz" -C "$R" .
