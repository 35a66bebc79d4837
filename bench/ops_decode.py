#!/usr/bin/env python3
"""The DSA decode step with DCP through kwarm.torch, eager and graphed,
against the same step in torch (issue 22 point 5, third bullet).

usage: ops_decode.py [--kwarmd build/kwarmd] [--json FILE] [--iters 20]
                     [--requests 128] [--context 65536] [--stand-in]

DeepSeek-V3.2 at DCP 2, rank 1 (64 heads of 128, top-k 2048, pages of 64
rows, next_n 1): `requests` requests of `context` tokens, so this rank
holds context/2 compressed K rows of each.  One step is

  indexer_logits_paged -> indexer_topk -> dcp_pack_topk_candidates ->
  (all-gather: this rank's candidates copied into its half of a gathered
  buffer whose other half holds rank 0's, made once) -> dcp_stable_topk ->
  index_conversion (counted and compacted, in the DCP geometry)

with the `_out` forms into buffers made once.  The torch step does the
same with torch: K rows gathered through the block table, bf16 matmul,
relu, weighted head sum, scale, -inf past row_end; torch.topk; the pack by
gather/where; a stable sort of the gathered scores; the conversion by
integer arithmetic, a gather from the block table and a stable sort for
the compaction.  Both run eager and as a CUDA graph replay.  Times are
CUDA events, the median of --iters steps after warm-up.  The torch step's
top-k positions are compared with kwarm's (they agree on distinct scores;
ties may differ, torch.topk gives no order among them).

--stand-in runs both steps once at a small size on the CPU (no timing):
a dry run of this script's calls.
"""
import argparse
import json
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, os.path.join(ROOT, "tests", "python"))
try:
    import kwarm  # noqa: F401
except ImportError:
    sys.path.insert(0, os.path.join(ROOT, "client", "python"))

import torch  # noqa: E402

V32 = os.path.join(ROOT, "tests", "fixtures", "deepseek-v3.2-exp.json")
I32, F32 = torch.int32, torch.float32


def timed(fn, iters, sync):
    for _ in range(2):
        fn()
    sync()
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


def graphed(fn):
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


