#!/usr/bin/env python3
"""kwarm's indexer kernels side by side with DeepGEMM's, which DeepSeek-V3.2
/ V4 serving stacks call (fp8_mqa_logits, fp8_paged_mqa_logits).

usage: indexer_peer.py DIR [--json F] [--rounds R] [--iters N] [--eager]
                       [--quick] [--only prefill|decode|topk]
                       [--variants DIR... [--shape S:SK:H:causal|cp ...]] [--splits]

DIR holds bench_indexer's cubins and kernels.json; DeepGEMM is imported
from PYTHONPATH, built at run time by bench/deepgemm_build.sh (nothing of
it is in the repository).  Every case runs both kernels on the same data
in this process:

- each kernel is timed in its own sustained state (half a second of
  itself, then --iters replays of a CUDA graph of up to 20 calls, as a
  serving step replays them; medians over --rounds rounds), since the
  H200 caps its power and a kernel timed right after another runs at the
  clock the other left (indexer_bench.py, rounds());
- an 8192^3 torch._scaled_mm and a 1 GiB copy, timed the same way in this
  run, are the floors' yardsticks;
- both outputs are checked on sampled query rows against a float64
  reference at the spec's tolerance (2^-12 of the sum of absolute terms),
  -inf outside each window;
- the same FLOPs and bytes are counted for both: 2 H D per (query, row in
  its window); decode bytes are K and its scales read once per request
  (the rows up to the longest window), which is what copy bandwidth is
  compared with.

DeepGEMM's time is the whole call (its output allocation, its kernel and
its clean pass writing -inf outside the windows, which kwarm's kernel
writes itself).  Prefill cases: S in 2048, 4096, 8192; SK 8192 to 131072;
causal windows, and DeepGEMM's context-parallel windows (two chunks of
S/2 queries at mirrored positions of SK/S ranks); H 64 and 32.  Decode:
128 x 65536 and 64 x 32768 at next_n 1 and 2, and 1, 8, 32 requests of
65536.  topk: indexer_topk against torch.topk on the prefill's own logits,
and on rows that are mostly exact zeros (the ReLU plateaus), replayed 25
times, each equal to a stable torch order.
"""
import argparse
import json
import os
import statistics
import sys

import torch

import indexer_bench as ib

D = 128


def sustained(fn, iters, rounds):
    """Median ms over rounds, each after half a second of fn itself."""
    out = []
    for _ in range(rounds):
        ib.settle(fn, 0.5)
        out.append(ib.timed(fn, iters))
    return statistics.median(out), out


def yardsticks(a, res, tag):
    peer, pflops = ib.matrix_peer()
    ms, _ = sustained(peer, 7 * a.iters, a.rounds)
    res[f"fp8_mm_tflops_{tag}"] = pflops / (ms / 1e3) / 1e12
    n = 1 << 30
    x = torch.empty(n, dtype=torch.uint8, device="cuda")
    y = torch.empty_like(x)
    ms, _ = sustained(lambda: y.copy_(x), a.iters, a.rounds)
    res[f"copy_gbps_{tag}"] = 2 * n / (ms / 1e3) / 1e9
    del x, y
    torch.cuda.empty_cache()
    print(f"yardsticks ({tag}): _scaled_mm {res[f'fp8_mm_tflops_{tag}']:.0f} TFLOP/s, "
          f"copy {res[f'copy_gbps_{tag}']:.0f} GB/s", flush=True)


def windows(S, SK, cp):
    """ks, ke of DeepGEMM's test: causal, or its context-parallel layout."""
    ks = torch.zeros(S, dtype=torch.int32, device="cuda")
    if not cp:
        return ks, (torch.arange(S, device="cuda") + (SK - S + 1)).to(torch.int32)
    half, ranks = S // 2, SK // S
    rank = ranks // 3
    i = torch.arange(half, device="cuda")
    ke = torch.cat([rank * half + i + 1, (2 * ranks - 1 - rank) * half + i + 1])
    return ks, ke.clamp(max=SK).to(torch.int32)


