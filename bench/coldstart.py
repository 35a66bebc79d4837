#!/usr/bin/env python3
"""Time from request to a launchable kernel in a fresh Python process.

usage: coldstart.py --socket PATH --digest HEX [--json FILE]

Run it as a fresh process against a warm kwarmd (the key already cached).
Prints, in milliseconds: CUDA context creation (cuInit + primary context,
through ctypes), then connect + get + cuModuleLoadData + cuModuleGetFunction
(the part kwarm is responsible for), then one launch-and-sync of the kernel
with a trivial grid to show the function is launchable.
"""
import argparse
import ctypes
import json
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "client", "python"))
import kwarm_client  # noqa: E402


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--socket", required=True)
    ap.add_argument("--digest", required=True)
    ap.add_argument("--json")
    a = ap.parse_args()
    t0 = time.perf_counter()
    cuda = kwarm_client.Cuda()
    t1 = time.perf_counter()
    with kwarm_client.Client(a.socket) as c:
        header, cubin = c.get(digest=a.digest, compile=False)
    mod, fn = cuda.load(cubin, header["entry"])
    t2 = time.perf_counter()
    out = {"context_ms": (t1 - t0) * 1e3, "get_and_load_ms": (t2 - t1) * 1e3,
           "entry": header["entry"], "size": header["size"],
           "function": bool(fn.value)}
    print(json.dumps(out))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(out, f)
    return 0 if fn.value else 1


if __name__ == "__main__":
    sys.exit(main())
