#!/usr/bin/env bash
# One device call: the cuda-marked tests and the demo on the GPU machine.
# Usage there (from the checkout): source .whl/env.sh || exit; bash scripts/gpu_check.sh
set -o pipefail
export PYTHONPATH="$(pwd):${PYTHONPATH}" PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python -c "import torch, thunder; print('torch', torch.__version__, 'thunder', thunder.__version__)"
python -m pytest -q -p no:cacheprovider -rs tests/test_cuda_workloads.py tests/test_layout.py -s 2>&1 | tee "${OUT:-/tmp}/pytest_cuda.log" | grep -v "^$" | tail -40
python examples/demo.py 2>&1 | tail -5
