#!/usr/bin/env python3
"""indexer_logits and indexer_topk on the H200 against torch and Triton.

usage: indexer_bench.py DIR [--json F] [--iters N] [--rounds R]

DIR holds the cubins and kernels.json that `bench_indexer DIR` wrote (the
DeepSeek-V3.2 keys: 64 heads of 128, top-k 2048).  Every row runs on the
same data, made here once on the GPU; kwarm's kernels are loaded through
cupy.  Times are CUDA events, the median of --iters launches after warm-up.

- fp8 matrix rate: an 8192^3 torch._scaled_mm (e4m3 in, bf16 out),
  timed with kwarm's prefill in --rounds rounds (3), each of the two after
  half a second of itself, so that each runs at the clock the GPU's
  power cap gives it and not at the one the other left (see rounds());
  the two rows are the medians of the rounds.
- prefill logits: 4096 queries over 65536 K rows, causal windows (query t
  sees rows [0, 65536 - 4096 + t + 1)); TFLOP/s counts 2*H*D per (query,
  row in window).  Rows: kwarm, a torch path (bf16 matmul, relu, weighted
  head sum, mask; in chunks of queries), a Triton fp8 kernel (tl.dot on
  e4m3).  kwarm's output is checked against a float64 reference on
  sampled rows with the spec's tolerance.
- paged decode logits: 128 requests, 65536 visible rows each, pages of 64
  rows scattered over the pool, next_n 1 and 2; K bytes read / time beside
  a 1 GiB device copy's bandwidth (read + write bytes / time).
- indexer_topk: 4096 rows x 65536, top-k 2048, against torch.topk on the
  same logits; the output must equal a stable torch order (sort by value
  descending, ties by lower index).
"""
import argparse
import json
import math
import statistics
import sys
import time

import cupy
import torch
import triton
import triton.language as tl

H, D, TOPK = 64, 128, 2048


def timed(fn, iters):
    """Median milliseconds of fn() over iters runs (after 2 warm-ups)."""
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        ms.append(a.elapsed_time(b))
    return statistics.median(ms)


_STREAMS = {}  # torch stream handle -> cupy.cuda.ExternalStream


class Kernel:
    """A kwarm cubin loaded through cupy, launched on torch tensors."""

    def __init__(self, d, name, meta):
        self.meta = meta[name]
        self.mod = cupy.RawModule(path=f"{d}/{name}.cubin")
        self.fn = self.mod.get_function(self.meta["entry"])
        self.fn.max_dynamic_shared_size_bytes = self.meta["shmem"]

    def __call__(self, grid, args):
        conv = []
        for a in args:
            if isinstance(a, torch.Tensor):
                conv.append(cupy.asarray(a))
            else:
                conv.append(cupy.int32(a))
        # On torch's current stream, so that events and CUDA graphs
        # captured through torch see the launch (one cupy wrapper per
        # stream, not one per launch).
        h = torch.cuda.current_stream().cuda_stream
        st = _STREAMS.get(h)
        if st is None:
            st = _STREAMS[h] = cupy.cuda.ExternalStream(h)
        self.fn(grid, (self.meta["threads"],), tuple(conv),
                shared_mem=self.meta["shmem"], stream=st)


def fp8(shape, gen, scale=1.0):
    return (torch.randn(shape, generator=gen, device="cuda") * scale).to(torch.float8_e4m3fn)


def matrix_peer():
    """The fp8 matrix-rate peer: a launch of an 8192^3 torch._scaled_mm,
    and its FLOPs."""
    n = 8192
    g = torch.Generator(device="cuda").manual_seed(1)
    a = fp8((n, n), g)
    b = fp8((n, n), g).t()
    one = torch.tensor(1.0, device="cuda")
    return (lambda: torch._scaled_mm(a, b, scale_a=one, scale_b=one,
                                     out_dtype=torch.bfloat16)), 2.0 * n ** 3


def settle(fn, seconds):
    """Runs fn back to back for about seconds, so that the clocks the
    timings below see are the ones sustained load gets."""
    t0 = time.monotonic()
    while time.monotonic() - t0 < seconds:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()


