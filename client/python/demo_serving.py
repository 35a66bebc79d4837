#!/usr/bin/env python3
"""Plays a serving process: asks kwarmd for its rank's kernels, loads them
all, runs one and checks it against a numpy reference.

usage: demo_serving.py --socket PATH --model CONFIG.json [--dcp-world W]
                       [--dcp-rank R]

1. warmup: kwarmd compiles what the deployment needs (or finds it cached);
2. get + cuModuleLoadData for every key of this rank: launchable functions;
3. runs the plain index_conversion kernel (decode rows: request-local top-k
   positions to physical KV rows) on random inputs and compares every
   output with numpy, following docs/spec/kernels.md.
Needs the CUDA driver and numpy; talks to the driver through ctypes.
"""
import argparse
import ctypes as ct
import json
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import kwarm_client  # noqa: E402

np = None  # numpy: imported by main() once the arguments parsed, so that
           # --help and argument errors need no numpy


def reference(req_id, block_table, topk_pos, f, world, rank):
    """index_conversion for decode rows (docs/spec/kernels.md), in numpy."""
    bs, stride, il = f["block_size"], f["block_stride_rows"], f["dcp_interleave"]
    t = topk_pos.astype(np.int64)
    owner = (t // il) % world
    local = (t // (world * il)) * il + t % il
    blk, off = local // bs, local % bs
    width = block_table.shape[1]
    rows = block_table[req_id[:, None], np.minimum(blk, width - 1)]
    out = rows.astype(np.int64) * stride + off
    bad = (t < 0) | (owner != rank) | (blk >= width)
    return np.where(bad, -1, out).astype(np.int32)


def launch_index_conversion(cuda, fn, f, rng):
    """Runs the kernel on random decode rows; returns (inputs, output)."""
    lib = cuda.lib
    rows, reqs, topk = 257, 9, f["num_topk_tokens"]
    # The runtime width must be in the class the key specialised on (rep).
    width = {1: 1, 2: 18, 16: 64}[f["block_table_stride"]]
    req_id = rng.integers(0, reqs, rows, dtype=np.int32)
    block_table = rng.integers(0, 1 << 16, (reqs, width), dtype=np.int32)
    limit = width * f["block_size"] * f["dcp_size"] + 100
    topk_pos = rng.integers(-1, limit, (rows, topk), dtype=np.int32)
    out = np.full((rows, topk), 7, dtype=np.int32)
    bufs = []
    for arr in (req_id, block_table, topk_pos, out):
        d = ct.c_uint64()
        cuda._check(lib.cuMemAlloc_v2(ct.byref(d), ct.c_size_t(arr.nbytes)), "cuMemAlloc")
        cuda._check(lib.cuMemcpyHtoD_v2(d, arr.ctypes.data_as(ct.c_void_p),
                                        ct.c_size_t(arr.nbytes)), "cuMemcpyHtoD")
        bufs.append(d)
    null = ct.c_uint64(0)
    scalars = [ct.c_int32(v) for v in (rows, reqs, 0, width, 0)]
    params = [bufs[0], bufs[1], bufs[2], null, null] + scalars + [bufs[3], null]
    argv = (ct.c_void_p * len(params))(*[ct.cast(ct.byref(p), ct.c_void_p) for p in params])
    threads = f["num_warps"] * 32
    cuda._check(lib.cuLaunchKernel(fn, rows, 1, 1, threads, 1, 1, 0, None, argv, None),
                "cuLaunchKernel")
    cuda._check(lib.cuCtxSynchronize(), "cuCtxSynchronize")
    cuda._check(lib.cuMemcpyDtoH_v2(out.ctypes.data_as(ct.c_void_p), bufs[3],
                                    ct.c_size_t(out.nbytes)), "cuMemcpyDtoH")
    for d in bufs:
        lib.cuMemFree_v2(d)
    return req_id, block_table, topk_pos, out


def main():
    global np
    ap = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0].replace("\n", " "),
        epilog="Needs a GPU with its CUDA driver, and numpy.")
    ap.add_argument("--socket", default=None,
                    help="kwarmd's socket (default: $KWARM_SOCKET, "
                         "$XDG_RUNTIME_DIR/kwarm.sock or /run/kwarm/kwarm.sock)")
    ap.add_argument("--model", required=True, help="the model's config.json")
    ap.add_argument("--dcp-world", type=int, default=1,
                    help="decode-context-parallel world size (1)")
    ap.add_argument("--dcp-rank", type=int, default=0,
                    help="this process's rank (0)")
    a = ap.parse_args()
    try:
        import numpy
    except ImportError:
        ap.error("numpy is needed for the reference check "
                 "(Debian: apt-get install python3-numpy)")
    np = numpy
    config = json.load(open(a.model))
    deployment = {"dcp_world": a.dcp_world, "dcp_rank": a.dcp_rank}
    cuda = kwarm_client.Cuda()
    with kwarm_client.Client(a.socket) as c:
        t0 = time.perf_counter()
        result = c.warmup(config, deployment, name=os.path.basename(a.model))
        t1 = time.perf_counter()
        print("warmup: %d keys, %d compiled, %d hits, %d failed in %.2f s"
              % (result["keys"], result["compiled"], result["hits"], result["failed"], t1 - t0))
        keys = c.keys(config, deployment, name=os.path.basename(a.model))["keys"]
        functions = {}
        for k in keys:
            header, cubin = c.get(digest=k["digest"], compile=False)
            functions[k["digest"]] = cuda.load(cubin, header["entry"])[1]
        t2 = time.perf_counter()
        print("loaded %d kernels of rank %d in %.1f ms (%.3f ms each)"
              % (len(functions), a.dcp_rank, (t2 - t1) * 1e3, (t2 - t1) * 1e3 / len(functions)))
    plain = [k for k in keys if k["family"] == "index_conversion"
             and not k["fields"]["has_prefill_workspace"]
             and not k["fields"]["count_valid"] and not k["fields"]["compact_to_front"]]
    k = plain[0]
    f = k["fields"]
    rng = np.random.default_rng(1)
    req_id, table, topk_pos, out = launch_index_conversion(cuda, functions[k["digest"]], f, rng)
    want = reference(req_id, table, topk_pos, f, f["dcp_size"], f["dcp_rank"])
    bad = int((out != want).sum())
    print("ran index_conversion %s on %d x %d: %d of %d outputs differ from numpy"
          % (k["digest"][:16], out.shape[0], out.shape[1], bad, out.size))
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
