#!/usr/bin/env python3
"""kwarm.torch's host cost per eager call and its start-up, against peers
(issue 22 point 5).

usage: ops_bench.py [--kwarmd build/kwarmd] [--json FILE] [--runs 5]
                    [--calls 200] [--batches 50] [--no-triton] [--no-startup]
                    [--stand-in]

Host cost per eager call, each op at a small shape (tests/python/
kw_calls.py's), DeepSeek-V3.2 at DCP 2 rank 1 (compressed_slot_mapping,
which V3.2 has no key for, on V4-Flash): the time of `calls` back-to-back
calls with no synchronisation inside (the GPU queue never fills), per
call, median over `batches` batches, for
  - torch.ops.kwarm.NAME_out (the mutating form) and torch.ops.kwarm.NAME
    (allocating), and kwarm.torch.direct.NAME_out (no dispatcher);
  - an empty op with the same schema registered with torch.library.Library
    define + impl, and one with torch.library.custom_op (the dispatcher's
    share);
  - a bare cuLaunchKernel of the same kernel, the same grid and the same
    parameters through ctypes, its argument array built once
    (kw_launch_params_build), as the floor;
  - a Triton kernel launch with as many arguments (pointers and ints as
    the op has), its body empty.
Start-up: fresh processes (median of `runs`), timed from `import
kwarm.torch` to every op of one rank ready (kwarm.torch.load() of
DeepSeek-V3.2 at DCP 2 rank 1 and V4-Flash at DCP 8 rank 3 through a warm
kwarmd), with CUDA context creation reported apart; against Triton
compiling-or-loading as many kernels as the rank has keys (distinct
constexpr variants of one small kernel, bench/triton_coldstart.py's
method), with an empty (cold) and a filled (warm) TRITON_CACHE_DIR.

Prints a table and one JSON document (also to --json).  --stand-in runs
what it can without a GPU (kwarm.torch's host path on a stand-in device,
no cuLaunchKernel, no Triton): a dry run of this script.
"""
import argparse
import ctypes
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))   # kw_calls, test_client
try:
    import kwarm  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))

V32 = os.path.join(ROOT, "tests", "fixtures", "deepseek-v3.2-exp.json")
V4 = os.path.join(ROOT, "tests", "fixtures", "deepseek-v4-flash.json")
STARTUP = {
    "v32_dcp2_rank1": (V32, {"dcp_world": 2, "dcp_rank": 1}),
    "v4flash_dcp8_rank3": (V4, {"dcp_world": 8, "dcp_rank": 3}),
}


def median_per_call(fn, calls, batches, sync):
    """Median over batches of (time of `calls` calls) / calls, in us."""
    per = []
    for _ in range(batches):
        sync()
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        per.append((time.perf_counter() - t0) / calls * 1e6)
    sync()
    return statistics.median(per)


