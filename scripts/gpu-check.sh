#!/usr/bin/env bash
# gpu-check.sh: everything kwarm checks on a GPU machine, in one go.
#
# Run from the repository root on the GPU machine, with a build made on the
# development machine (BUILD, default build-gpu) and the Debian runtime
# libraries it links in .gpu/ (see ../shared/gpu/README.md).  Logs go to
# OUT (default ./gpu-out):
#   tests.log        the criterion suites that touch the GPU
#   verify.log       kwarm verify on every fixture, DCP worlds 1/2/4/8,
#                    interleaves 1 and 16, every rank
#   bench.log/json   bench_kernels (production sizes vs copy bandwidth)
#   topk.log/json    dcp_stable_topk vs torch.topk + stable tie-break
#   indexer.log/json indexer_logits / indexer_topk vs _scaled_mm, torch,
#                    Triton and torch.topk; QGMMA count of the prefill cubin;
#                    the decode keys again beside a copy before and after
#   ops.log          the serving contract (issue 22): test_ops on the GPU,
#                    the README's C example against a real kwarmd, and
#                    kwarm.torch (tests/python/gpu_ops.py: every op against
#                    its reference, the DSA pipelines eager, graphed and
#                    under torch.compile, capture misses)
# ONLY=ops runs the serving contract's part alone.
set -uo pipefail
BUILD=${BUILD:-build-gpu}
OUT=${OUT:-gpu-out}
mkdir -p "$OUT" /tmp/deps /tmp/kw-dump /tmp/kw-idx
for f in .gpu/*.deb; do dpkg -x "$f" /tmp/deps; done
export LD_LIBRARY_PATH=/tmp/deps/usr/lib/x86_64-linux-gnu:/usr/local/cuda/lib64:${LD_LIBRARY_PATH:-}
status=0

nvidia-smi -L | tee "$OUT/device.txt"

# The serving contract: C through kw_ops, then kwarm.torch, against one
# kwarmd that really compiles (its cache in /tmp, 16 compile workers).
ops_check() {
  local d=/tmp/kw-ops-gpu
  rm -rf "$d" && mkdir -p "$d"
  "$BUILD/test_ops" --jobs 1 --filter 'ops/on_a_gpu*' || status=1
  "$BUILD/kwarmd" --socket "$d/s.sock" --cache "$d/cache" --jobs 16 \
    > "$d/kwarmd.log" 2>&1 &
  local pid=$!
  for _ in $(seq 100); do [ -S "$d/s.sock" ] && break; sleep 0.1; done
  if [ -x "$BUILD/serve" ]; then
    echo "\$ serve tests/fixtures/deepseek-v3.2-exp.json"
    KWARM_SOCKET="$d/s.sock" LD_LIBRARY_PATH="$BUILD/prefix/lib:$LD_LIBRARY_PATH" \
      "$BUILD/serve" tests/fixtures/deepseek-v3.2-exp.json || status=1
  fi
  if [ -f tests/python/gpu_ops.py ]; then
    KWARM_SOCKET="$d/s.sock" KWARM_LIBRARY="$BUILD/libkwarm.so" \
      PYTHONPATH=client/python PYTHONUNBUFFERED=1 \
      python3 tests/python/gpu_ops.py --socket "$d/s.sock" --kwarmd "$BUILD/kwarmd" \
        --out "$OUT" || status=1
  fi
  "$BUILD/kwarm" misses --socket "$d/s.sock" | tail -n 5
  kill "$pid"; wait "$pid"
  [ -x "$BUILD/bench_ops" ] && { "$BUILD/bench_ops" --json "$OUT/ops_host.json" || status=1; }
}
ops_check > "$OUT/ops.log" 2>&1
tail -n 20 "$OUT/ops.log"
[ "${ONLY:-}" = ops ] && exit $status

{
  for t in test_cuda test_kcheck test_jit; do
    [ -x "$BUILD/$t" ] && "$BUILD/$t" --jobs 4 || status=1
  done
} > "$OUT/tests.log" 2>&1
tail -n 3 "$OUT/tests.log"

{
  for m in tests/fixtures/*.json; do
    for d in "" "--dcp-world 2" "--dcp-world 2 --dcp-interleave 16" \
             "--dcp-world 4" "--dcp-world 4 --dcp-interleave 16" \
             "--dcp-world 8" "--dcp-world 8 --dcp-interleave 16" \
             "--dcp-world 8 --dcp-rank 3 --dcp-interleave 16 --pcp 2"; do
      echo "\$ kwarm verify --model $m $d"
      # shellcheck disable=SC2086
      "$BUILD/kwarm" verify --model "$m" $d || status=1
      echo
    done
  done
} > "$OUT/verify.log" 2>&1
grep -c "0 failed" "$OUT/verify.log"

"$BUILD/bench_kernels" --json "$OUT/bench.json" --dump /tmp/kw-dump > "$OUT/bench.log" 2>&1 || status=1
cat "$OUT/bench.log"
python3 bench/topk_torch.py /tmp/kw-dump --json "$OUT/topk.json" > "$OUT/topk.log" 2>&1 || status=1
cat "$OUT/topk.log"
"$BUILD/bench_indexer" /tmp/kw-idx > "$OUT/indexer.log" 2>&1 || status=1
echo "QGMMA: $(cuobjdump --dump-sass /tmp/kw-idx/logits_prefill.cubin | grep -c QGMMA)" >> "$OUT/indexer.log"
python3 bench/indexer_bench.py /tmp/kw-idx --json "$OUT/indexer.json" >> "$OUT/indexer.log" 2>&1 || status=1
python3 bench/indexer_decode.py /tmp/kw-idx >> "$OUT/indexer.log" 2>&1 || status=1
cat "$OUT/indexer.log"
exit $status
