#!/usr/bin/env python3
"""Triton's first launch of a simple kernel in a fresh process.

usage: triton_coldstart.py CACHE_DIR

Times, in a fresh process, from just after `import torch, triton` and CUDA
context creation to the end of the first launch of a small elementwise
kernel, with TRITON_CACHE_DIR=CACHE_DIR: run once on an empty directory
(cold: Triton compiles) and again (warm: Triton loads its cached cubin).
The kernel is of the same kind as kwarm's (a short integer kernel), so the
difference is what a compile cache lookup costs in each.
"""
import json
import os
import sys
import time

os.environ["TRITON_CACHE_DIR"] = sys.argv[1]
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402


@triton.jit
def add_one(x_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + 1, mask=mask)


def main():
    x = torch.zeros(4096, dtype=torch.int32, device="cuda")
    torch.cuda.synchronize()  # context created before the clock starts
    t0 = time.perf_counter()
    add_one[(4,)](x, 4096, BLOCK=1024)
    torch.cuda.synchronize()
    t1 = time.perf_counter()
    ok = bool((x == 1).all())
    print(json.dumps({"first_launch_ms": (t1 - t0) * 1e3, "correct": ok,
                      "triton": triton.__version__}))
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