# ---------------------------------------------------------------------------
# Peers.
# ---------------------------------------------------------------------------
class BareLaunch:
    """cuLaunchKernel through ctypes of the kernel kw_ops_run would launch
    for one call: its cubin fetched from kwarmd by digest, loaded into the
    primary context, parameters laid out once by kw_launch_params_build."""

    class Params(ctypes.Structure):
        _fields_ = [("slot", ctypes.c_uint64 * 16), ("args", ctypes.c_void_p * 16),
                    ("n", ctypes.c_size_t)]

    def __init__(self, kt, dep, sock, opi, values, cuda):
        from kwarm import _lib
        lib = kt.LIB.cdll
        call = _lib.LaunchCall()
        for i, v in enumerate(values):
            call.a[i] = (0 if v is None else v.data_ptr()) if (
                v is None or hasattr(v, "data_ptr")) else int(v)
        self.call = call
        fields = (ctypes.c_int64 * _lib.MAX_FIELDS)()
        err = ctypes.create_string_buffer(512)
        deploy = kt.LIB.kw_ops_deploy(dep._h)
        lib.kw_launch_dispatch.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                           ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
        rc = lib.kw_launch_dispatch(opi, deploy, ctypes.byref(call), fields, err, 512)
        if rc:
            raise RuntimeError("kw_launch_dispatch: %s" % err.value.decode())
        self.geo = _lib.LaunchGeo()
        lib.kw_launch_geometry.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p,
                                           ctypes.c_uint, ctypes.c_void_p]
        rc = lib.kw_launch_geometry(opi, fields, ctypes.byref(call), 0,
                                    ctypes.byref(self.geo))
        if rc:
            raise RuntimeError("kw_launch_geometry: %d" % rc)
        self.params = self.Params()
        lib.kw_launch_params_build.argtypes = [ctypes.c_int, ctypes.c_void_p,
                                               ctypes.c_void_p, ctypes.c_void_p,
                                               ctypes.c_void_p]
        rc = lib.kw_launch_params_build(opi, fields, deploy, ctypes.byref(call),
                                        ctypes.byref(self.params))
        if rc:
            raise RuntimeError("kw_launch_params_build: %d" % rc)
        want = kt.LIB.fields(opi, fields)
        fam = kt.LIB.kw_launch_family_name(kt.LIB.kw_launch_op_family(opi)).decode()
        digest = [d for f, fl, d in dep.keys() if f == fam and fl == want]
        if not digest:
            raise RuntimeError("no loaded key %s %s" % (fam, want))
        self.digest = digest[0]
        self.cuda = cuda
        if cuda is None:      # stand-in: no driver
            self.fn = None
            return
        import kwarm_client
        with kwarm_client.Client(sock, timeout=120) as c:
            header, cubin = c.get(digest=self.digest, compile=False)
        self.mod, self.fn = cuda.load(cubin, header["entry"])
        culib = cuda.lib
        if self.geo.shmem > 48 * 1024:
            culib.cuFuncSetAttribute(self.fn, 8, ctypes.c_int(self.geo.shmem))
        self.launch = culib.cuLaunchKernel
        self.launch.argtypes = [ctypes.c_void_p] + [ctypes.c_uint] * 7 + [
            ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p]
        self.launch.restype = ctypes.c_int
        g, b = self.geo.grid, self.geo.block
        self.argv = (self.fn, g[0], g[1], g[2], b[0], b[1], b[2], self.geo.shmem,
                     None, ctypes.addressof(self.params.args), None)

    def __call__(self):
        self.launch(*self.argv)


def triton_kernel(nptr, nint, tmpdir):
    """A Triton kernel taking nptr pointers and nint ints, doing nothing
    (written to a file: triton.jit reads the source)."""
    name = "k_%d_%d" % (nptr, nint)
    params = ["p%d" % i for i in range(nptr)] + ["i%d" % i for i in range(nint)]
    src = ("import triton\nimport triton.language as tl\n\n\n@triton.jit\n"
           "def %s(%s, BLOCK: tl.constexpr):\n"
           "    if tl.program_id(0) < 0:\n"
           "        tl.store(p0, i0)\n" % (name, ", ".join(params)))
    path = os.path.join(tmpdir, name + ".py")
    with open(path, "w") as f:
        f.write(src)
    sys.path.insert(0, tmpdir)
    mod = __import__(name)
    sys.path.pop(0)
    return getattr(mod, name)


_BENCH_LIB = None


def empty_ops(torch, kt, op):
    """(Library define+impl op, custom_op op) with the schema of op's
    mutating form, doing nothing."""
    global _BENCH_LIB
    schema = kt.SCHEMAS[op + "_out"]
    if _BENCH_LIB is None:
        _BENCH_LIB = torch.library.Library("kwarm_bench", "DEF")
    lib = _BENCH_LIB
    name = "empty_" + op
    lib.define(schema.replace(op + "_out(", name + "(", 1))
    args = [a for a, _ in dict(kt.OPS)[op]]
    noop = eval("lambda %s: None" % ", ".join(args))
    for key in ("CUDA", "CPU"):
        lib.impl(name, noop, key)
    library_op = getattr(torch.ops.kwarm_bench, name)
    custom = None
    try:
        mutates = [a for a, k in dict(kt.OPS)[op] if k in (1, 3)]
        src = "def f(%s) -> None:\n    return None\n" % ", ".join(
            "%s: %s" % (a, _annot(k)) for a, k in dict(kt.OPS)[op])
        ns = {"torch": torch, "Optional": __import__("typing").Optional}
        exec(src, ns)
        custom = torch.library.custom_op("kwarm_bench::custom_" + op,
                                         mutates_args=mutates)(ns["f"])
    except Exception as e:  # an older torch: report, keep going
        print("custom_op for %s: %s" % (op, e), file=sys.stderr)
    return lib, library_op, custom


