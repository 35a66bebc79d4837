#!/usr/bin/env bash
# run-demo.sh: what `make run` does after building: start kwarmd on a socket
# and cache under the build tree, warm the embedded default model through
# it, fetch one kernel, print the daemon's stats, stop the daemon.
set -euo pipefail
BUILD=${1:-build}
MODEL=${2:-tests/fixtures/deepseek-v3.2-exp.json}
run="$BUILD/run"
mkdir -p "$run"
sock="$run/kwarm.sock"
export KWARM_SOCKET="$sock"

echo "== kwarmd --socket $sock --cache $run/cache"
"$BUILD/kwarmd" --socket "$sock" --cache "$run/cache" 2> "$run/kwarmd.log" &
pid=$!
trap 'kill $pid 2>/dev/null || true' EXIT
for _ in $(seq 100); do   # until it answers (bounded)
  "$BUILD/kwarm" ping >/dev/null 2>&1 && break
  sleep 0.05
done
"$BUILD/kwarm" ping

echo "== kwarm warmup --model $MODEL"
"$BUILD/kwarm" warmup --model "$MODEL"

digest=$("$BUILD/kwarm" keys --model "$MODEL" --json |
         python3 -c 'import json,sys; print(json.load(sys.stdin)["keys"][0]["digest"])')
echo "== kwarm get --digest ${digest:0:16}... -o $run/kernel.cubin"
"$BUILD/kwarm" get --digest "$digest" -o "$run/kernel.cubin"

echo "== kwarm stats"
"$BUILD/kwarm" stats

kill -TERM $pid
wait $pid
trap - EXIT
echo "== kwarmd stopped (exit 0); its log: $run/kwarmd.log"