class DeepGEMM:
    """The installed DeepGEMM's two calls, whichever API generation."""

    def __init__(self):
        import deep_gemm
        self.dg = deep_gemm
        self.new = hasattr(deep_gemm, "fp8_fp4_mqa_logits")
        self.version = getattr(deep_gemm, "__version__", "?")
        self.sms = deep_gemm.get_num_sms()

    def prefill(self, q, k, ksc, w, ks, ke):
        return lambda: self.dg.fp8_mqa_logits(q, (k, ksc), w, ks, ke, clean_logits=True)

    def decode(self, q4, fused, w, re2, bt, rows):
        """The paged call.  The 2.6 series takes per-query lengths (2-D)
        and then has no clean pass (its output outside the windows is
        left unwritten, so only the windows are checked); the 2.1 series
        takes per-request lengths and writes -inf outside, as kwarm does."""
        lens = re2 if self.new else re2[:, -1].contiguous()
        meta = self.dg.get_paged_mqa_logits_metadata(lens, 64, self.sms)
        clean = not self.new
        return lambda: self.dg.fp8_paged_mqa_logits(q4, fused, w, lens, bt, meta, rows, clean)


def check(out, q, k, ksc, w, ks, ke, rows):
    ref, mag = ib.ref_rows(q, w, k, ks, rows, ksc)
    bad = 0
    for i, t in enumerate(rows):
        r = ref[i].clone()
        inw = torch.zeros_like(r, dtype=torch.bool)
        inw[ks[t].item():ke[t].item()] = True
        r[~inw] = 0
        bad += ib.check_rows(out[t], r, mag[i], ks[t].item(), ke[t].item())
    return bad


def graphed(fn, calls=20):
    """A CUDA graph of calls back-to-back calls of fn, as a serving decode
    step replays them: returns a function that replays it once."""
    fn()
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for _ in range(calls):
                fn()
    torch.cuda.synchronize()
    return g.replay