def _annot(kind):
    return {0: "torch.Tensor", 1: "torch.Tensor", 2: "Optional[torch.Tensor]",
            3: "Optional[torch.Tensor]", 4: "int", 5: "bool"}[kind]


# ---------------------------------------------------------------------------
# Host cost.
# ---------------------------------------------------------------------------
def host_cost(a, res):
    import torch
    import kwarm.torch as kt
    import kw_calls
    from test_client import Kwarmd
    stand_in = a.stand_in
    dev = "cpu" if stand_in else "cuda"
    sync = (lambda: None) if stand_in else torch.cuda.synchronize
    daemon = Kwarmd(a.kwarmd, jobs=a.jobs)
    rows, keep = [], []
    try:
        kw = dict(socket=daemon.sock, timeout_ms=-1)
        if stand_in:
            kw["stand_in"] = lambda *x: None
        dep = kt.load(V32, STARTUP["v32_dcp2_rank1"][1], **kw)
        dep4 = kt.load(V4, None, activate=False, **kw)
        cuda = None
        if not stand_in:
            import kwarm_client
            cuda = kwarm_client.Cuda(torch.cuda.current_device())
        tmp = tempfile.mkdtemp(prefix="kw-bench-")
        os.environ.setdefault("TRITON_CACHE_DIR", os.path.join(tmp, "triton"))
        for opi, (op, kinds) in enumerate(kt.OPS):
            d = dep4 if op == "compressed_slot_mapping" else dep
            with d.use():
                args = kw_calls.calls(d.topk, d.dcp_world, dev)[op]
                values = [v for _, v in args]
                out_op = getattr(torch.ops.kwarm, op + "_out").default
                alloc_op = getattr(torch.ops.kwarm, op).default
                alloc_args = kw_calls.alloc_args(args, kinds)
                direct = getattr(kt.direct, op + "_out")
                lib, empty, custom = empty_ops(torch, kt, op)
                keep.append(lib)
                row = {"op": op, "args": len(kinds)}
                row["ops_out_us"] = median_per_call(lambda: out_op(*values), a.calls,
                                                    a.batches, sync)
                row["ops_alloc_us"] = median_per_call(lambda: alloc_op(*alloc_args),
                                                      a.calls, a.batches, sync)
                row["direct_out_us"] = median_per_call(lambda: direct(*values), a.calls,
                                                       a.batches, sync)
                row["empty_library_op_us"] = median_per_call(lambda: empty(*values),
                                                             a.calls, a.batches, sync)
                if custom is not None:
                    row["empty_custom_op_us"] = median_per_call(
                        lambda: custom(*values), a.calls, a.batches, sync)
                bare = BareLaunch(kt, d, daemon.sock, opi, values, cuda)
                if bare.fn is not None:
                    row["culaunch_ctypes_us"] = median_per_call(bare, a.calls, a.batches,
                                                                sync)
                keep.append(bare)
                if not a.no_triton and not stand_in:
                    nptr = sum(1 for _, k in kinds if k in (0, 1, 2, 3))
                    nint = len(kinds) - nptr
                    tk = triton_kernel(nptr, nint, tmp)
                    ptr = torch.zeros(16, dtype=torch.int32, device=dev)
                    targs = [ptr] * nptr + [3] * nint
                    tk[(1,)](*targs, BLOCK=128)    # compile once
                    sync()
                    row["triton_us"] = median_per_call(lambda: tk[(1,)](*targs, BLOCK=128),
                                                       a.calls, a.batches, sync)
                rows.append(row)
                print("  %-26s out %.2f us, alloc %.2f us, direct %.2f us%s" % (
                    op, row["ops_out_us"], row["ops_alloc_us"], row["direct_out_us"],
                    "".join(", %s %.2f us" % (k[:-3], row[k]) for k in
                            ("culaunch_ctypes_us", "triton_us", "empty_library_op_us",
                             "empty_custom_op_us") if k in row)), flush=True)
        dep4.close()
        dep.close()
        shutil.rmtree(tmp, ignore_errors=True)
    finally:
        daemon.stop()
    res["host_cost"] = rows