class Step:
    def __init__(self, dep, B, context, dev, seed=5):
        s = dep.settings
        self.H, self.D, self.topk = s["index_n_heads"], s["index_head_dim"], dep.topk
        self.W, self.R, self.I = s["dcp_world"], s["dcp_rank"], s["dcp_interleave"]
        self.bs, self.stride_rows = s["block_size"], s["block_stride_rows"]
        pr = [f["page_rows"] for fam, f, _ in dep.keys()
              if fam == "indexer_logits" and f["paged"]][0]
        self.pr, self.B, self.Q = pr, B, B
        rows = context // self.W                 # this rank's share (I = 1)
        self.rows = rows
        self.width = -(-rows // pr)
        self.width += -self.width % 16
        self.max_rows = rows
        g = torch.Generator().manual_seed(seed)
        pages = B * self.width
        H, D = self.H, self.D
        fp8 = lambda shape: (torch.randn(shape, generator=g) * 2).to(
            torch.float8_e4m3fn).view(torch.uint8).to(dev)
        self.q, self.w = fp8((B, H, D)), (torch.randn(B, H, generator=g) / H).to(dev)
        self.kp = fp8((pages, pr, D))
        self.ksp = (torch.rand(pages, pr, generator=g) + 0.5).to(dev)
        self.bt = torch.randperm(pages, generator=g).to(I32).view(B, self.width).to(dev)
        self.row_end = torch.full((B,), rows, dtype=I32, device=dev)
        self.req_id = torch.arange(B, dtype=I32, device=dev)
        self.kv_width = -(-rows // self.bs) + 1
        self.kv_width += -self.kv_width % 16
        self.kv_bt = torch.randint(0, 1 << 20, (B, self.kv_width), generator=g).to(I32).to(dev)
        # outputs, made once
        self.logits = torch.empty(B, self.max_rows, dtype=F32, device=dev)
        self.pos = torch.empty(B, self.topk, dtype=I32, device=dev)
        self.gathered = torch.empty(B, self.topk * self.W, 2, dtype=F32, device=dev)
        self.best = torch.empty(B, self.topk, dtype=I32, device=dev)
        self.out = torch.empty(B, self.topk, dtype=I32, device=dev)
        self.valid = torch.empty(B, dtype=I32, device=dev)
        self.packed = torch.empty(B, self.topk, 2, dtype=F32, device=dev)

    def fill_other_rank(self, packed):
        """Rank 0's half of the gathered buffer: this rank's candidates with
        rank 0's global ids (id - I for I = 1), made once."""
        other = packed.clone()
        ids = other[..., 1]
        other[..., 1] = torch.where(ids >= 0, ids - self.I, ids)
        lo = 0 if self.R != 0 else self.topk
        self.gathered[:, lo:lo + self.topk].copy_(other)

    def kwarm_step(self):
        k = torch.ops.kwarm
        k.indexer_logits_paged_out(self.q, self.w, self.kp, self.ksp, self.bt, self.row_end,
                                   self.B, self.width, self.max_rows, self.logits, self.pr, 1,
                                   self.H, self.D)
        k.indexer_topk_out(self.logits, None, None, self.Q, self.max_rows, self.pos,
                           self.row_end)
        mine = self.gathered[:, self.R * self.topk:(self.R + 1) * self.topk]
        k.dcp_pack_topk_candidates_out(self.logits, self.pos, None, self.Q, self.max_rows,
                                       self.packed)
        mine.copy_(self.packed)                  # the all-gather's local part
        k.dcp_stable_topk_out(self.gathered, self.Q, self.best)
        k.index_conversion_out(self.req_id, self.kv_bt, self.best, None, None, self.Q,
                               self.B, 0, self.kv_width, 0, self.out, self.valid, True, False)

    def torch_step(self):
        B, D, rows = self.B, self.D, self.rows
        page = self.bt.long()                                        # [B, width]
        kr = self.kp[page].view(torch.float8_e4m3fn).reshape(B, -1, D)[:, :rows]
        sr = self.ksp[page].reshape(B, -1)[:, :rows]
        q = self.q.view(torch.float8_e4m3fn).to(torch.bfloat16)
        s = torch.einsum("bhd,bnd->bhn", q, kr.to(torch.bfloat16)).float().relu_()
        logits = torch.einsum("bhn,bh->bn", s, self.w) * sr
        idx = torch.arange(rows, device=logits.device)
        logits = logits.masked_fill(idx[None, :] >= self.row_end[:, None], float("-inf"))
        pos = torch.topk(logits, self.topk, dim=1, sorted=True).indices          # int64
        score = torch.gather(logits, 1, pos)
        gid = (pos // self.I) * (self.W * self.I) + self.R * self.I + pos % self.I
        packed = torch.stack([score, gid.to(F32)], -1)
        gathered = self.gathered.clone()
        gathered[:, self.R * self.topk:(self.R + 1) * self.topk] = packed
        order = torch.sort(gathered[..., 0], dim=1, descending=True, stable=True).indices
        best = torch.gather(gathered[..., 1], 1, order[:, :self.topk]).long()
        W, I, R = self.W, self.I, self.R
        owner = (best // I) % W
        local = (best // (W * I)) * I + best % I
        blk, off = local // self.bs, local % self.bs
        ok = (best >= 0) & (owner == R) & (blk < self.kv_width)
        rowsel = torch.gather(self.kv_bt.long(), 1, blk.clamp(0, self.kv_width - 1))
        out = torch.where(ok, rowsel * self.stride_rows + off, -1)
        keys = (~ok).to(torch.int8)
        order = torch.sort(keys, dim=1, stable=True).indices
        out = torch.gather(out, 1, order).to(I32)
        valid = ok.sum(1).to(I32)
        return pos, out, valid


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kwarmd", default=os.environ.get("KWARMD",
                                                       os.path.join(ROOT, "build", "kwarmd")))
    ap.add_argument("--json")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--requests", type=int, default=128)
    ap.add_argument("--context", type=int, default=65536)
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--stand-in", action="store_true")
    a = ap.parse_args()
    import kwarm.torch as kt
    from test_client import Kwarmd
    daemon = Kwarmd(a.kwarmd, jobs=a.jobs)
    res = {"requests": a.requests, "context": a.context, "torch": torch.__version__}
    try:
        kw = dict(socket=daemon.sock, timeout_ms=-1)
        if a.stand_in:
            kw["stand_in"] = lambda *x: None
            a.requests, a.context = min(a.requests, 4), min(a.context, 8192)
        dep = kt.load(V32, {"dcp_world": 2, "dcp_rank": 1}, **kw)
        dev = "cpu" if a.stand_in else "cuda"
        st = Step(dep, a.requests, a.context, dev)
        st.kwarm_step()
        st.fill_other_rank(st.packed)
        st.kwarm_step()
        tpos, tout, tvalid = st.torch_step()
        if a.stand_in:
            print("dry run: both steps ran; kwarm launches %d" % dep.stats()["launches"])
            return 0
        sync = torch.cuda.synchronize
        sync()
        res["topk_positions_agree"] = float((tpos.to(I32) == st.pos).float().mean())
        res["kwarm_eager_ms"] = timed(st.kwarm_step, a.iters, sync)
        res["kwarm_graph_ms"] = timed(graphed(st.kwarm_step), a.iters, sync)
        res["torch_eager_ms"] = timed(st.torch_step, a.iters, sync)
        try:
            res["torch_graph_ms"] = timed(graphed(st.torch_step), a.iters, sync)
        except Exception as e:       # a torch path that does not capture
            res["torch_graph_error"] = str(e)
        res["kw_ops_stats"] = dep.stats()
        dep.close()
    finally:
        daemon.stop()
    print("decode step, %d requests x %d context (rank 1 of DCP 2): kwarm %.3f ms eager, "
          "%.3f ms graphed; torch %.3f ms eager, %s graphed; top-k positions agree %.4f"
          % (a.requests, a.context, res["kwarm_eager_ms"], res["kwarm_graph_ms"],
             res["torch_eager_ms"], ("%.3f ms" % res["torch_graph_ms"])
             if "torch_graph_ms" in res else "-", res["topk_positions_agree"]))
    text = json.dumps(res, indent=1)
    print(text)
    if a.json:
        with open(a.json, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
