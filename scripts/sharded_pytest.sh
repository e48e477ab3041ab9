#!/usr/bin/env bash
# The cuda-marked tests of the given files in SHARDS parallel pytest processes (default 4):
# a cold run is bound by kernel compiles, one core per process, and the GPU machine has 16.
# Each shard logs to LOGDIR/shard.NN.log; prints the shards' summaries and failures, and
# exits non-zero where any shard failed.
# Usage there: SHARDS=4 bash scripts/sharded_pytest.sh LOGDIR tests/test_cuda_kernels.py ...
set -u
shards=${SHARDS:-4}; logdir=$1; shift
mkdir -p "$logdir"
python -m pytest --collect-only -q -p no:cacheprovider -m cuda "$@" 2>/dev/null | grep "::" > "$logdir/ids.txt"
split -n "r/$shards" -d "$logdir/ids.txt" "$logdir/shard."
pids=()
for f in "$logdir"/shard.[0-9][0-9]; do
  mapfile -t ids < "$f"
  python -m pytest -q -p no:cacheprovider -rfE -m cuda "${ids[@]}" > "$f.log" 2>&1 &
  pids+=($!)
done
rc=0
for p in "${pids[@]}"; do wait "$p" || rc=1; done
grep -hE "passed|failed|error" "$logdir"/shard.*.log | grep -E "^[0-9=]" ; grep -h "^FAILED\|^ERROR" "$logdir"/shard.*.log
exit $rc
