#!/usr/bin/env bash
# One device call to verify and measure: the CUDA tests (gated templates on), the host probe,
# and the benchmark suite, each under its own time limit, logs under $OUT.
# Usage there: source .whl/env.sh || exit; bash scripts/gpu_verify.sh [TEST_S] [SUITE_S]
export PYTHONPATH="$(pwd):${PYTHONPATH}" PYTHONUNBUFFERED=1 THUNDER_FUSER_CACHE=/tmp/tf-cache
mkdir -p "$OUT/results"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
timeout "${1:-280}" python -m pytest -q -p no:cacheprovider -rfEs tests/test_cuda_kernels.py tests/test_cuda_workloads.py \
  > "$OUT/pytest.log" 2>&1; echo "pytest rc=$?"
grep -E "passed|failed|^FAILED|^ERROR" "$OUT/pytest.log" | tail -30
timeout 60 python scripts/host_probe.py 2>&1 | tail -12
THUNDER_FUSER_UNVERIFIED="${THUNDER_FUSER_UNVERIFIED-all}" timeout "${2:-240}" \
  python -m benchmarks.run --out "$OUT/results" > "$OUT/results/stdout.txt" 2>&1; echo "suite rc=$?"
python -m benchmarks.summary "$OUT/results" 2>&1 | head -40
