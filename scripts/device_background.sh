#!/usr/bin/env bash
# A benchmark longer than one device call (600 s at most): started in a process session of
# its own, it outlives the call that started it, and later calls wait for it and collect what
# it wrote. The lent machine goes back about 30 s after a call returns, so make the next call
# at once. Each call copies the job's folder to $OUT.
#
#   bash scripts/device_background.sh start NAME python -m benchmarks.models --out /tmp/bg/NAME/out ...
#   bash scripts/device_background.sh wait NAME 560    # returns when done or after 560 s
#
# The job's output is /tmp/bg/NAME/log, its exit status /tmp/bg/NAME/rc once it has ended;
# /tmp/bg/NAME/out is the place for its files.
set -u
what=$1; name=$2; shift 2
dir=/tmp/bg/$name
case $what in
  start)
    rm -rf "$dir"; mkdir -p "$dir/out"
    printf '%q ' "$@" > "$dir/cmd"
    setsid nohup bash -c "$(cat "$dir/cmd") > $dir/log 2>&1; echo \$? > $dir/rc" > /dev/null 2>&1 < /dev/null &
    echo "started $name: $(cat "$dir/cmd")"
    ;;
  wait)
    limit=${1:-560}; waited=0
    while [ ! -f "$dir/rc" ] && [ "$waited" -lt "$limit" ]; do sleep 5; waited=$((waited + 5)); done
    if [ -n "${OUT:-}" ]; then cp -r "$dir/." "$OUT/"; fi
    if [ -f "$dir/rc" ]; then echo "$name ended: rc $(cat "$dir/rc")"; else echo "$name still running after ${waited} s"; fi
    tail -n 40 "$dir/log"
    ;;
  *)
    echo "usage: $0 start NAME CMD... | wait NAME [SECONDS]" >&2; exit 2
    ;;
esac