# ---------------------------------------------------------------------------
# Start-up.
# ---------------------------------------------------------------------------
def startup_child(a):
    """One fresh process: import torch, then time import kwarm.torch ->
    context -> load."""
    t_torch0 = time.perf_counter()
    import torch
    t_torch1 = time.perf_counter()
    t0 = time.perf_counter()
    import kwarm.torch as kt
    t1 = time.perf_counter()
    if not a.stand_in:
        torch.cuda.init()
        torch.empty(1, device="cuda")
        torch.cuda.synchronize()
    t2 = time.perf_counter()
    config, deploy = STARTUP[a.startup_child]
    kw = dict(socket=a.socket, timeout_ms=-1, no_warmup=a.no_warmup)
    if a.stand_in:
        kw["stand_in"] = lambda *x: None
    dep = kt.load(config, deploy, **kw)
    t3 = time.perf_counter()
    st = dep.stats()
    print(json.dumps({"import_torch_ms": (t_torch1 - t_torch0) * 1e3,
                      "import_kwarm_torch_ms": (t1 - t0) * 1e3,
                      "context_ms": (t2 - t1) * 1e3, "load_ms": (t3 - t2) * 1e3,
                      "import_to_ready_ms": (t3 - t0) * 1e3,
                      "import_to_ready_after_context_ms": (t3 - t2 + t1 - t0) * 1e3,
                      "kw_ops_load_ms": st["load_ms"], "keys": st["loaded"],
                      "no_warmup": a.no_warmup}))


TRITON_CHILD = r'''
import json, os, sys, time
import torch, triton, triton.language as tl

@triton.jit
def variant(x_ptr, n, V: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(x_ptr + offs, tl.load(x_ptr + offs, mask=mask) + V, mask=mask)

count = int(sys.argv[1])
x = torch.zeros(4096, dtype=torch.int32, device="cuda")
torch.cuda.synchronize()
t0 = time.perf_counter()
for v in range(count):
    variant[(4,)](x, 4096, V=v + 1, BLOCK=1024)
torch.cuda.synchronize()
t1 = time.perf_counter()
ok = int(x[0].item()) == count * (count + 1) // 2
print(json.dumps({"ms": (t1 - t0) * 1e3, "kernels": count, "correct": ok,
                  "triton": triton.__version__}))
'''


