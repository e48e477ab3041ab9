#!/usr/bin/env bash
# One device call: CUDA tests, the benchmark suite, and Nsight Compute on the workloads that
# miss the kernel targets. Usage there: source .whl/env.sh || exit; bash scripts/gpu_final.sh
export PYTHONPATH="$(pwd):${PYTHONPATH}" PYTHONUNBUFFERED=1 THUNDER_FUSER_CACHE=/tmp/tf-cache
mkdir -p "$OUT/results" "$OUT/ncu"
python -m pytest -q -p no:cacheprovider -rs tests/test_cuda_kernels.py tests/test_cuda_workloads.py 2>&1 | tail -15
python scripts/host_probe.py 2>&1 | tail -12
python -m benchmarks.run --out "$OUT/results" > "$OUT/results/stdout.txt" 2>&1; echo "suite rc=$?"
for w in "rotate-half + residual bf16" "RoPE Llama-3-8B bf16" "gelu(x + bias) bf16"; do
  f="$OUT/ncu/$(echo "$w" | tr -c 'a-zA-Z0-9' '_').txt"
  timeout 120 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats --section Occupancy \
    -k regex:cutlass --launch-skip 3 --launch-count 3 python -m benchmarks.profile_one "$w" > "$f" 2>&1
  echo "== $w"; grep -E "Kernel|kernel_|Memory Throughput|DRAM Throughput|Duration|Registers Per|Achieved Occupancy|Local|L1/TEX Hit|L2 Hit|Mem Busy|Max Bandwidth" "$f" | head -40
done
tail -3 "$OUT/results/stdout.txt"