def rounds(a, peer, pflops, kern_fn, kflops, res):
    """The peer and kwarm's prefill, each timed in its own sustained state:
    a.rounds rounds of half a second of the peer, then its timing (7
    launches for each prefill one: 0.75 against 5 ms), then half a second
    of the prefill and its timing.  The H200 caps its power (about 700 W,
    nvidia-smi: "SW power cap"): sustained, the 8192^3 _scaled_mm runs at
    an SM clock of 1230-1440 MHz, the prefill at 1860-1890 MHz.  A short
    burst of either right after idle runs at 1980 MHz, and one timed right
    after the other runs at the clock the other left: the peer timed alone
    at start read 1308-1475 TFLOP/s, interleaved launch by launch the
    prefill read 0.50 of it, each in its own sustained state 0.70 (H200,
    docs/perf.md).  Medians of the rounds go to res (fp8_mm_tflops,
    prefill_ms, prefill_tflops); each round's ratio is printed."""
    pr, kr = [], []
    for r in range(a.rounds):
        settle(peer, 0.5)
        pr.append(pflops / (timed(peer, 7 * a.iters) / 1e3) / 1e12)
        settle(kern_fn, 0.5)
        kr.append(timed(kern_fn, a.iters))
        print(f"  round {r}: _scaled_mm {pr[-1]:.0f} TFLOP/s, prefill {kr[-1]:.3f} ms = "
              f"{kflops / kr[-1] / 1e9:.0f} TFLOP/s ({kflops / kr[-1] / 1e9 / pr[-1]:.3f})", flush=True)
    res["fp8_mm_tflops_rounds"], res["prefill_ms_rounds"] = pr, kr
    res["fp8_mm_tflops"] = statistics.median(pr)
    res["prefill_ms"] = statistics.median(kr)
    res["prefill_tflops"] = kflops / (res["prefill_ms"] / 1e3) / 1e12


def ref_rows(q, w, k, ks, rows, kscale):
    """float64 logits and absolute-value sums of the sampled query rows."""
    kd = k.double()
    out, mag = [], []
    for t in rows:
        s = q[t].double() @ kd.t()                       # [H, N]
        v = (s.clamp(min=0) * w[t].double()[:, None]).sum(0) * kscale.double()
        m = ((q[t].double().abs() @ kd.abs().t()) * w[t].double().abs()[:, None]).sum(0) * kscale.double().abs()
        out.append(v)
        mag.append(m)
    return out, mag


def check_rows(got, ref, mag, lo, hi):
    """Mismatches of one output row: tolerance inside [lo, hi), -inf
    outside."""
    n = got.shape[0]
    idx = torch.arange(n, device="cuda")
    inw = (idx >= lo) & (idx < hi)
    tol = mag * 2.0 ** -12 + 2.0 ** -100
    bad_in = (inw & ~((got.double() - ref).abs() <= tol)).sum().item()
    bad_out = (~inw & ~(got == float("-inf"))).sum().item()
    return bad_in + bad_out


@triton.jit
def tr_logits(q_ptr, w_ptr, k_ptr, s_ptr, ke_ptr, out_ptr, N, stride,
              HH: tl.constexpr, DD: tl.constexpr, BN: tl.constexpr):
    t = tl.program_id(0)
    nb = tl.program_id(1)
    hi = tl.load(ke_ptr + t)
    rows = nb * BN + tl.arange(0, BN)
    if nb * BN >= hi:
        tl.store(out_ptr + t * stride + rows, float("-inf"), mask=rows < N)
        return
    h = tl.arange(0, HH)
    d = tl.arange(0, DD)
    q = tl.load(q_ptr + (t * HH + h[:, None]) * DD + d[None, :])     # [H, D]
    k = tl.load(k_ptr + rows[:, None] * DD + d[None, :], mask=rows[:, None] < N, other=0.0)
    s = tl.dot(k, tl.trans(q))                                         # [BN, H]
    w = tl.load(w_ptr + t * HH + h)
    v = tl.sum(tl.maximum(s, 0.0) * w[None, :], axis=1)
    v = v * tl.load(s_ptr + rows, mask=rows < N, other=0.0)
    v = tl.where(rows < hi, v, float("-inf"))
    tl.store(out_ptr + t * stride + rows, v, mask=rows < N)


