#!/usr/bin/env python3
"""Start-up cost of the indexer kernels in a fresh serving process.

usage: indexer_startup.py --socket PATH [--json F]           (warm kwarmd)
       indexer_startup.py --cache DIR --kwarm BIN [--json F]  (kwarm get --cache)

Times, in this fresh process, after CUDA context creation (ctypes, as
client/python does), getting the four DeepSeek-V3.2 indexer kernels
(indexer_logits prefill and decode, indexer_topk windowed and not) and
turning each into a launchable function (cuModuleLoadData +
cuModuleGetFunction): from a warm kwarmd through the Python client, or
from a prewarmed cache through `kwarm get --cache` (one process per
kernel, as a launcher script would).  The NVRTC side is bench_indexer's
fresh-process compile of the same keys.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "client", "python"))
import kwarm_client  # noqa: E402

KEYS = [
    ("indexer_logits", {"heads": 64, "head_dim": 128, "paged": False, "page_rows": 0, "next_n": 1}),
    ("indexer_logits", {"heads": 64, "head_dim": 128, "paged": True, "page_rows": 64, "next_n": 1}),
    ("indexer_topk", {"topk": 2048, "windowed": True}),
    ("indexer_topk", {"topk": 2048, "windowed": False}),
]


def from_daemon(cuda, sock):
    fns = []
    with kwarm_client.Client(sock) as c:
        for fam, fields in KEYS:
            header, cubin = c.get(family=fam, fields=fields, arch="sm_90", compile=False)
            fns.append(cuda.load(cubin, header["entry"]))
    return fns


def from_cache(cuda, kwarm, cache):
    fns = []
    tmp = tempfile.mkdtemp()
    for i, (fam, fields) in enumerate(KEYS):
        out = os.path.join(tmp, f"{i}.cubin")
        text = ",".join(f"{k}={str(v).lower()}" for k, v in fields.items())
        p = subprocess.run([kwarm, "get", "--family", fam, "--fields", text, "--arch",
                            "sm_90", "--cache", cache, "-o", out],
                           capture_output=True, text=True, check=True)
        with open(out, "rb") as f:
            fns.append(cuda.load(f.read(), p.stdout.split()[-1]))
    return fns


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket")
    ap.add_argument("--cache")
    ap.add_argument("--kwarm")
    ap.add_argument("--json")
    a = ap.parse_args()
    t0 = time.perf_counter()
    cuda = kwarm_client.Cuda()
    t1 = time.perf_counter()
    fns = from_daemon(cuda, a.socket) if a.socket else from_cache(cuda, a.kwarm, a.cache)
    t2 = time.perf_counter()
    ok = all(fn.value for _, fn in fns)
    res = {"source": "kwarmd" if a.socket else "kwarm get --cache",
           "context_ms": (t1 - t0) * 1e3, "get_and_load_ms": (t2 - t1) * 1e3,
           "kernels": len(fns), "launchable": ok}
    print(json.dumps(res))
    if a.json:
        with open(a.json, "a") as f:
            f.write(json.dumps(res) + "\n")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
