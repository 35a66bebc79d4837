#!/usr/bin/env python3
"""kwarm.torch on a GPU (issue 22 point 4): every op against its reference,
the DSA indexer pipelines eager, in a CUDA graph and under torch.compile,
and the miss rules.

usage: gpu_ops.py [--kwarmd build/kwarmd | --socket PATH] [--out DIR]
                  [--jobs N] [--seed S] [--case v32|v4 ...]

For each case (DeepSeek-V3.2 at dcp_world 2, rank 1; DeepSeek-V4-Flash at
its defaults) it starts a kwarmd on a fresh cache (or uses the one at
--socket), kwarm.torch.load()s the rank on torch's current device and:

1. runs every op at every class its keys cover (compress ratios, slice
   classes, index_conversion's rows, windowed or not, row_starts or not,
   every page_rows) on random inputs and compares every output element
   with a reference written here from docs/spec/kernels.md (float64 for
   indexer_logits, |got - ref| <= 2^-12 m + 2^-100, -inf exactly; integers
   exactly);
2. runs the prefill pipeline (prefill_chunk_metadata -> indexer_logits ->
   indexer_topk -> index_conversion) and the decode pipeline
   (indexer_logits_paged -> indexer_topk -> [with DCP:
   dcp_pack_topk_candidates -> gather with rank 0's packed candidates,
   built the same way through rank 0's deployment -> dcp_stable_topk] ->
   index_conversion) eager, checks each stage against its reference, then
   captures each in a torch.cuda.CUDAGraph and replays it (bit-equal to
   eager), then under torch.compile(fullgraph=True) (equal);
3. checks that no call was a runtime miss (every class the calls reached
   was warmed);
4. (first case) on a kwarmd of its own (--kwarmd, a fresh cache, so the
   key is not cached anywhere), loads the rank with
   max_num_batched_tokens 1, so a prefill_chunk_metadata query_slice_stop
   class is not warmed: the call raises RuntimeError during capture and
   leaves the loaded keys as they were; outside capture it is served,
   counted as a runtime miss, and kwarmd's miss audit shows it with this
   pid.

Prints one line per check and a JSON summary (also written to
DIR/gpu_ops.json); exit status 1 when any check failed.  Needs torch with
CUDA, libkwarm ($KWARM_LIBRARY) and the package (client/python, put on
sys.path when not installed).
"""
import argparse
import json
import os
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
try:
    import kwarm  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import torch  # noqa: E402

import kwarm.torch as kt  # noqa: E402
import kwarm_client  # noqa: E402
from test_client import Kwarmd  # noqa: E402

I32, I64, F32, F64, U8 = torch.int32, torch.int64, torch.float32, torch.float64, torch.uint8
FP8 = torch.float8_e4m3fn
OPS = torch.ops.kwarm

CASES = {
    "v32": ("deepseek-v3.2-exp.json", {"dcp_world": 2, "dcp_rank": 1}),
    "v4": ("deepseek-v4-flash.json", {}),
}


# ---------------------------------------------------------------------------
# Results.
# ---------------------------------------------------------------------------
class Report:
    def __init__(self):
        self.checks = []
        self.prefix = ""

    def check(self, name, ok, detail=""):
        name = self.prefix + name
        self.checks.append({"check": name, "ok": bool(ok), "detail": str(detail)})
        print("%s %s%s" % ("PASS" if ok else "FAIL", name,
                           (": " + str(detail)) if detail and not ok else ""),
              flush=True)
        return ok

    def guard(self, name, fn, *args):
        """Runs fn; an exception is a failed check."""
        try:
            return fn(*args)
        except Exception as e:
            self.check(name, False, "%s: %s\n%s" % (type(e).__name__, e,
                                                     traceback.format_exc()))
            return None

    def failed(self):
        return [c for c in self.checks if not c["ok"]]


R = Report()


def equal(name, got, ref):
    got, ref = got.cpu(), ref.cpu()
    if got.shape != ref.shape or got.dtype != ref.dtype:
        return R.check(name, False, "shape/dtype %s %s, reference %s %s"
                       % (tuple(got.shape), got.dtype, tuple(ref.shape), ref.dtype))
    bad = (got != ref).nonzero()
    if len(bad):
        i = tuple(bad[0].tolist())
        return R.check(name, False, "%d of %d elements differ; first at %s: "
                       "got %s, reference %s" % (len(bad), got.numel(), i,
                                                 got[i].item(), ref[i].item()))
    return R.check(name, True)


def bit_equal(name, a, b):
    a, b = a.cpu().contiguous(), b.cpu().contiguous()
    if a.dtype.is_floating_point:
        a, b = a.view(torch.int32), b.view(torch.int32)
    return equal(name, a, b)


def close_logits(name, got, ref, m):
    """indexer_logits' tolerance: -inf exactly, else |got - ref| <=
    2^-12 m + 2^-100."""
    got = got.cpu().to(F64)
    if got.shape != ref.shape:
        return R.check(name, False, "shape %s, reference %s"
                       % (tuple(got.shape), tuple(ref.shape)))
    ninf = torch.isneginf(ref)
    if not torch.equal(torch.isneginf(got), ninf):
        i = tuple((torch.isneginf(got) != ninf).nonzero()[0].tolist())
        return R.check(name, False, "-inf differs at %s: got %s, reference %s"
                       % (i, got[i].item(), ref[i].item()))
    fin = ~ninf
    err = (got[fin] - ref[fin]).abs()
    tol = m[fin] * 2.0 ** -12 + 2.0 ** -100
    if not torch.isfinite(got[fin]).all() or (err > tol).any():
        j = int(torch.nonzero(~(err <= tol))[0])
        return R.check(name, False, "%d of %d beyond tolerance; worst err/tol %.3g "
                       "(got %r, reference %r)"
                       % (int((~(err <= tol)).sum()), fin.sum().item(),
                          (err / tol).max().item(), got[fin][j].item(),
                          ref[fin][j].item()))
    return R.check(name, True)


