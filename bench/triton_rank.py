#!/usr/bin/env python3
"""Triton's start-up for as many kernel variants as one rank of kwarm loads.

usage: triton_rank.py --variants N --cache DIR [--json F]

The peer of kwarm.torch.load() in bench/ops_bench.py's start-up table: in
this fresh process, after `import torch, triton` and CUDA context
creation, the time until N specialisations of one small Triton kernel
(each a distinct set of constexprs, as each of kwarm's keys is a distinct
set of template arguments) have each been launched once, with
TRITON_CACHE_DIR=DIR.  Run it on an empty DIR (cold: Triton compiles every
variant) and again on the same DIR (warm: Triton finds each in its cache).
The kernel is small, so this is a floor: Triton's real DSA kernels compile
for longer, and their cache lookups cost the same.  Same method as
bench/triton_coldstart.py, for N kernels instead of one.
"""
import argparse
import json
import os
import sys
import time


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--variants", type=int, required=True,
                    help="how many specialisations to launch (a rank's keys)")
    ap.add_argument("--cache", required=True, help="TRITON_CACHE_DIR")
    ap.add_argument("--json", help="also write the result here")
    a = ap.parse_args()
    os.environ["TRITON_CACHE_DIR"] = a.cache
    import torch
    import triton
    import triton.language as tl

    @triton.jit
    def variant(x_ptr, n, A: tl.constexpr, B: tl.constexpr,
                BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        v = tl.load(x_ptr + offs, mask=mask)
        tl.store(x_ptr + offs, v * A + B, mask=mask)

    x = torch.ones(4096, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()  # context created before the clock starts
    t0 = time.perf_counter()
    for i in range(a.variants):
        variant[(4,)](x, 4096, A=1, B=i + 1, BLOCK=1024)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    want = 1 + a.variants * (a.variants + 1) // 2
    res = {"variants": a.variants, "ms": (t1 - t0) * 1e3,
           "correct": bool((x == want).all()), "triton": triton.__version__}
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    return 0 if res["correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