def prefill(kern, iters, res, peers=True):
    T, N = 4096, 65536
    g = torch.Generator(device="cuda").manual_seed(2)
    q = fp8((T, H, D), g)
    k = fp8((N, D), g)
    w = torch.randn(T, H, generator=g, device="cuda") / H
    ksc = torch.rand(N, generator=g, device="cuda") + 0.5
    ks = torch.zeros(T, dtype=torch.int32, device="cuda")
    ke = (N - T + 1 + torch.arange(T, device="cuda")).to(torch.int32)
    out = torch.empty(T, N, device="cuda")
    flops = 2.0 * H * D * float((ke - ks).sum().item())
    qb = kern.meta["queries"]
    grid = ((T + qb - 1) // qb, prefill_split(kern, T, N))
    args = [q.view(torch.uint8), w, k.view(torch.uint8), ksc, ks, ke, T, N, N, out]
    ms = timed(lambda: kern(grid, args), iters)
    res["prefill_ms"] = ms
    res["prefill_tflops"] = flops / (ms / 1e3) / 1e12
    rows = [0, 1, 777, 2048, 4095]
    ref, mag = ref_rows(q, w, k, ks, rows, ksc)
    res["prefill_checked_rows"] = len(rows)
    res["prefill_mismatches"] = sum(check_rows(out[t], ref[i], mag[i], 0, ke[t].item())
                                    for i, t in enumerate(rows))
    if not peers:
        return (lambda: kern(grid, args)), flops
    # torch: bf16 matmul, relu, weighted head sum, mask; chunks of queries
    qb16, kb16, wb16 = q.to(torch.bfloat16), k.to(torch.bfloat16), w.to(torch.bfloat16)
    idx = torch.arange(N, device="cuda")
    tout = torch.empty(T, N, device="cuda")

    def torch_path():
        c = 128
        for t0 in range(0, T, c):
            s = torch.matmul(qb16[t0:t0 + c].reshape(-1, D), kb16.t())   # [c*H, N]
            s = s.view(c, H, N).relu_()
            v = torch.einsum("thn,th->tn", s, wb16[t0:t0 + c]).float() * ksc
            tout[t0:t0 + c] = v.masked_fill(idx[None, :] >= ke[t0:t0 + c, None], float("-inf"))
    tms = timed(torch_path, max(1, iters // 4))
    res["prefill_torch_ms"] = tms
    res["prefill_torch_tflops"] = flops / (tms / 1e3) / 1e12
    tri = torch.empty(T, N, device="cuda")
    BN = 128
    trgrid = (T, N // BN)
    trms = timed(lambda: tr_logits[trgrid](q, w, k, ksc, ke, tri, N, N, HH=H, DD=D, BN=BN), iters)
    res["prefill_triton_ms"] = trms
    res["prefill_triton_tflops"] = flops / (trms / 1e3) / 1e12
    res["prefill_triton_mismatches"] = sum(check_rows(tri[t], ref[i], mag[i], 0, ke[t].item())
                                           for i, t in enumerate(rows))
    del qb16, kb16, tout, tri
    return (lambda: kern(grid, args)), flops


def copy_gbps(iters):
    n = 1 << 30
    a = torch.empty(n, dtype=torch.uint8, device="cuda")
    b = torch.empty_like(a)
    ms = timed(lambda: b.copy_(a), iters)
    return 2 * n / (ms / 1e3) / 1e9


def blocks_per_sm(kern):
    """Resident blocks of kern per SM (2 when the driver cannot say)."""
    try:
        return cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            kern.fn.kernel.ptr, kern.meta["threads"], kern.meta["shmem"])
    except Exception:
        return 2


def prefill_split(kern, rows, num_k):
    """Grid y of a prefill launch: launch/op_indexer.c's prefill_split (a
    grid under one wave of resident blocks gets 4 waves' worth of parts,
    at most one per 4096 rows of num_k; else 1)."""
    qb = kern.meta["queries"]
    x = (rows + qb - 1) // qb
    slots = blocks_per_sm(kern) * torch.cuda.get_device_properties(0).multi_processor_count
    if x >= slots:
        return 1
    part = kern.meta.get("part_rows", 4096)   # an experiment's kernels.json may set it
    return max(1, min((4 * slots + x - 1) // x, num_k // part))


def decode_split(blocks, tiles, per_sm):
    """Blocks per request for the decode grid: launch/op_indexer.c's
    decode_split (any split is correct, see kw_kernels.h): the one of
    1..max(80, one wave) whose grid fills its last wave of resident blocks
    best, weighed by how evenly the 64-row tiles divide among the
    warpgroups, less 5% per wave; ties go to the smaller split."""
    slots = per_sm * torch.cuda.get_device_properties(0).multi_processor_count
    best = (0.0, 1)
    for s in range(1, max(80, slots // blocks) + 1):
        waves = blocks * s / slots
        per_wg = tiles / (2 * s)
        eff = waves / math.ceil(waves) * per_wg / math.ceil(per_wg)
        eff *= 1.0 - 0.05 * math.ceil(waves)   # each wave: another start-up
        if eff > best[0] + 1e-9:
            best = (eff, s)
    return best[1]


def decode(kern, nn, iters, res, split=0):
    B, rows, PR = 128, 65536, 64
    width = rows // PR
    g = torch.Generator(device="cuda").manual_seed(3 + nn)
    pages = B * width
    kp = fp8((pages, PR, D), g)
    ksc = torch.rand(pages, PR, generator=g, device="cuda") + 0.5
    bt = torch.randperm(pages, generator=g, device="cuda").to(torch.int32).view(B, width)
    Q = B * nn
    q = fp8((Q, H, D), g)
    w = torch.randn(Q, H, generator=g, device="cuda") / H
    re = torch.full((Q,), rows, dtype=torch.int32, device="cuda")
    for i in range(nn):
        re[i::nn] = rows - (nn - 1 - i)
    out = torch.empty(Q, rows, device="cuda")
    qb = kern.meta["queries"]
    groups = (nn + qb - 1) // qb
    per_sm = blocks_per_sm(kern)
    split = split or decode_split(B * groups, (rows + 63) // 64, per_sm)
    res[f"decode_n{nn}_blocks_per_sm"] = per_sm
    res[f"decode_n{nn}_split"] = split
    args = [q.view(torch.uint8), w, kp.view(torch.uint8), ksc, bt, re, B, width, rows, out]
    ms = timed(lambda: kern((split, B, groups), args), iters)
    kbytes = B * rows * D
    res[f"decode_n{nn}_ms"] = ms
    res[f"decode_n{nn}_k_gbps"] = kbytes / (ms / 1e3) / 1e9
    # check two queries against float64
    bad = 0
    for i in (0, Q - 1):
        b = i // nn
        kr = kp[bt[b].long()].reshape(-1, D)[: re[i].item()]
        sr = ksc[bt[b].long()].reshape(-1)[: re[i].item()]
        s = q[i].double() @ kr.double().t()
        v = (s.clamp(min=0) * w[i].double()[:, None]).sum(0) * sr.double()
        m = ((q[i].double().abs() @ kr.double().abs().t()) * w[i].double().abs()[:, None]).sum(0) * sr.double()
        full = torch.full((rows,), float("-inf"), dtype=torch.float64, device="cuda")
        fm = torch.zeros(rows, dtype=torch.float64, device="cuda")
        full[: re[i].item()] = v
        fm[: re[i].item()] = m
        bad += check_rows(out[i], full, fm, 0, re[i].item())
    res[f"decode_n{nn}_mismatches"] = bad


def topk(kern, iters, res):
    R, N = 4096, 65536
    g = torch.Generator(device="cuda").manual_seed(4)
    x = torch.randn(R, N, generator=g, device="cuda")
    x = torch.round(x * 256) / 256          # ties, as fp8-derived logits have
    re = torch.full((R,), N, dtype=torch.int32, device="cuda")
    out = torch.empty(R, TOPK, dtype=torch.int32, device="cuda")
    args = [x, re, re, R, N, out]
    ms = timed(lambda: kern((R,), args), iters)
    tms = timed(lambda: torch.topk(x, TOPK, dim=1, sorted=True), iters)
    stable = torch.sort(x, dim=1, descending=True, stable=True)[1][:, :TOPK]
    res["topk_ms"] = ms
    res["topk_torch_ms"] = tms
    res["topk_speedup"] = tms / ms
    res["topk_identical_to_stable_torch"] = bool(torch.equal(stable.to(torch.int32), out))


def also(a, dirs, res):
    """Prefill of DIR and DIR2 again, alternately, then each's decode rows
    (res keys prefixed also_ for DIR2)."""
    for rnd in range(2):
        for tag, d in dirs:
            r = {}
            meta = json.load(open(f"{d}/kernels.json"))
            prefill(Kernel(d, "logits_prefill", meta), a.iters, r, peers=False)
            res[f"{tag}prefill_ms_{rnd}"] = r["prefill_ms"]
            res[f"{tag}prefill_mismatches_{rnd}"] = r["prefill_mismatches"]
            print(f"  {d} prefill (round {rnd}): {r['prefill_ms']:.3f} ms = {r['prefill_tflops']:.0f} TFLOP/s "
                  f"({r['prefill_tflops'] / res['fp8_mm_tflops']:.2f}), {r['prefill_mismatches']} mismatches", flush=True)
            torch.cuda.empty_cache()
    cg = copy_gbps(a.iters)
    for rnd in range(2):
        for tag, d in dirs:
            meta = json.load(open(f"{d}/kernels.json"))
            for nn in (1, 2):
                r = {}
                decode(Kernel(d, f"logits_decode_n{nn}", meta), nn, a.iters, r)
                print(f"  {d} decode next_n {nn} (round {rnd}): {r[f'decode_n{nn}_ms']:.3f} ms = "
                      f"{r[f'decode_n{nn}_k_gbps'] / cg:.2f} of copy {cg:.0f} GB/s, "
                      f"{r[f'decode_n{nn}_mismatches']} mismatches", flush=True)
                res[f"{tag}decode_n{nn}_ms_{rnd}"] = r[f"decode_n{nn}_ms"]
                torch.cuda.empty_cache()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=3,
                    help="rounds of the peer and the prefill, each timed after "
                         "half a second of itself (3)")
    ap.add_argument("--also", metavar="DIR2",
                    help="time DIR2's logits cubins too, in this process")
    a = ap.parse_args()
    meta = json.load(open(f"{a.dir}/kernels.json"))
    res = {"device": torch.cuda.get_device_name()}
    peer, pflops = matrix_peer()
    kern_fn, kflops = prefill(Kernel(a.dir, "logits_prefill", meta), a.iters, res)
    rounds(a, peer, pflops, kern_fn, kflops, res)
    print(f"fp8 _scaled_mm 8192^3: {res['fp8_mm_tflops']:.0f} TFLOP/s (median of {a.rounds} rounds)", flush=True)
    print(f"prefill logits: kwarm {res['prefill_ms']:.3f} ms = {res['prefill_tflops']:.0f} TFLOP/s "
          f"({res['prefill_tflops'] / res['fp8_mm_tflops']:.3f} of _scaled_mm), "
          f"{res['prefill_mismatches']} mismatches in {res['prefill_checked_rows']} rows", flush=True)
    print(f"  torch bf16 path {res['prefill_torch_ms']:.3f} ms = {res['prefill_torch_tflops']:.0f} TFLOP/s "
          f"(kwarm {res['prefill_torch_ms'] / res['prefill_ms']:.1f}x faster)", flush=True)
    print(f"  triton fp8 {res['prefill_triton_ms']:.3f} ms = {res['prefill_triton_tflops']:.0f} TFLOP/s "
          f"(kwarm {res['prefill_triton_ms'] / res['prefill_ms']:.1f}x faster), "
          f"{res['prefill_triton_mismatches']} mismatches", flush=True)
    torch.cuda.empty_cache()
    dirs = [("", a.dir)] + ([("also_", a.also)] if a.also else [])
    if a.also:
        also(a, dirs, res)
    res["copy_gbps"] = copy_gbps(a.iters)
    for nn in (1, 2):
        decode(Kernel(a.dir, f"logits_decode_n{nn}", meta), nn, a.iters, res)
        print(f"decode next_n {nn} (split {res[f'decode_n{nn}_split']}, "
              f"{res[f'decode_n{nn}_blocks_per_sm']} blocks/SM): "
              f"{res[f'decode_n{nn}_ms']:.3f} ms, K read {res[f'decode_n{nn}_k_gbps']:.0f} GB/s "
              f"= {res[f'decode_n{nn}_k_gbps'] / res['copy_gbps']:.2f} of copy {res['copy_gbps']:.0f} GB/s, "
              f"{res[f'decode_n{nn}_mismatches']} mismatches", flush=True)
        torch.cuda.empty_cache()
    topk(Kernel(a.dir, "topk_rows", meta), a.iters, res)
    print(f"indexer_topk 4096x65536 k=2048: kwarm {res['topk_ms']:.3f} ms, torch.topk {res['topk_torch_ms']:.3f} ms "
          f"({res['topk_speedup']:.1f}x), identical to stable torch order: {res['topk_identical_to_stable_torch']}",
          flush=True)
    if a.json:
        json.dump(res, open(a.json, "w"), indent=1)
    ok = res["prefill_mismatches"] == 0 and res["decode_n1_mismatches"] == 0 and \
        res["decode_n2_mismatches"] == 0 and res["topk_identical_to_stable_torch"]
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
