#!/usr/bin/env python3
"""Start-up cost of the indexer kernels in a fresh serving process.

usage: indexer_startup.py KWARM CACHE_DIR [--json F]

Times, in this fresh process, getting the four DeepSeek-V3.2 indexer
kernels (indexer_logits prefill and decode, indexer_topk windowed and not)
from a prewarmed kwarm cache with `kwarm get --cache` (one process per
kernel, as a launcher script would) and loading each with cuModuleLoadData
through cupy; the NVRTC side is bench_indexer's fresh-process compile.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

KEYS = [
    ("indexer_logits", "heads=64,head_dim=128,paged=false,page_rows=0,next_n=1"),
    ("indexer_logits", "heads=64,head_dim=128,paged=true,page_rows=64,next_n=1"),
    ("indexer_topk", "topk=2048,windowed=true"),
    ("indexer_topk", "topk=2048,windowed=false"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kwarm")
    ap.add_argument("cache")
    ap.add_argument("--json")
    a = ap.parse_args()
    t0 = time.perf_counter()
    import cupy
    cupy.cuda.Device(0).use()
    cupy.zeros(1)  # context creation, paid by either path
    t_ctx = time.perf_counter()
    tmp = tempfile.mkdtemp()
    for i, (fam, fields) in enumerate(KEYS):
        out = os.path.join(tmp, f"{i}.cubin")
        p = subprocess.run([a.kwarm, "get", "--family", fam, "--fields", fields,
                            "--arch", "sm_90", "--cache", a.cache, "-o", out],
                           capture_output=True, text=True)
        if p.returncode != 0:
            print(p.stderr, file=sys.stderr)
            return 1
        entry = p.stdout.split()[-1]
        mod = cupy.RawModule(path=out)
        mod.get_function(entry)
    t_end = time.perf_counter()
    res = {"context_s": t_ctx - t0, "get_and_load_s": t_end - t_ctx}
    print(f"fresh process: CUDA context {res['context_s']:.3f} s, 4 indexer kernels "
          f"from the kwarm cache (kwarm get --cache + load) {res['get_and_load_s'] * 1e3:.1f} ms")
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