def run_json(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if p.returncode != 0:
        raise RuntimeError("%s failed (%d): %s" % (cmd[:3], p.returncode, p.stderr[-3000:]))
    return json.loads(p.stdout.strip().splitlines()[-1])


def startup(a, res):
    from test_client import Kwarmd
    daemon = Kwarmd(a.kwarmd, jobs=a.jobs)
    out = {}
    env = dict(os.environ)
    try:
        me = [sys.executable, os.path.abspath(__file__)]
        for name, (config, deploy) in STARTUP.items():
            # Warm kwarmd for this rank once (compiles what is missing).
            run_json(me + ["--startup-child", name, "--socket", daemon.sock]
                     + (["--stand-in"] if a.stand_in else []), env)
            entry = {}
            for mode in ("warmup", "no_warmup"):
                runs = [run_json(me + ["--startup-child", name, "--socket", daemon.sock]
                                 + (["--no-warmup"] if mode == "no_warmup" else [])
                                 + (["--stand-in"] if a.stand_in else []), env)
                        for _ in range(a.runs)]
                entry[mode] = {k: statistics.median(r[k] for r in runs)
                               for k in runs[0] if isinstance(runs[0][k], (int, float))
                               and not isinstance(runs[0][k], bool)}
                entry[mode]["runs"] = runs
            keys = entry["warmup"]["keys"]
            if not a.no_triton and not a.stand_in:
                tri = {}
                # triton.jit reads its kernel's source: the child is a file
                script = os.path.join(tempfile.mkdtemp(prefix="kw-triton-child-"),
                                      "triton_child.py")
                with open(script, "w") as f:
                    f.write(TRITON_CHILD)
                child = [sys.executable, script, str(int(keys))]
                cold = []
                for _ in range(max(1, a.runs // 2)):      # cold runs are slow
                    cache = tempfile.mkdtemp(prefix="kw-triton-")
                    r = run_json(child, dict(env, TRITON_CACHE_DIR=cache))
                    cold.append(r["ms"])
                    shutil.rmtree(cache, ignore_errors=True)
                cache = tempfile.mkdtemp(prefix="kw-triton-")
                run_json(child, dict(env, TRITON_CACHE_DIR=cache))   # fills it
                warm = [run_json(child, dict(env, TRITON_CACHE_DIR=cache))["ms"]
                        for _ in range(a.runs)]
                shutil.rmtree(cache, ignore_errors=True)
                tri.update(cold_ms=statistics.median(cold), cold_runs_ms=cold,
                           warm_ms=statistics.median(warm), warm_runs_ms=warm)
                tri["kernels"] = int(keys)
                tri["version"] = r["triton"]
                entry["triton"] = tri
            out[name] = entry
            w = entry["warmup"]
            print("  %-20s %d keys: import->ready %.1f ms (context %.1f ms apart; "
                  "load %.1f ms, no-warmup load %.1f ms)%s" % (
                      name, keys, w["import_to_ready_after_context_ms"], w["context_ms"],
                      w["load_ms"], entry["no_warmup"]["load_ms"],
                      ("; Triton %d kernels cold %.0f ms, warm %.0f ms"
                       % (keys, entry["triton"]["cold_ms"], entry["triton"]["warm_ms"]))
                      if "triton" in entry else ""), flush=True)
    finally:
        daemon.stop()
    res["startup"] = out


def table(res):
    lines = []
    hc = res.get("host_cost", [])
    if hc:
        cols = ["ops_out_us", "ops_alloc_us", "direct_out_us", "culaunch_ctypes_us",
                "triton_us", "empty_library_op_us", "empty_custom_op_us"]
        lines.append("host cost per eager call, us (median of %d batches of %d calls)"
                     % (res["batches"], res["calls"]))
        lines.append("%-26s %4s " % ("op", "args") + " ".join("%9s" % c[:-3][:9]
                                                           for c in cols))
        for r in hc:
            lines.append("%-26s %4d " % (r["op"], r["args"]) + " ".join(
                ("%9.2f" % r[c]) if c in r else "%9s" % "-" for c in cols))
    for name, e in res.get("startup", {}).items():
        w, n = e["warmup"], e["no_warmup"]
        lines.append("start-up %s: %d keys; import kwarm.torch -> every op ready %.1f ms "
                     "after context (warmup request), %.1f ms (fetch only); context %.1f "
                     "ms; import torch %.0f ms" % (
                         name, w["keys"], w["import_to_ready_after_context_ms"],
                         n["import_to_ready_after_context_ms"], w["context_ms"],
                         w["import_torch_ms"]))
        if "triton" in e:
            t = e["triton"]
            lines.append("  Triton %d kernels: cold %.0f ms, warm %.0f ms (%.0fx / %.0fx "
                         "kwarm's)" % (t["kernels"], t["cold_ms"], t["warm_ms"],
                                       t["cold_ms"] / w["import_to_ready_after_context_ms"],
                                       t["warm_ms"] / w["import_to_ready_after_context_ms"]))
    return "\n".join(lines)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kwarmd", default=os.environ.get("KWARMD",
                                                       os.path.join(ROOT, "build", "kwarmd")))
    ap.add_argument("--json")
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--batches", type=int, default=50)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--no-triton", action="store_true")
    ap.add_argument("--no-startup", action="store_true")
    ap.add_argument("--no-host-cost", action="store_true")
    ap.add_argument("--stand-in", action="store_true",
                    help="no GPU: a dry run on kwarm.torch's stand-in device")
    ap.add_argument("--startup-child", choices=sorted(STARTUP), help=argparse.SUPPRESS)
    ap.add_argument("--socket", help=argparse.SUPPRESS)
    ap.add_argument("--no-warmup", action="store_true", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.startup_child:
        startup_child(a)
        return 0
    import torch
    res = {"torch": torch.__version__, "calls": a.calls, "batches": a.batches,
           "runs": a.runs, "stand_in": a.stand_in,
           "device": "stand-in" if a.stand_in else torch.cuda.get_device_name()}
    if not a.no_host_cost:
        print("host cost per eager call:", flush=True)
        host_cost(a, res)
    if not a.no_startup:
        print("start-up (fresh processes):", flush=True)
        startup(a, res)
    print(table(res))
    text = json.dumps(res, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