def prefill_data(S, SK, H, cp, seed):
    """One prefill shape's inputs (fp8 q [S, H, D] and k [SK, D], weights,
    row scales, windows) and its FLOPs."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    q = ib.fp8((S, H, D), g)
    k = ib.fp8((SK, D), g)
    w = torch.randn(S, H, generator=g, device="cuda") / H
    ksc = torch.rand(SK, generator=g, device="cuda") + 0.5
    ks, ke = windows(S, SK, cp)
    return q, k, w, ksc, ks, ke, 2.0 * H * D * float((ke - ks).sum().item())


def kwarm_prefill(kern, q, k, w, ksc, ks, ke, out, split=0):
    """A launch of kwarm's prefill cubin on these inputs, into out, with
    the launch contract's grid (split: grid y instead of the contract's)."""
    S, SK = q.shape[0], k.shape[0]
    qb = kern.meta["queries"]
    args = [q.view(torch.uint8), w, k.view(torch.uint8), ksc, ks, ke, S, SK, SK, out]
    grid = ((S + qb - 1) // qb, split or ib.prefill_split(kern, S, SK))
    return lambda: kern(grid, args)


def graph_calls(S, SK):
    """Calls per CUDA graph for a prefill shape: up to 20, fewer as the
    output grows (each of DeepGEMM's calls allocates its own)."""
    return max(1, min(20, (1 << 28) // (S * SK)))


def timed_pair(a, fk, fd, calls):
    """Median ms per call of kwarm's and DeepGEMM's launchers, each in its
    own sustained state, alternating rounds; graphed: replays of a CUDA
    graph of calls launches."""
    gk, gd = (graphed(fk, calls), graphed(fd, calls)) if calls else (fk, fd)
    n = calls or 1
    rk, rd = [], []
    for _ in range(a.rounds):
        rk.append(sustained(gk, a.iters, 1)[0] / n)
        rd.append(sustained(gd, a.iters, 1)[0] / n)
    return statistics.median(rk), statistics.median(rd), rk, rd


def prefill_case(a, kern, dg, S, SK, H, cp, res):
    q, k, w, ksc, ks, ke, flops = prefill_data(S, SK, H, cp, S + SK + H + cp)
    out = torch.empty(S, SK, device="cuda")
    kw = kwarm_prefill(kern, q, k, w, ksc, ks, ke, out)
    dgf = dg.prefill(q, k, ksc, w, ks, ke)
    rows = sorted({0, S // 2 - 1, S // 2, S - 1})
    kw()
    dout = dgf()
    torch.cuda.synchronize()
    bad_k = check(out, q, k, ksc, w, ks, ke, rows)
    bad_d = check(dout, q, k, ksc, w, ks, ke, rows)
    del dout
    # As CUDA-graph replays, as decode is (decode_case): an eager launch
    # through cupy costs kwarm tens of microseconds of Python, more than
    # the shortest shapes' kernels, where a serving process launches from
    # C (kw_ops_run) or a graph.  --eager also times eager launches.
    calls = graph_calls(S, SK)
    mk, md, rk, rd = timed_pair(a, kw, dgf, calls)
    row = {"S": S, "SK": SK, "H": H, "cp": cp, "tflop": flops / 1e12, "graph_calls": calls,
           "split": ib.prefill_split(kern, S, SK),
           "kwarm_ms": mk, "deepgemm_ms": md, "kwarm_ms_rounds": rk, "deepgemm_ms_rounds": rd,
           "kwarm_tflops": flops / mk / 1e9, "deepgemm_tflops": flops / md / 1e9,
           "kwarm_mismatches": bad_k, "deepgemm_mismatches": bad_d,
           "deepgemm_over_kwarm": mk / md}
    if a.eager:
        row["kwarm_eager_ms"], row["deepgemm_eager_ms"], _, _ = timed_pair(a, kw, dgf, 0)
    res.setdefault("prefill", []).append(row)
    print(f"prefill S={S:5} SK={SK:6} H={H} {'cp    ' if cp else 'causal'}: kwarm {mk:7.3f} ms "
          f"{row['kwarm_tflops']:5.0f} TFLOP/s | DeepGEMM {md:7.3f} ms {row['deepgemm_tflops']:5.0f} | "
          f"kwarm time / DeepGEMM {mk / md:.3f} | mismatches {bad_k}/{bad_d}", flush=True)
    del q, k, out
    torch.cuda.empty_cache()


def decode_data(B, L, nn, g):
    PR = 64
    width = (L + PR - 1) // PR
    pages = B * width
    kp = ib.fp8((pages, PR, D), g)
    ksc = torch.rand(pages, PR, generator=g, device="cuda") + 0.5
    bt = torch.randperm(pages, generator=g, device="cuda").to(torch.int32).view(B, width)
    Q = B * nn
    q = ib.fp8((Q, 64, D), g)
    w = torch.randn(Q, 64, generator=g, device="cuda") / 64
    re = torch.full((Q,), L, dtype=torch.int32, device="cuda")
    for i in range(nn):
        re[i::nn] = L - (nn - 1 - i)
    fused = torch.empty(pages, PR * (D + 4), dtype=torch.uint8, device="cuda")
    fused[:, :PR * D] = kp.view(torch.uint8).view(pages, PR * D)
    fused[:, PR * D:] = ksc.view(torch.uint8).view(pages, PR * 4)
    return kp, ksc, bt, q, w, re, fused.view(pages, PR, 1, D + 4), width


def decode_check(out, kp, ksc, bt, q, w, re, nn, L, outside=True):
    bad = 0
    for i in (0, q.shape[0] - 1):
        b, e = i // nn, re[i].item()
        kr = kp[bt[b].long()].reshape(-1, D)[:e]
        sr = ksc[bt[b].long()].reshape(-1)[:e]
        s = q[i].double() @ kr.double().t()
        v = (s.clamp(min=0) * w[i].double()[:, None]).sum(0) * sr.double()
        m = ((q[i].double().abs() @ kr.double().abs().t()) * w[i].double().abs()[:, None]).sum(0) * sr.double()
        full = torch.zeros(L, dtype=torch.float64, device="cuda")
        fm = torch.zeros(L, dtype=torch.float64, device="cuda")
        full[:e], fm[:e] = v, m
        got = out[i][:L] if outside else torch.where(torch.arange(L, device="cuda") < e, out[i][:L],
                                                     torch.tensor(float("-inf"), device="cuda"))
        bad += ib.check_rows(got, full, fm, 0, e)
    return bad


def decode_case(a, kerns, dg, B, L, nn, res):
    kern = kerns[nn]
    g = torch.Generator(device="cuda").manual_seed(7 + B + nn)
    kp, ksc, bt, q, w, re, fused, width = decode_data(B, L, nn, g)
    Q = B * nn
    out = torch.empty(Q, L, device="cuda")
    qb = kern.meta["queries"]
    groups = (nn + qb - 1) // qb
    split = ib.decode_split(B * groups, (L + 63) // 64, ib.blocks_per_sm(kern))
    args = [q.view(torch.uint8), w, kp.view(torch.uint8), ksc, bt, re, B, width, L, out]
    kw = lambda: kern((split, B, groups), args)  # noqa: E731
    dgf = dg.decode(q.view(B, nn, 64, D), fused, w, re.view(B, nn), bt, L)
    kw()
    dout = dgf()
    torch.cuda.synchronize()
    bad_k = decode_check(out, kp, ksc, bt, q, w, re, nn, L)
    bad_d = decode_check(dout, kp, ksc, bt, q, w, re, nn, L, outside=not dg.new)
    del dout
    # Timed as 20 calls in one CUDA graph (what a decode step replays), so
    # that small batches show the GPU's latency, not Python's launch cost.
    gk, gd = graphed(kw), graphed(dgf)
    rk, rd = [], []
    for _ in range(a.rounds):
        rk.append(sustained(gk, a.iters, 1)[0] / 20)
        rd.append(sustained(gd, a.iters, 1)[0] / 20)
    mk, md = statistics.median(rk), statistics.median(rd)
    nbytes = B * L * (D + 4)
    cg = res["copy_gbps_start"]
    row = {"B": B, "L": L, "next_n": nn, "split": split, "bytes": nbytes,
           "kwarm_us": mk * 1e3, "deepgemm_us": md * 1e3, "kwarm_ms_rounds": rk, "deepgemm_ms_rounds": rd,
           "kwarm_gbps": nbytes / mk / 1e6, "deepgemm_gbps": nbytes / md / 1e6,
           "kwarm_x_copy": nbytes / mk / 1e6 / cg, "deepgemm_x_copy": nbytes / md / 1e6 / cg,
           "kwarm_mismatches": bad_k, "deepgemm_mismatches": bad_d, "deepgemm_over_kwarm": mk / md}
    res.setdefault("decode", []).append(row)
    print(f"decode B={B:3} L={L:6} next_n={nn} (split {split}): kwarm {mk * 1e3:7.1f} us "
          f"{row['kwarm_gbps']:5.0f} GB/s ({row['kwarm_x_copy']:.2f} of copy) | DeepGEMM {md * 1e3:7.1f} us "
          f"{row['deepgemm_gbps']:5.0f} GB/s ({row['deepgemm_x_copy']:.2f}) | kwarm time / DeepGEMM {mk / md:.3f} "
          f"| mismatches {bad_k}/{bad_d}", flush=True)
    del kp, fused, out
    torch.cuda.empty_cache()


def decode_splits(a, kerns, res):
    """kwarm's decode of small batches at the contract's split and at
    larger ones (up to every resident block of the GPU), graphed and
    checked: the data behind launch/'s decode_split cap."""
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for B, nn in ((1, 1), (1, 2), (8, 1), (8, 2), (32, 1)):
        L, kern = 65536, kerns[nn]
        g = torch.Generator(device="cuda").manual_seed(7 + B + nn)
        kp, ksc, bt, q, w, re, fused, width = decode_data(B, L, nn, g)
        out = torch.empty(B * nn, L, device="cuda")
        qb = kern.meta["queries"]
        groups = (nn + qb - 1) // qb
        per_sm = ib.blocks_per_sm(kern)
        auto = ib.decode_split(B * groups, (L + 63) // 64, per_sm)
        ys = sorted({auto, sms // B, 2 * sms // B, per_sm * sms // B, 512 // B} - {0})
        args = [q.view(torch.uint8), w, kp.view(torch.uint8), ksc, bt, re, B, width, L, out]
        times = {}
        for y in ys:
            f = (lambda y=y: kern((y, B, groups), args))
            out.fill_(1.0)
            f()
            bad = decode_check(out, kp, ksc, bt, q, w, re, nn, L)
            gf = graphed(f)
            times[y] = statistics.median(sustained(gf, a.iters, 1)[0] / 20 for _ in range(a.rounds))
            if bad:
                print(f"decode split {y}: {bad} MISMATCHES", flush=True)
        res.setdefault("decode_splits", []).append(
            {"B": B, "next_n": nn, "auto": auto, "per_sm": per_sm, "us": {str(y): t * 1e3 for y, t in times.items()}})
        print(f"decode splits B={B} next_n={nn} (auto {auto}, {per_sm}/SM): "
              + ", ".join(f"{y}: {t * 1e3:.1f} us" for y, t in times.items()), flush=True)
        del kp, fused, out
        torch.cuda.empty_cache()


def topk_rows(a, kerns, x, ke, tag, res, replays=1):
    """Each of kerns ({name: kernel}: this build, or --variants' DIRs) on
    the same rows, against the stable order, beside torch.topk (and
    FlashInfer's top-k with --flashinfer)."""
    R, N = x.shape
    out = torch.empty(R, ib.TOPK, dtype=torch.int32, device="cuda")
    ks = torch.zeros(R, dtype=torch.int32, device="cuda")
    xm = x.masked_fill(torch.arange(N, device="cuda")[None, :] >= ke[:, None], float("-inf"))
    stable = torch.sort(xm, dim=1, descending=True, stable=True)[1][:, :ib.TOPK].to(torch.int32)
    boundary_bins(xm, tag, res)
    mt, _ = sustained(lambda: torch.topk(xm, ib.TOPK, dim=1, sorted=True), a.iters, a.rounds)
    args = [x, ks, ke, R, N, out]
    rs = []
    for name, kern in kerns.items():
        fn = lambda: kern((R,), args)  # noqa: E731
        same = 0
        for _ in range(replays):
            fn()
            same += int(torch.equal(out, stable))
        mk, _ = sustained(fn, a.iters, a.rounds)
        key = f"topk_{tag}" if len(kerns) == 1 else f"topk_{tag}_{name}"
        res[key] = {"kwarm_ms": mk, "torch_ms": mt, "speedup": mt / mk,
                    "replays": replays, "replays_equal_stable": same}
        rs.append((name, res[key]))
        print(f"topk {tag} {name}: kwarm {mk:.3f} ms, torch.topk {mt:.3f} ms ({mt / mk:.2f}x), "
              f"{same}/{replays} replays equal to the stable order", flush=True)
    if a.flashinfer:
        flashinfer_rows(a, x, ke, stable, rs, replays)


def boundary_bins(xm, tag, res):
    """How many of a row's scores share the 11-bit bin (indexer_topk.cu's
    it_hist) of its top-k-th best: at most 4096 take the fast path, more
    the tie path (two more reads of the window)."""
    u = (xm + 0.0).view(torch.int32).to(torch.int64) & 0xffffffff   # + 0.0: -0.0 folded
    mono = torch.where(u >= 1 << 31, ~u & 0xffffffff, u | (1 << 31))
    del u
    b = mono >> 21
    del mono
    kth = torch.topk(xm, ib.TOPK, dim=1).values[:, -1:]
    kb = (b.gather(1, torch.argmax((xm == kth).int(), dim=1, keepdim=True)))
    n = (b == kb).sum(1).float()
    del b
    q = [float(v) for v in torch.quantile(n, torch.tensor([0.5, 0.9, 1.0], device="cuda"))]
    over = int((n > 4096).sum())
    res[f"topk_{tag}_boundary_bin"] = {"median": q[0], "p90": q[1], "max": q[2], "rows_over_4096": over}
    print(f"topk {tag}: boundary bin holds {q[0]:.0f} scores (median), {q[1]:.0f} (p90), "
          f"{q[2]:.0f} (max); {over} of {xm.shape[0]} rows over 4096", flush=True)


def flashinfer_rows(a, x, ke, stable, rs, replays):
    """FlashInfer's ragged top-k (bench/flashinfer_topk.cu) on the same
    rows, in its fastest mode and in its deterministic one with ties to
    the lower index (kwarm's order), recorded in each of rs' (name,
    result) and set against each kernel's time.  It returns the top-k as
    a set (its order is not the score order), so a replay counts as equal
    when its sorted indices are the stable top-k's, sorted."""
    import ctypes
    lib = ctypes.CDLL(a.flashinfer)
    lib.kw_fi_topk_ragged.restype = ctypes.c_int
    R, N = x.shape
    out = torch.empty(R, ib.TOPK, dtype=torch.int32, device="cuda")
    off = torch.zeros(R, dtype=torch.int32, device="cuda")
    ln = ke.to(torch.int32).contiguous()
    states = torch.zeros(1 << 20, dtype=torch.uint8, device="cuda")
    want = torch.sort(stable, dim=1)[0]
    P = ctypes.c_void_p
    for mode, det, tie in (("fast", 0, 0), ("deterministic", 1, 1)):
        def fn():
            e = lib.kw_fi_topk_ragged(P(x.data_ptr()), P(out.data_ptr()), P(off.data_ptr()),
                                      P(ln.data_ptr()), R, ib.TOPK, N, P(states.data_ptr()),
                                      det, tie, P(torch.cuda.current_stream().cuda_stream))
            if e:
                raise RuntimeError(f"FlashInfer top-k ({mode}): cudaError {e}")
        same = 0
        for _ in range(replays):
            fn()
            same += int(torch.equal(torch.sort(out, dim=1)[0], want))
        ms, _ = sustained(fn, a.iters, a.rounds)
        for _, r in rs:
            r[f"flashinfer_{mode}_ms"] = ms
            r[f"flashinfer_{mode}_replays_equal_stable_set"] = same
        vs = ", ".join(f"{name} {r['kwarm_ms'] / ms:.2f}x" for name, r in rs)
        print(f"    FlashInfer {mode}: {ms:.3f} ms (kwarm's time as a multiple of it: {vs}), "
              f"{same}/{replays} replays the stable top-k set", flush=True)


def topk(a, kern, res, prefill_kern):
    S, SK, H = 4096, 65536, 64
    g = torch.Generator(device="cuda").manual_seed(11)
    q = ib.fp8((S, H, D), g)
    k = ib.fp8((SK, D), g)
    w = torch.randn(S, H, generator=g, device="cuda") / H
    ksc = torch.rand(SK, generator=g, device="cuda") + 0.5
    ks, ke = windows(S, SK, False)
    x = torch.empty(S, SK, device="cuda")
    kwarm_prefill(prefill_kern, q, k, w, ksc, ks, ke, x)()
    x = x.masked_fill(x == float("-inf"), 0.0)   # rows end at ke: the kernel reads no further
    kerns = {"kwarm": kern}
    if a.variants:
        kerns = {os.path.basename(d.rstrip("/")): ib.Kernel(d, "topk_windowed", json.load(open(f"{d}/kernels.json")))
                 for d in a.variants}
    topk_rows(a, kerns, x, ke, "indexer_logits", res, replays=3)
    del q, k
    # ReLU plateaus: most of each row exactly 0.0, the rest positive.
    z = torch.relu(torch.randn(S, SK, generator=g, device="cuda") - 2.0)
    topk_rows(a, kerns, z, ke, "mostly_zero", res, replays=25)


def variants(a, dirs, dg, res):
    """Prefill of each DIR (kernel experiments) beside DeepGEMM on the
    --quick shapes and four short ones, same data, graphed, alternating
    rounds, each sustained; each DIR's output checked as prefill_case's."""
    cases = [(4096, 65536, 64, False), (2048, 65536, 64, False), (4096, 65536, 64, True),
             (4096, 65536, 32, False), (2048, 8192, 64, False), (8192, 8192, 64, False),
             (4096, 8192, 64, True), (2048, 8192, 32, True)]
    if a.shape:
        cases = [(int(S), int(SK), int(H), w == "cp") for S, SK, H, w in (x.split(":") for x in a.shape)]
    for S, SK, H, cp in cases:
        name = "logits_prefill" if H == 64 else "logits_prefill_h32"
        q, k, w, ksc, ks, ke, flops = prefill_data(S, SK, H, cp, S + SK + H + cp)
        out = torch.empty(S, SK, device="cuda")
        rows = sorted({0, 1, S // 2 - 1, S // 2, S - 1})
        calls = graph_calls(S, SK)
        fns, times, bad, first = {}, {}, {}, None
        for d in dirs:
            kern = ib.Kernel(d, name, json.load(open(f"{d}/kernels.json")))
            f = kwarm_prefill(kern, q, k, w, ksc, ks, ke, out)
            out.fill_(1.0)
            f()
            torch.cuda.synchronize()
            bad[d] = check(out, q, k, ksc, w, ks, ke, rows)
            # Every value against the first DIR's, bit for bit (the same
            # sums in the same order give the same bits).
            if first is None:
                first = out.clone()
            else:
                diff = int((out.view(torch.int32) != first.view(torch.int32)).sum().item())
                print(f"variant {d}: {diff} values differ from {dirs[0]}'s", flush=True)
                bad[d] += diff
            fns[d] = graphed(f, calls)
            times[d] = []
        dgf = dg.prefill(q, k, ksc, w, ks, ke)
        dout = dgf()
        torch.cuda.synchronize()
        bad["deepgemm"] = check(dout, q, k, ksc, w, ks, ke, rows)
        del dout
        fns["deepgemm"] = graphed(dgf, calls)
        times["deepgemm"] = []
        for _ in range(a.rounds):
            for d in fns:
                times[d].append(sustained(fns[d], a.iters, 1)[0] / calls)
        tag = f"S={S} SK={SK} H={H} {'cp' if cp else 'causal'}"
        dm = statistics.median(times["deepgemm"])
        mm = res["fp8_mm_tflops_start"]
        for d in fns:
            m = statistics.median(times[d])
            res.setdefault("variants", []).append(
                {"build": d, "S": S, "SK": SK, "H": H, "cp": cp, "ms": m, "rounds": times[d],
                 "tflops": flops / m / 1e9, "mismatches": bad[d], "over_deepgemm": m / dm})
            print(f"variant {tag} {d}: {m:.3f} ms ({min(times[d]):.3f}-{max(times[d]):.3f}) "
                  f"{flops / m / 1e9:.0f} TFLOP/s, {flops / m / 1e9 / mm:.3f} of _scaled_mm, "
                  f"{m / dm:.3f} x DeepGEMM, mismatches {bad[d]}", flush=True)
        del q, k, out, fns, first
        torch.cuda.empty_cache()


def splits(a, res):
    """kwarm's prefill at grid y 1, the contract's split and twice it, on
    shapes of few waves or unequal windows (graphed, alternating rounds,
    each sustained): the data behind launch/'s prefill_split."""
    cases = [(2048, 65536, 32, True), (2048, 32768, 32, False), (2048, 8192, 32, False),
             (2048, 8192, 32, True), (1024, 65536, 64, False), (1024, 32768, 32, True),
             (512, 65536, 64, False), (512, 131072, 32, True)]
    for S, SK, H, cp in cases:
        kern = ib.Kernel(a.dir, "logits_prefill" if H == 64 else "logits_prefill_h32",
                         json.load(open(f"{a.dir}/kernels.json")))
        q, k, w, ksc, ks, ke, flops = prefill_data(S, SK, H, cp, S + SK + H + cp)
        out = torch.empty(S, SK, device="cuda")
        auto = ib.prefill_split(kern, S, SK)
        ys = sorted({1, auto, 2 * auto, 4 * auto})
        fns, times = {}, {y: [] for y in ys}
        calls = graph_calls(S, SK)
        for y in ys:
            f = kwarm_prefill(kern, q, k, w, ksc, ks, ke, out, split=y)
            out.fill_(1.0)
            f()
            bad = check(out, q, k, ksc, w, ks, ke, sorted({0, S // 2 - 1, S // 2, S - 1}))
            fns[y] = graphed(f, calls)
            if bad:
                print(f"split {y}: {bad} MISMATCHES", flush=True)
        for _ in range(a.rounds):
            for y in ys:
                times[y].append(sustained(fns[y], a.iters, 1)[0] / calls)
        row = {"S": S, "SK": SK, "H": H, "cp": cp, "auto": auto,
               "ms": {str(y): statistics.median(times[y]) for y in ys}, "rounds": {str(y): times[y] for y in ys}}
        res.setdefault("splits", []).append(row)
        print(f"splits S={S} SK={SK} H={H} {'cp' if cp else 'causal'} (auto {auto}): "
              + ", ".join(f"y={y} {statistics.median(times[y]):.3f} ms" for y in ys), flush=True)
        del q, k, out, fns, first
        torch.cuda.empty_cache()


def jit_child():
    """A fresh process: DeepGEMM's first prefill call (its JIT compile, to
    an empty cache) against its second."""
    import time
    dg = DeepGEMM()
    q, k, w, ksc, ks, ke, _ = prefill_data(4096, 65536, 64, False, 1)
    f = dg.prefill(q, k, ksc, w, ks, ke)
    torch.cuda.synchronize()
    out = {}
    for tag in ("first", "second"):
        t0 = time.perf_counter()
        f()
        torch.cuda.synchronize()
        out[tag] = time.perf_counter() - t0
    print(json.dumps(out))


def profile_once(a, meta):
    """One prefill call of each, for Nsight Compute."""
    dg = DeepGEMM()
    kern = ib.Kernel(a.dir, "logits_prefill", meta)
    q, k, w, ksc, ks, ke, _ = prefill_data(4096, 65536, 64, False, 1)
    out = torch.empty(4096, 65536, device="cuda")
    kwarm_prefill(kern, q, k, w, ksc, ks, ke, out)()
    dg.prefill(q, k, ksc, w, ks, ke)()
    torch.cuda.synchronize()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--quick", action="store_true", help="the main shapes only")
    ap.add_argument("--only", choices=["prefill", "decode", "topk"])
    ap.add_argument("--flashinfer", metavar="LIB",
                    help="time FlashInfer's top-k too: the library bench/flashinfer_build.sh built")
    ap.add_argument("--variants", nargs="+", metavar="DIR",
                    help="only time these builds' prefill (experiments) against each other and DeepGEMM"
                    " (with --only topk: their top-k, on the same rows)")
    ap.add_argument("--shape", action="append", metavar="S:SK:H:causal|cp",
                    help="with --variants: race these prefill shapes instead of the eight")
    ap.add_argument("--eager", action="store_true",
                    help="also time prefill as eager launches (kwarm's through cupy)")
    ap.add_argument("--splits", action="store_true",
                    help="only time kwarm's prefill at several grid-y splits")
    ap.add_argument("--jit-child", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--profile", action="store_true",
                    help="one prefill call of each, for ncu; no timing")
    a = ap.parse_args()
    if a.jit_child:
        return jit_child()
    meta = json.load(open(f"{a.dir}/kernels.json"))
    if a.profile:
        return profile_once(a, meta)
    dg = DeepGEMM() if a.only != "topk" else None  # top-k alone needs no DeepGEMM
    res = {"device": torch.cuda.get_device_name(), "deepgemm_new_api": dg and dg.new}
    yardsticks(a, res, "start")
    if a.splits:
        splits(a, res)
        decode_splits(a, {1: ib.Kernel(a.dir, "logits_decode_n1", meta),
                          2: ib.Kernel(a.dir, "logits_decode_n2", meta)}, res)
        if a.json:
            json.dump(res, open(a.json, "w"), indent=1)
        return 0
    if a.variants and a.only != "topk":
        variants(a, a.variants, dg, res)
        yardsticks(a, res, "end")
        if a.json:
            json.dump(res, open(a.json, "w"), indent=1)
        return 0
    if a.only in (None, "prefill"):
        kerns = {64: ib.Kernel(a.dir, "logits_prefill", meta), 32: ib.Kernel(a.dir, "logits_prefill_h32", meta)}
        if a.quick:
            cases = [(4096, 65536, 64, False), (2048, 65536, 64, False), (4096, 65536, 64, True),
                     (4096, 65536, 32, False)]
        else:
            cases = [(S, SK, H, cp) for H in (64, 32) for S in (2048, 4096, 8192)
                     for SK in (8192, 32768, 65536, 131072) for cp in (False, True)
                     if not (cp and (SK % S or SK < 2 * S))]
        for S, SK, H, cp in cases:
            prefill_case(a, kerns[H], dg, S, SK, H, cp, res)
    if a.only in (None, "decode"):
        kerns = {1: ib.Kernel(a.dir, "logits_decode_n1", meta), 2: ib.Kernel(a.dir, "logits_decode_n2", meta)}
        cases = [(128, 65536), (64, 32768)] + ([] if a.quick else [(32, 65536), (8, 65536), (1, 65536)])
        for B, L in cases:
            for nn in (1, 2):
                decode_case(a, kerns, dg, B, L, nn, res)
    if a.only in (None, "topk"):
        topk(a, ib.Kernel(a.dir, "topk_windowed", meta), res, ib.Kernel(a.dir, "logits_prefill", meta))
    yardsticks(a, res, "end")
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
    bad = sum(r["kwarm_mismatches"] + r["deepgemm_mismatches"] for r in res.get("prefill", []) + res.get("decode", []))
    return 0 if bad == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