# ---------------------------------------------------------------------------
# References (docs/spec/kernels.md), on the CPU.
# ---------------------------------------------------------------------------
def share(n, W, Rk, I):
    """Rank Rk's share of a length n."""
    if W <= 1:
        return n
    base = n // I // W * I
    rem = n - base * W
    return base + min(max(rem - Rk * I, 0), I)


def local_of(t, W, I):
    return (t // (W * I)) * I + t % I


def global_of(l, W, Rk, I):
    return (l // I) * (W * I) + Rk * I + l % I


def ref_prefill_chunk_metadata(qsl, seq, cu_k, s0, s1, total_k, ratio, W, Rk, I):
    qsl, seq, cu_k = qsl.tolist(), seq.tolist(), cu_k.tolist()
    rows = max(s1 - s0, 0)
    ks, ke, t2s = [None] * rows, [None] * rows, [None] * total_k
    for b in range(len(seq)):
        q_len = qsl[b + 1] - qsl[b]
        start = seq[b] - q_len
        for j in range(q_len):
            q = qsl[b] + j
            if s0 <= q < s1:
                n = share((start + 1 + j) // ratio, W, Rk, I)
                ks[q - s0], ke[q - s0] = cu_k[b], cu_k[b] + n
        for r in range(cu_k[b], cu_k[b + 1]):
            t2s[r] = b
    assert None not in ks + ke + t2s, "inputs leave outputs unwritten"
    return (torch.tensor(ks, dtype=I32), torch.tensor(ke, dtype=I32),
            torch.tensor(t2s, dtype=I32))


def ref_compressed_slot_mapping(slot, qsl, seq, bt, bs, ratio, W, Rk, I):
    slot, qsl, seq, bt = slot.tolist(), qsl.tolist(), seq.tolist(), bt.tolist()
    out = [-1] * len(slot)
    for b in range(len(seq)):
        q_len = qsl[b + 1] - qsl[b]
        for j in range(q_len):
            tok, pos = qsl[b] + j, seq[b] - q_len + j
            if (pos + 1) % ratio or (W == 1 and slot[tok] == -1):
                continue
            state = pos // ratio
            if W > 1:
                v = state % (bs * W)
                if (v // I) % W != Rk:
                    continue
                state = (state // (bs * W)) * bs + (v // (I * W)) * I + v % I
            blk = state // bs
            if blk < len(bt[b]):
                out[tok] = bt[b][blk] * bs + state % bs
    return torch.tensor(out, dtype=I64)


def ref_index_conversion(req_id, bt, topk_pos, prefill_req, ws_start, wrs, bs,
                         stride_rows, W, Rk, I, compact):
    req_id, bt, pos = req_id.tolist(), bt.tolist(), topk_pos.tolist()
    preq = prefill_req.tolist() if prefill_req is not None else None
    wss = ws_start.tolist() if ws_start is not None else None
    out, valid = [], []
    for row, ts in enumerate(pos):
        o = []
        for t in ts:
            if t < 0:
                o.append(-1)
                continue
            owner, l = (t // I) % W, local_of(t, W, I)
            blk, off = l // bs, l % bs
            if preq is not None and preq[row] >= 0:
                o.append(owner * wrs + wss[preq[row]] + l)
            elif owner != Rk or blk >= len(bt[req_id[row]]):
                o.append(-1)
            else:
                o.append(bt[req_id[row]][blk] * stride_rows + off)
        n = sum(1 for v in o if v != -1)
        if compact:
            o = [v for v in o if v != -1] + [-1] * (len(o) - n)
        out.append(o)
        valid.append(n)
    return torch.tensor(out, dtype=I32), torch.tensor(valid, dtype=I32)


def ref_pack(logits, topk_local, row_starts, W, Rk, I):
    logits, p = logits.cpu(), topk_local.cpu().to(I64)
    rows, cols = logits.shape
    rs = row_starts.cpu().to(I64)[:, None] if row_starts is not None else 0
    col = p + rs
    ok = (p >= 0) & (col < cols)
    score = torch.gather(logits, 1, torch.where(ok, col, 0))
    score = torch.where(ok, score, torch.tensor(float("-inf")))
    ids = torch.where(ok, global_of(p, W, Rk, I), -1).to(F32)
    return torch.stack([score, ids], dim=-1)


def _order_key(score, ident, pos):
    nan = score != score
    return (nan, 0.0 if nan else -score, ident, pos)


def ref_stable_topk(gathered, topk):
    g = gathered.cpu().to(F64).tolist()
    out = []
    for row in g:
        cands = []
        for pos, (score, ident) in enumerate(row):
            if ident == ident and ident >= 0 and float(ident).is_integer():
                cands.append(_order_key(score + 0.0, ident, pos))
        cands.sort()
        ids = [int(c[2]) for c in cands[:topk]]
        out.append(ids + [-1] * (topk - len(ids)))
    return torch.tensor(out, dtype=I32)


def ref_topk(logits, ks, ke, row_end, topk):
    logits = logits.cpu()
    out = torch.full((logits.shape[0], topk), -1, dtype=I32)
    for r in range(logits.shape[0]):
        s, e = (int(ks[r]), int(ke[r])) if ks is not None else (0, int(row_end[r]))
        v = logits[r, s:e].to(F64)
        nan = torch.isnan(v)
        key = torch.where(nan, torch.tensor(float("inf"), dtype=F64), -v)
        o1 = torch.sort(key, stable=True).indices
        o2 = torch.sort(nan[o1].to(torch.int8), stable=True).indices
        best = o1[o2][:topk]
        out[r, :len(best)] = best.to(I32)
    return out


def fp8_f64(t):
    return t.cpu().view(FP8).to(F64)


def ref_logits(q, w, k, k_scale, ks, ke):
    """(reference, m) of prefill indexer_logits, [T][N] float64."""
    qf, kf = fp8_f64(q), fp8_f64(k)
    w64, s64 = w.cpu().to(F64), k_scale.cpu().to(F64)
    dots = torch.einsum("thd,nd->thn", qf, kf)
    val = (dots.clamp(min=0) * w64[:, :, None]).sum(1) * s64[None, :]
    m = (torch.einsum("thd,nd->thn", qf.abs(), kf.abs()) * w64.abs()[:, :, None]
         ).sum(1) * s64.abs()[None, :]
    n = torch.arange(kf.shape[0])[None, :]
    inside = (n >= ks.cpu().to(I64)[:, None]) & (n < ke.cpu().to(I64)[:, None])
    return torch.where(inside, val, float("-inf")), m


def ref_logits_paged(q, w, k_pages, k_scale_pages, bt, row_end, next_n, max_rows):
    qf, kp = fp8_f64(q), fp8_f64(k_pages)
    w64, sp = w.cpu().to(F64), k_scale_pages.cpu().to(F64)
    bt, row_end = bt.cpu().to(I64), row_end.cpu().to(I64)
    page_rows = kp.shape[1]
    Q = qf.shape[0]
    ref = torch.full((Q, max_rows), float("-inf"), dtype=F64)
    m = torch.zeros((Q, max_rows), dtype=F64)
    for i in range(Q):
        b, n = i // next_n, int(row_end[i])
        j = torch.arange(n)
        page, slot = bt[b][j // page_rows], j % page_rows
        kr, sr = kp[page, slot], sp[page, slot]                  # [n][D], [n]
        dots = qf[i] @ kr.T                                      # [H][n]
        ref[i, :n] = (dots.clamp(min=0) * w64[i][:, None]).sum(0) * sr
        m[i, :n] = ((qf[i].abs() @ kr.abs().T) * w64[i].abs()[:, None]).sum(0) * sr.abs()
    return ref, m


# ---------------------------------------------------------------------------
# Inputs.
# ---------------------------------------------------------------------------
class Gen:
    def __init__(self, seed, dev):
        self.g = torch.Generator().manual_seed(seed)
        self.dev = dev

    def ints(self, lo, hi, shape, dtype=I32):
        return torch.randint(lo, hi, shape, generator=self.g).to(dtype).to(self.dev)

    def f32(self, shape, scale=1.0):
        return (torch.randn(shape, generator=self.g) * scale).to(self.dev)

    def fp8(self, shape):
        x = torch.randn(shape, generator=self.g) * 2
        return x.to(FP8).view(U8).to(self.dev)

    def scales(self, shape):
        return (torch.rand(shape, generator=self.g) + 0.25).to(self.dev)

    def t(self, vals, dtype=I32):
        return torch.tensor(vals, dtype=dtype, device=self.dev)


def ceil_to(n, m):
    return (n + m - 1) // m * m


# ---------------------------------------------------------------------------
# Every op on its own, at every class the keys cover.
# ---------------------------------------------------------------------------
class Case:
    def __init__(self, name, dep, gen, others):
        self.name, self.dep, self.gen = name, dep, gen
        s = dep.settings
        self.s = s
        self.topk, self.W, self.Rk = dep.topk, s["dcp_world"], s["dcp_rank"]
        self.I = s["dcp_interleave"] if self.W > 1 else 1
        self.H, self.D = s["index_n_heads"], s["index_head_dim"]
        self.bs, self.stride_rows = s["block_size"], s["block_stride_rows"]
        self.others = others      # {rank: Deployment} of the other ranks
        fams = {}
        for fam, fields, _ in dep.keys():
            fams.setdefault(fam, []).append(fields)
        self.keys = fams

    def geo(self, local):
        return (1, 0, 1) if local or self.W <= 1 else (self.W, self.Rk, self.I)

    # -- prefill_chunk_metadata ------------------------------------------
    def pcm_inputs(self, qlens, ctx, ratio, local):
        W, Rk, I = self.geo(local)
        seq = [q + c for q, c in zip(qlens, ctx)]
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
        cu = [0]
        for sl in seq:
            cu.append(cu[-1] + share(sl // ratio, W, Rk, I))
        return qsl, seq, cu

    def run_pcm(self, tag, qlens, ctx, s0, s1, ratio, local, misalign=False):
        g = self.gen
        qsl, seq, cu = self.pcm_inputs(qlens, ctx, ratio, local)
        qsl_t, cu_t = g.t(qsl), g.t(cu)
        if misalign:   # seq_lens off its 16-byte alignment: the other key
            seq_t = g.t([0] + seq)[1:]
        else:
            seq_t = g.t(seq)
        ks, ke, t2s = OPS.prefill_chunk_metadata(qsl_t, seq_t, cu_t, len(seq), s0, s1,
                                                 cu[-1], ratio, local)
        W, Rk, I = self.geo(local)
        rks, rke, rt = ref_prefill_chunk_metadata(qsl_t, seq_t, cu_t, s0, s1, cu[-1],
                                                  ratio, W, Rk, I)
        equal("prefill_chunk_metadata %s ks" % tag, ks, rks)
        equal("prefill_chunk_metadata %s ke" % tag, ke, rke)
        equal("prefill_chunk_metadata %s token_to_seq" % tag, t2s, rt)

    def ops_prefill_chunk_metadata(self):
        ratios = sorted({f["compress_ratio"] for f in self.keys.get(
            "prefill_chunk_metadata", [])})
        locals_ = sorted({f["dcp_world"] == 1 and self.W > 1 for f in self.keys.get(
            "prefill_chunk_metadata", [])})
        qlens, ctx = [5, 17, 1, 14], [100, 3000, 0, 9]    # 37 tokens
        for ratio in ratios:
            for local in locals_:
                # slice classes: start 0 (rep 16), 1, 2 by stop 37 (rep 2),
                # 32 (16) and 1 (1); a stop at or before the start is an
                # empty slice (only token_to_seq), which vLLM calls too.
                for s0, s1 in ((0, 37), (1, 37), (2, 37), (0, 32), (1, 32), (2, 32),
                               (0, 1), (1, 1), (2, 1)):
                    for mis in (False, True):
                        tag = "r%d s%d-%d%s%s" % (ratio, s0, s1, " local" if local else "",
                                                  " unaligned" if mis else "")
                        R.guard("prefill_chunk_metadata " + tag, self.run_pcm, tag,
                                qlens, ctx, s0, s1, ratio, local, mis)

    # -- compressed_slot_mapping ------------------------------------------
    def ops_compressed_slot_mapping(self):
        for f in self.keys.get("compressed_slot_mapping", []):
            ratio, local = f["compress_ratio"], f["dcp_world_size"] == 1 and self.W > 1
            tag = "r%d%s" % (ratio, " local" if local else "")
            R.guard("compressed_slot_mapping " + tag, self.run_csm, tag, ratio, local)

    def run_csm(self, tag, ratio, local):
        g = self.gen
        W, Rk, I = self.geo(local)
        bs = self.bs // ratio          # states per page on this rank
        qlens, ctx = [7, 300, 1, 64], [5, 1000, 0, 4000]
        seq = [q + c for q, c in zip(qlens, ctx)]
        qsl = [0]
        for q in qlens:
            qsl.append(qsl[-1] + q)
        T = qsl[-1]
        width = 16
        slot = g.ints(0, 1 << 20, (T,), I64)
        slot[g.ints(0, T, (T // 5,), I64)] = -1
        bt = g.ints(0, 1 << 12, (len(seq), width))
        qsl_t, seq_t = g.t(qsl), g.t(seq)
        out = OPS.compressed_slot_mapping(slot, qsl_t, seq_t, bt, T, len(seq), width,
                                          bs, ratio, local)
        equal("compressed_slot_mapping %s" % tag, out,
              ref_compressed_slot_mapping(slot, qsl_t, seq_t, bt, bs, ratio, W, Rk, I))

    # -- index_conversion --------------------------------------------------
    def ops_index_conversion(self):
        for f in self.keys.get("index_conversion", []):
            local = f["dcp_size"] == 1 and self.W > 1
            tag = "ws%d cv%d ctf%d dcp%d" % (f["has_prefill_workspace"], f["count_valid"],
                                             f["compact_to_front"], f["dcp_size"])
            R.guard("index_conversion " + tag, self.run_ic, tag,
                    f["has_prefill_workspace"], f["count_valid"],
                    f["compact_to_front"], local)

    def run_ic(self, tag, ws, cv, ctf, local):
        g = self.gen
        W, Rk, I = self.geo(local)
        rows, reqs, width = 37, 5, 48
        req_id = g.ints(0, reqs, (rows,))
        bt = g.ints(0, 1 << 14, (reqs, width))
        limit = width * self.bs * W + 300
        pos = g.ints(-1, limit, (rows, self.topk))
        preq = wss = None
        nprefill, wrs = 0, 0
        if ws:
            nprefill, wrs = 3, 70000
            preq = g.ints(-1, nprefill, (rows,))
            wss = g.ints(0, 5000, (nprefill,))
        out = torch.full((rows, self.topk), 7, dtype=I32, device=g.dev)
        valid = torch.full((rows,), 7, dtype=I32, device=g.dev) if cv else None
        OPS.index_conversion_out(req_id, bt, pos, preq, wss, rows, reqs, nprefill, width,
                                 wrs, out, valid, bool(ctf), local)
        rout, rvalid = ref_index_conversion(req_id, bt, pos, preq, wss, wrs, self.bs,
                                            self.stride_rows, W, Rk, I, bool(ctf))
        equal("index_conversion %s out" % tag, out, rout)
        if cv:
            equal("index_conversion %s valid_count" % tag, valid, rvalid)

    # -- dcp_pack_topk_candidates / dcp_stable_topk --------------------------
    def ops_dcp(self):
        if self.W <= 1:
            return
        g = self.gen
        for f in self.keys.get("dcp_pack_topk_candidates", []):
            if f["dcp_rank"] != self.Rk:
                continue
            rs = bool(f["has_row_starts"])
            tag = "row_starts" if rs else "plain"

            def run(rs=rs, tag=tag):
                rows, cols = 9, 3000
                logits = g.f32((rows, cols))
                p = g.ints(-1, cols, (rows, self.topk))
                starts = g.ints(0, 200, (rows,)) if rs else None
                packed = OPS.dcp_pack_topk_candidates(logits, p, starts, rows, cols)
                bit_equal("dcp_pack_topk_candidates %s" % tag, packed,
                          ref_pack(logits, p, starts, self.W, self.Rk, self.I))
            R.guard("dcp_pack_topk_candidates " + tag, run)

        def stable():
            rows, n = 7, self.topk * self.W
            scores = g.f32((rows, n))
            # ties, signed zeros, NaN and -inf, invalid and duplicate ids
            scores[:, ::7] = 0.5
            scores[:, 1::13] = -0.0
            scores[:, 2::13] = 0.0
            scores[:, 3::17] = float("nan")
            scores[:, 4::19] = float("-inf")
            ids = g.ints(-1, 1 << 20, (rows, n)).to(F32)
            ids[:, 5::23] = 12345.0        # one id in many candidates
            ids[:, 8::29] = 3.5
            ids[rows - 1, :] = -1           # a row with no valid candidate
            ids[rows - 2, self.topk // 2:] = -1   # fewer than topk
            gathered = torch.stack([scores, ids], -1).contiguous()
            out = OPS.dcp_stable_topk(gathered, rows)
            equal("dcp_stable_topk", out, ref_stable_topk(gathered, self.topk))
        R.guard("dcp_stable_topk", stable)

    # -- indexer_logits (prefill and paged) ----------------------------------
    def ops_logits(self):
        g = self.gen
        if not self.H:
            return

        def prefill():
            T, N = 45, 700
            q, w = g.fp8((T, self.H, self.D)), g.f32((T, self.H))
            k, ksc = g.fp8((N, self.D)), g.scales((N,))
            ks = g.ints(0, N // 2, (T,))
            ke = torch.minimum(ks + g.ints(0, N, (T,)), torch.tensor(N, device=g.dev)).to(I32)
            ke[0] = ks[0]          # an empty window
            stride = N + 5
            logits = OPS.indexer_logits(q, w, k, ksc, ks, ke, T, N, stride, self.H, self.D)
            ref, m = ref_logits(q, w, k, ksc, ks, ke)
            close_logits("indexer_logits prefill", logits[:, :N], ref, m)
        R.guard("indexer_logits prefill", prefill)
        for f in self.keys.get("indexer_logits", []):
            if not f["paged"]:
                continue
            pr, nn = f["page_rows"], f["next_n"]
            R.guard("indexer_logits paged page_rows %d" % pr, self.run_paged, pr, nn)

    def run_paged(self, pr, nn):
        g = self.gen
        B = 5
        Q = B * nn
        lens = [0, 1, 333, 1500, 2 * pr + 1]
        width = ceil_to(max(-(-n // pr) for n in lens) + 1, 16)
        pages = B * width
        kp, sp = g.fp8((pages, pr, self.D)), g.scales((pages, pr))
        perm = torch.randperm(pages, generator=g.g).to(I32).reshape(B, width).to(g.dev)
        row_end = g.t([lens[i // nn] - (nn - 1 - i % nn) if lens[i // nn] else 0
                       for i in range(Q)])
        row_end = row_end.clamp(min=0).to(I32)
        max_rows = ceil_to(max(lens) + 3, 8)
        q, w = g.fp8((Q, self.H, self.D)), g.f32((Q, self.H))
        logits = OPS.indexer_logits_paged(q, w, kp, sp, perm, row_end, B, width, max_rows,
                                          pr, nn, self.H, self.D)
        ref, m = ref_logits_paged(q, w, kp, sp, perm, row_end, nn, max_rows)
        close_logits("indexer_logits paged page_rows %d" % pr, logits, ref, m)

    # -- indexer_topk ----------------------------------------------------------
    def ops_topk(self):
        g = self.gen

        def run(windowed):
            rows, stride = 11, self.topk * 2 + 37
            logits = g.f32((rows, stride))
            logits[:, ::5] = 1.0          # ties
            logits[:, 1::11] = -0.0
            logits[:, 2::11] = 0.0
            logits[:, 3::31] = float("nan")
            logits[:, 4::7] = float("-inf")
            lens = [0, 1, self.topk - 1, self.topk, self.topk + 1, stride, 77,
                    self.topk * 2, 5, stride - 3, 1000]
            if windowed:
                ks = g.t([min(i * 3, stride - n) for i, n in enumerate(lens)])
                ke = (ks + g.t(lens)).to(I32)
                pos = OPS.indexer_topk(logits, ks, ke, rows, stride, None)
                ref = ref_topk(logits, ks.cpu(), ke.cpu(), None, self.topk)
            else:
                re = g.t(lens)
                pos = OPS.indexer_topk(logits, None, None, rows, stride, re)
                ref = ref_topk(logits, None, None, re.cpu(), self.topk)
            equal("indexer_topk %s" % ("windowed" if windowed else "row_end"), pos, ref)
        for windowed in (True, False):
            R.guard("indexer_topk windowed=%s" % windowed, run, windowed)


# ---------------------------------------------------------------------------
# Pipelines: eager, graphed, compiled.
# ---------------------------------------------------------------------------
def prefill_inputs(c):
    g = c.gen
    # A compressing ratio when the model has one (V4-Flash: 4), else 1.
    ratios = sorted({f["compress_ratio"] for f in c.keys["prefill_chunk_metadata"]})
    ratio = next((r for r in ratios if r > 1), ratios[0])
    qlens, ctx = [5, 17, 1, 14], [100, c.topk * 3 * ratio, 0, 9]
    qsl, seq, cu = c.pcm_inputs(qlens, ctx, ratio, False)
    B, T, N = len(seq), qsl[-1], cu[-1]
    width = 16
    inp = dict(
        qsl=g.t(qsl), seq=g.t(seq), cu_k=g.t(cu),
        q=g.fp8((T, c.H, c.D)), w=g.f32((T, c.H)),
        k=g.fp8((N, c.D)), k_scale=g.scales((N,)),
        block_table=g.ints(0, 1 << 14, (B, width)),
        req_id=g.t(sum(([b] * q for b, q in enumerate(qlens)), [])),
        prefill_req=g.t(sum(([b] * q for b, q in enumerate(qlens)), [])),
        ws_start=g.t([0, 6000, 20000, 20500]))
    dims = dict(B=B, T=T, N=N, stride=ceil_to(N, 8) + 8, ratio=ratio, width=width,
                wrs=70000)
    return inp, dims


def prefill_step(c, dims):
    B, T, N, stride = dims["B"], dims["T"], dims["N"], dims["stride"]

    def step(qsl, seq, cu_k, q, w, k, k_scale, block_table, req_id, prefill_req,
             ws_start):
        ks, ke, t2s = OPS.prefill_chunk_metadata(qsl, seq, cu_k, B, 0, T, N,
                                                 dims["ratio"], False)
        logits = OPS.indexer_logits(q, w, k, k_scale, ks, ke, T, N, stride, c.H, c.D)
        pos = OPS.indexer_topk(logits, ks, ke, T, stride, None)
        # Prefill rows through the workspace: the local rows of §4.3.
        out, valid = OPS.index_conversion(req_id, block_table, pos, prefill_req,
                                          ws_start, T, B, B, dims["width"],
                                          dims["wrs"], True, True, True)
        return ks, ke, t2s, logits[:, :N], pos, out, valid
    return step


def check_prefill(c, inp, dims, outs, tag):
    ks, ke, t2s, logits, pos, out, valid = outs
    W, Rk, I = c.geo(False)
    rks, rke, rt = ref_prefill_chunk_metadata(inp["qsl"], inp["seq"], inp["cu_k"], 0,
                                              dims["T"], dims["N"], dims["ratio"], W, Rk, I)
    equal(tag + " prefill_chunk_metadata ks", ks, rks)
    equal(tag + " prefill_chunk_metadata ke", ke, rke)
    equal(tag + " prefill_chunk_metadata token_to_seq", t2s, rt)
    ref, m = ref_logits(inp["q"], inp["w"], inp["k"], inp["k_scale"], ks, ke)
    close_logits(tag + " indexer_logits", logits, ref, m)
    # top-k of the logits the op produced (so rounding cannot reorder)
    equal(tag + " indexer_topk", pos, ref_topk(logits, ks.cpu(), ke.cpu(), None, c.topk))
    rout, rvalid = ref_index_conversion(inp["req_id"], inp["block_table"], pos,
                                        inp["prefill_req"], inp["ws_start"], dims["wrs"],
                                        c.bs, c.stride_rows, 1, 0, 1, True)
    equal(tag + " index_conversion", out, rout)
    equal(tag + " index_conversion valid_count", valid, rvalid)
    R.check(tag + " indexer_topk selects full rows",
            bool((pos[:, -1] >= 0).any()), "no row has topk candidates")


def decode_inputs(c, rank):
    g = c.gen
    pr = max(f["page_rows"] for f in c.keys["indexer_logits"] if f["paged"])
    nn = 1 + c.s["num_speculative_tokens"]
    B = 4
    W, I = max(c.W, 1), c.I
    glob = [3000, c.topk * 3 * W, 700, 5 + c.topk * W]
    lens = [share(n, W, rank, I) for n in glob]
    # Sizes from rank 0's shares (the largest), so every rank's call has
    # the same shapes and the packed candidates concatenate.
    most = [share(n, W, 0, I) for n in glob]
    width = ceil_to(max(-(-n // pr) for n in most) + 1, 16)
    pages = B * width
    Q = B * nn
    row_end = []
    for i in range(Q):
        row_end.append(max(lens[i // nn] - (nn - 1 - i % nn), 0))
    kv_width = ceil_to(max(-(-n // c.bs) for n in most) + 1, 16)
    inp = dict(
        q=g.fp8((Q, c.H, c.D)), w=g.f32((Q, c.H)),
        k_pages=g.fp8((pages, pr, c.D)), k_scale_pages=g.scales((pages, pr)),
        page_table=torch.randperm(pages, generator=g.g).to(I32).reshape(B, width).to(g.dev),
        row_end=g.t(row_end),
        req_id=g.t([i // nn for i in range(Q)]),
        kv_table=g.ints(0, 1 << 14, (B, kv_width)))
    dims = dict(B=B, Q=Q, nn=nn, pr=pr, width=width, kv_width=kv_width,
                max_rows=ceil_to(max(most) + 1, 8))
    return inp, dims


def decode_local(c, dims):
    """This rank's half: paged logits, its top-k and (DCP) its packed
    candidates."""
    def local(q, w, k_pages, k_scale_pages, page_table, row_end):
        logits = OPS.indexer_logits_paged(q, w, k_pages, k_scale_pages, page_table, row_end,
                                          dims["B"], dims["width"], dims["max_rows"],
                                          dims["pr"], dims["nn"], c.H, c.D)
        pos = OPS.indexer_topk(logits, None, None, dims["Q"], dims["max_rows"], row_end)
        if c.W <= 1:
            return logits, pos, None
        packed = OPS.dcp_pack_topk_candidates(logits, pos, None, dims["Q"], dims["max_rows"])
        return logits, pos, packed
    return local


def decode_step(c, dims):
    local = decode_local(c, dims)

    def step(q, w, k_pages, k_scale_pages, page_table, row_end, req_id, kv_table,
             others):
        logits, pos, packed = local(q, w, k_pages, k_scale_pages, page_table, row_end)
        if c.W > 1:
            parts = list(others)
            parts.insert(c.Rk, packed)
            gathered = torch.cat(parts, dim=1)   # the all-gather, in rank order
            best = OPS.dcp_stable_topk(gathered, dims["Q"])
        else:
            gathered, best = None, pos
        out, valid = OPS.index_conversion(req_id, kv_table, best, None, None, dims["Q"],
                                          dims["B"], 0, dims["kv_width"], 0, True, True,
                                          False)
        res = [logits, pos, best, out, valid]
        if c.W > 1:
            res += [packed, gathered]
        return tuple(res)
    return step


def other_ranks_packed(c, dims):
    """Every other rank's packed candidates, built the same way: through
    that rank's deployment when loaded (c.others), else the reference."""
    parts = []
    for rank in range(c.W):
        if rank == c.Rk:
            continue
        inp, d = decode_inputs(c, rank)
        assert d == dims, (d, dims)
        if rank in c.others:
            with c.others[rank].use():
                logits, pos, packed = decode_local(c, dims)(
                    inp["q"], inp["w"], inp["k_pages"], inp["k_scale_pages"],
                    inp["page_table"], inp["row_end"])
            R.guard("rank %d packed vs reference" % rank, lambda: bit_equal(
                "decode rank %d dcp_pack_topk_candidates" % rank, packed,
                ref_pack(logits, pos, None, c.W, rank, c.I)))
        else:
            ref, _ = ref_logits_paged(inp["q"], inp["w"], inp["k_pages"],
                                      inp["k_scale_pages"], inp["page_table"],
                                      inp["row_end"], dims["nn"], dims["max_rows"])
            lf = ref.to(F32)
            pos = ref_topk(lf, None, None, inp["row_end"].cpu(), c.topk)
            packed = ref_pack(lf, pos, None, c.W, rank, c.I).to(c.gen.dev)
        parts.append(packed.contiguous())
    return parts


def check_decode(c, inp, dims, outs, tag):
    logits, pos, best, out, valid = outs[:5]
    ref, m = ref_logits_paged(inp["q"], inp["w"], inp["k_pages"], inp["k_scale_pages"],
                              inp["page_table"], inp["row_end"], dims["nn"],
                              dims["max_rows"])
    close_logits(tag + " indexer_logits_paged", logits, ref, m)
    equal(tag + " indexer_topk", pos, ref_topk(logits, None, None, inp["row_end"].cpu(),
                                               c.topk))
    W, Rk, I = c.geo(False)
    if c.W > 1:
        packed, gathered = outs[5], outs[6]
        bit_equal(tag + " dcp_pack_topk_candidates", packed,
                  ref_pack(logits, pos, None, W, Rk, I))
        equal(tag + " dcp_stable_topk", best, ref_stable_topk(gathered, c.topk))
    rout, rvalid = ref_index_conversion(inp["req_id"], inp["kv_table"], best, None, None,
                                        0, c.bs, c.stride_rows, W, Rk, I, True)
    equal(tag + " index_conversion", out, rout)
    equal(tag + " index_conversion valid_count", valid, rvalid)


def eager_graph_compile(c, name, step, args, check):
    """Eager (checked against the references), then a CUDA graph replay and
    torch.compile(fullgraph=True), each equal to eager bit for bit."""
    eager = step(*args)
    torch.cuda.synchronize()
    check(eager, "%s eager" % name)

    def graphed():
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step(*args)                    # warm-up on a side stream
        torch.cuda.current_stream().wait_stream(s)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            static = step(*args)
        for o in static:
            o.zero_() if o.dtype != F32 else o.fill_(float("nan"))
        graph.replay()
        graph.replay()
        torch.cuda.synchronize()
        for i, (a, b) in enumerate(zip(eager, static)):
            bit_equal("%s graph replay output %d" % (name, i), b, a)
        launches = c.dep.stats()["launches"]
        graph.replay()
        torch.cuda.synchronize()
        R.check("%s graph replay calls no op" % name,
                c.dep.stats()["launches"] == launches)
    R.guard("%s graph" % name, graphed)

    def compiled():
        torch._dynamo.reset()
        fn = torch.compile(step, fullgraph=True)
        got = fn(*args)
        torch.cuda.synchronize()
        for i, (a, b) in enumerate(zip(eager, got)):
            bit_equal("%s torch.compile output %d" % (name, i), b, a)
    R.guard("%s torch.compile" % name, compiled)


def pipelines(c):
    inp, dims = prefill_inputs(c)
    order = ["qsl", "seq", "cu_k", "q", "w", "k", "k_scale", "block_table", "req_id",
             "prefill_req", "ws_start"]
    eager_graph_compile(c, "prefill pipeline", prefill_step(c, dims),
                        [inp[k] for k in order],
                        lambda outs, tag: check_prefill(c, inp, dims, outs, tag))

    inp, dims = decode_inputs(c, c.Rk)
    others = tuple(other_ranks_packed(c, dims)) if c.W > 1 else ()
    order = ["q", "w", "k_pages", "k_scale_pages", "page_table", "row_end", "req_id",
             "kv_table"]
    eager_graph_compile(c, "decode pipeline%s" % (" (DCP %d)" % c.W if c.W > 1 else ""),
                        decode_step(c, dims), [inp[k] for k in order] + [others],
                        lambda outs, tag: check_decode(c, inp, dims, outs, tag))


# ---------------------------------------------------------------------------
# Misses.
# ---------------------------------------------------------------------------
def misses(args, config, deploy, dev):
    daemon = Kwarmd(args.kwarmd, jobs=args.jobs)
    try:
        dep = kt.load(config, dict(deploy, max_num_batched_tokens=1), socket=daemon.sock,
                      timeout_ms=-1, activate=False)
        with dep.use():
            g = Gen(7, dev)
            found = None
            for stop in (32, 16, 48, 17, 3):
                a = [g.t([0, stop]), g.t([stop + 100]), g.t([0, 60]), 1, 0, stop, 60,
                     torch.zeros(stop, dtype=I32, device=dev),
                     torch.zeros(stop, dtype=I32, device=dev),
                     torch.zeros(60, dtype=I32, device=dev), 1, False]
                try:
                    fields, loaded = dep.dispatch("prefill_chunk_metadata", *a)
                except ValueError:
                    continue
                if not loaded:
                    found = a, fields
                    break
            if not R.check("miss: an unwarmed prefill_chunk_metadata class exists",
                           found is not None):
                return
            a, fields = found
            before, keys = dep.stats(), dep.keys()
            graph = torch.cuda.CUDAGraph()
            raised = None
            try:
                with torch.cuda.graph(graph):
                    OPS.prefill_chunk_metadata_out(*a)
            except RuntimeError as e:
                raised = e
            R.check("miss: during capture raises RuntimeError", raised is not None)
            R.check("miss: the error names the key and its setting",
                    raised is not None and "prefill_chunk_metadata" in str(raised)
                    and "max_num_batched_tokens" in str(raised), raised)
            torch.cuda.synchronize()
            after = dep.stats()
            R.check("miss: capture leaves the loaded set unchanged",
                    after["loaded"] == before["loaded"] and dep.keys() == keys,
                    (before, after))
            R.check("miss: counted as a capture miss",
                    after["capture_misses"] == before["capture_misses"] + 1, after)
            OPS.prefill_chunk_metadata_out(*a)
            torch.cuda.synchronize()
            after = dep.stats()
            R.check("miss: outside capture it is served",
                    after["runtime_misses"] == before["runtime_misses"] + 1
                    and after["loaded"] == before["loaded"] + 1, after)
            R.check("miss: now loaded", dep.dispatch("prefill_chunk_metadata", *a)[1])
            with kwarm_client.Client(daemon.sock, timeout=60) as cl:
                audit = cl.misses()["misses"]
            mine = [m for m in audit if m.get("pid") == os.getpid()]
            R.check("miss: kwarmd's miss audit shows it with this pid",
                    any("prefill_chunk_metadata" in json.dumps(m) for m in mine),
                    json.dumps(audit)[:2000])
            # Still usable: the graph of a warmed call captures fine now.
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                OPS.prefill_chunk_metadata_out(*a)
            graph.replay()
            torch.cuda.synchronize()
            R.check("miss: the served key captures afterwards", True)
        dep.close()
    finally:
        daemon.stop()


def readme_example(sock):
    """README's "Serving with PyTorch" example, run as written (a fresh
    process against this kwarmd): both of its checks print True."""
    import subprocess
    with open(os.path.join(ROOT, "README.md")) as f:
        text = f.read()
    start = text.index("# serve_torch.py")
    code = text[start:text.index("```", start)]
    env = dict(os.environ, KWARM_SOCKET=sock)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    p = subprocess.run([sys.executable, "-c", code, os.path.join(ROOT, "tests", "fixtures",
                                                                 "deepseek-v3.2-exp.json")],
                       capture_output=True, text=True, env=env, timeout=600)
    R.check("README example runs", p.returncode == 0, p.stderr[-2000:])
    R.check("README example: top-k matches torch.sort, graph replay equals eager",
            p.stdout.count(": True") == 2, p.stdout[-2000:])


# ---------------------------------------------------------------------------
class Existing:
    """A kwarmd this script did not start (--socket)."""

    def __init__(self, sock):
        self.sock = sock

    def stop(self):
        return 0


def run_case(args, name, dev, summary):
    fixture, deploy = CASES[name]
    config = os.path.join(ROOT, "tests", "fixtures", fixture)
    R.prefix = "[%s] " % name
    daemon = Existing(args.socket) if args.socket else Kwarmd(args.kwarmd, jobs=args.jobs)
    try:
        t0 = time.perf_counter()
        dep = kt.load(config, deploy or None, socket=daemon.sock, timeout_ms=-1)
        load_s = time.perf_counter() - t0
        others = {}
        W = dep.settings["dcp_world"]
        if 1 < W <= 2:
            for rank in range(W):
                if rank != dep.dcp_rank:
                    others[rank] = kt.load(config, dict(deploy, dcp_rank=rank),
                                           socket=daemon.sock, timeout_ms=-1,
                                           activate=False)
        c = Case(name, dep, Gen(args.seed, dev), others)
        info = {"load_s": round(load_s, 3), "stats": dep.stats(), "settings": dep.settings,
                "keys": len(dep.keys())}
        print("[%s] loaded %d keys in %.2f s (kw_ops load_ms %.1f): %r"
              % (name, info["keys"], load_s, info["stats"]["load_ms"], dep), flush=True)
        for part in (c.ops_prefill_chunk_metadata, c.ops_compressed_slot_mapping,
                     c.ops_index_conversion, c.ops_dcp, c.ops_logits, c.ops_topk):
            R.guard(part.__name__, part)
        R.guard("pipelines", pipelines, c)
        st = dep.stats()
        R.check("no runtime miss: every class the calls reached was warmed",
                st["runtime_misses"] == 0 and st["capture_misses"] == 0, st)
        info["stats_after"] = st
        summary[name] = info
        for o in others.values():
            o.close()
        if name == args.cases[0]:
            R.guard("misses", misses, args, config, deploy, dev)
        if name == "v32":
            R.guard("README example", readme_example, daemon.sock)
        dep.close()
    finally:
        daemon.stop()
        R.prefix = ""


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kwarmd", default=os.environ.get("KWARMD",
                                                       os.path.join(ROOT, "build", "kwarmd")))
    ap.add_argument("--socket", default=None,
                    help="use this kwarmd for the cases (the miss check still "
                         "starts its own from --kwarmd)")
    ap.add_argument("--out", default=None, help="directory for gpu_ops.json")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--seed", type=int, default=2026)
    ap.add_argument("--case", dest="cases", action="append", choices=sorted(CASES))
    args = ap.parse_args()
    args.cases = args.cases or ["v32", "v4"]
    if not torch.cuda.is_available():
        print("gpu_ops.py: torch sees no CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    summary = {"torch": torch.__version__, "device": torch.cuda.get_device_name(dev),
               "libkwarm": kt.LIB.path}
    for name in args.cases:
        R.guard("case " + name, run_case, args, name, dev, summary)
    failed = R.failed()
    summary["checks"] = len(R.checks)
    summary["failed"] = failed
    text = json.dumps(summary, indent=1, default=str)
    print(text)
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "gpu_ops.json"), "w") as f:
            f.write(text)
    print("%d checks, %d failed" % (len(R.checks), len(failed)))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
