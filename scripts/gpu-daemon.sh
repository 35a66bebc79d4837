#!/usr/bin/env bash
# gpu-daemon.sh: kwarmd on the GPU machine: the Python serving demo, time
# from request to a launchable kernel in fresh processes (C and Python
# clients) beside Triton's first launch with a warm and a cold cache.
# Run from the repository root there; BUILD (default build-gpu), OUT.
set -uo pipefail
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT" /tmp/deps /tmp/kw
for f in .gpu/*.deb; do dpkg -x "$f" /tmp/deps; done
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
status=0
sock=/tmp/kw/kwarm.sock
model=tests/fixtures/deepseek-v3.2-exp.json

"$BUILD/test_client" --jobs 4 > "$OUT/test_client.log" 2>&1 || status=1
tail -n 1 "$OUT/test_client.log"

"$BUILD/kwarmd" --socket $sock --cache /tmp/kw/cache 2> "$OUT/kwarmd.log" &
pid=$!
for _ in $(seq 200); do "$BUILD/kwarm" ping --socket $sock >/dev/null 2>&1 && break; sleep 0.05; done

{
  echo "\$ python3 client/python/demo_serving.py --socket $sock --model $model --dcp-world 2 --dcp-rank 1"
  python3 client/python/demo_serving.py --socket $sock --model $model --dcp-world 2 --dcp-rank 1
} > "$OUT/demo.log" 2>&1 || status=1
cat "$OUT/demo.log"

"$BUILD/kwarm" warmup --socket $sock --model $model >> "$OUT/demo.log" 2>&1  # the default deployment
digest=$("$BUILD/kwarm" keys --model $model --json |
         python3 -c 'import json,sys; print(json.load(sys.stdin)["keys"][0]["digest"])')
{
  for i in $(seq 10); do "$BUILD/bench_coldstart" --socket $sock --digest "$digest"; done
} > "$OUT/coldstart_c.jsonl" 2>&1 || status=1
{
  for i in $(seq 10); do python3 bench/coldstart.py --socket $sock --digest "$digest"; done
} > "$OUT/coldstart_py.jsonl" 2>&1 || status=1
{
  for i in 1 2 3; do d=/tmp/tcache-cold-$i; rm -rf $d; python3 bench/triton_coldstart.py $d; done
  for i in 1 2 3 4 5; do python3 bench/triton_coldstart.py /tmp/tcache-cold-1; done
} > "$OUT/triton.jsonl" 2>&1 || status=1
head -n 2 "$OUT"/coldstart_c.jsonl "$OUT"/coldstart_py.jsonl; cat "$OUT/triton.jsonl"

kill -TERM $pid; wait $pid; echo "kwarmd exit $?" >> "$OUT/kwarmd.log"
exit $status
