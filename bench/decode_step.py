#!/usr/bin/env python3
"""The DSA indexer's decode step under DCP, through kwarm.torch and in torch.

usage: decode_step.py --socket PATH [--model CONFIG] [--reqs B] [--context N]
                      [--iters I] [--rounds R] [--json F]

One decode step of a DeepSeek-V3.2 deployment at dcp_world 2, rank 0
(docs/serving.md): paged indexer_logits over this rank's half of every
request's context, indexer_topk by row end, dcp_pack_topk_candidates, the
gather (here a torch.cat of this rank's candidates with a second rank's,
standing in for the all-gather), dcp_stable_topk, and index_conversion of
the global top-k to this rank's KV rows.  Timed four ways, each the median
over rounds of I steps in its own sustained state (the H200 caps its
power, docs/perf.md): kwarm eager, kwarm replayed from one CUDA graph, the
same step written in torch (gather the pages, bf16 matmul, torch.topk,
torch index arithmetic) eager, and that torch step replayed from a graph.
Checks: kwarm's graph replay equals its eager step bit for bit, and the
torch step's logits agree with kwarm's within the spec's tolerance.

Needs a GPU, torch and a kwarmd (kwarm.torch.load compiles what it lacks).
"""
import argparse
import json
import os
import statistics
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "client", "python"))


def step_inputs(torch, dep, B, ctx, seed):
    """Device tensors of one decode step on rank 0 of W (ctx tokens a
    request, ctx / W on this rank)."""
    W, topk = dep.dcp_world, dep.topk
    H = dep.settings["index_n_heads"]
    D = dep.settings["index_head_dim"]
    PR = dep.settings["block_size"]
    rows = ctx // W
    width = (rows + PR - 1) // PR
    g = torch.Generator(device="cuda").manual_seed(seed)
    pages = B * width

    def fp8(shape):
        return (torch.randn(shape, generator=g, device="cuda") * 0.5).to(
            torch.float8_e4m3fn)

    t = {
        "q": fp8((B, H, D)),
        "w": torch.randn(B, H, generator=g, device="cuda") / H,
        "k_pages": fp8((pages, PR, D)),
        "k_scale_pages": torch.rand(pages, PR, generator=g, device="cuda") + 0.5,
        "block_table": torch.randperm(pages, generator=g, device="cuda")
        .to(torch.int32).view(B, width),
        "row_end": torch.full((B,), rows, dtype=torch.int32, device="cuda"),
        "req_id": torch.arange(B, dtype=torch.int32, device="cuda"),
    }
    # index_conversion reads vLLM's block table (its width for W ranks).
    icw = dep.table_width()
    t["ic_table"] = torch.randint(0, 1 << 20, (B, icw), generator=g,
                                  device="cuda", dtype=torch.int32)
    # The other rank's candidates: scores and global ids of its own.
    other = torch.rand(B, topk, generator=g, device="cuda")
    ids = torch.randint(0, ctx, (B, topk), generator=g, device="cuda")
    t["other"] = torch.stack([other, ids.float()], dim=2).contiguous()
    t.update(B=B, rows=rows, width=width, W=W, topk=topk, H=H, D=D, PR=PR)
    return t


def kwarm_step(torch, t, out):
    """The step through torch.ops.kwarm, into preallocated outputs."""
    k = torch.ops.kwarm
    B, rows, topk = t["B"], t["rows"], t["topk"]
    k.indexer_logits_paged_out(t["q"], t["w"], t["k_pages"], t["k_scale_pages"],
                               t["block_table"], t["row_end"], B, t["width"],
                               rows, out["logits"], t["PR"], 1, t["H"], t["D"])
    k.indexer_topk_out(out["logits"], None, None, B, rows, out["local"],
                       t["row_end"])
    k.dcp_pack_topk_candidates_out(out["logits"], out["local"], None, B, rows,
                                   out["packed"])
    torch.cat([out["packed"], t["other"]], dim=1, out=out["gathered"])
    k.dcp_stable_topk_out(out["gathered"], B, out["global"])
    k.index_conversion_out(t["req_id"], t["ic_table"], out["global"], None, None,
                           B, B, 0, t["ic_table"].shape[1], 0, out["kv"],
                           out["count"], True, False)


def torch_step(torch, t, s):
    """The same step in torch: gather this rank's pages, bf16 scores,
    torch.topk, the packing, the global top-k, the conversion."""
    B, rows, topk, W, PR = t["B"], t["rows"], t["topk"], t["W"], t["PR"]
    kv = t["k_pages"][t["block_table"].long()].view(B, -1, t["D"])[:, :rows]
    sc = t["k_scale_pages"][t["block_table"].long()].view(B, -1)[:, :rows]
    qk = torch.bmm(t["q"].to(torch.bfloat16), kv.to(torch.bfloat16).transpose(1, 2))
    logits = (qk.float().relu() * t["w"][:, :, None]).sum(1) * sc
    s["logits"].copy_(logits)
    _, local = torch.topk(logits, topk, dim=1)
    gid = local * W  # rank 0, interleave 1: global(l) = l * W
    packed = torch.stack([logits.gather(1, local), gid.float()], dim=2)
    gathered = torch.cat([packed, t["other"]], dim=1)
    best = torch.topk(gathered[:, :, 0], topk, dim=1).indices
    glob = gathered[:, :, 1].gather(1, best).long()
    own = (glob % W) == 0
    loc = glob // W
    blk, off = loc // t["PR"], loc % PR
    icw = t["ic_table"].shape[1]
    rowv = t["ic_table"].gather(1, blk.clamp(max=icw - 1))
    res = torch.where(own & (blk < icw), rowv.long() * PR + off, -1)
    s["kv"].copy_(res.to(torch.int32))
    s["count"].copy_((res >= 0).sum(1).to(torch.int32))


def timed(torch, fn, iters, rounds):
    """Median and spread of the per-step milliseconds over rounds, each
    after half a second of fn (its own sustained state)."""
    import time
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < 0.5:
        fn()
        torch.cuda.synchronize()
    per = []
    for _ in range(rounds):
        a = torch.cuda.Event(enable_timing=True)
        b = torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) / iters)
    return statistics.median(per), min(per), max(per)


def graphed(torch, fn):
    """fn captured once (after a warm-up on a side stream); returns replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    torch.cuda.synchronize()
    return g.replay


def outputs(torch, t):
    B, rows, topk, W = t["B"], t["rows"], t["topk"], t["W"]
    dev = "cuda"
    return {
        "logits": torch.empty(B, rows, device=dev),
        "local": torch.empty(B, topk, dtype=torch.int32, device=dev),
        "packed": torch.empty(B, topk, 2, device=dev),
        "gathered": torch.empty(B, topk * W, 2, device=dev),
        "global": torch.empty(B, topk, dtype=torch.int32, device=dev),
        "kv": torch.empty(B, topk, dtype=torch.int32, device=dev),
        "count": torch.empty(B, dtype=torch.int32, device=dev),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("--socket", help="kwarmd's socket (default $KWARM_SOCKET)")
    ap.add_argument("--model", default=os.path.join(
        here, "..", "tests", "fixtures", "deepseek-v3.2-exp.json"))
    ap.add_argument("--reqs", type=int, default=128)
    ap.add_argument("--context", type=int, default=65536)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--json")
    a = ap.parse_args()
    import torch
    import kwarm.torch as kt
    dep = kt.load(a.model, {"dcp_world": 2, "dcp_rank": 0}, socket=a.socket)
    t = step_inputs(torch, dep, a.reqs, a.context, 7)
    ko, to = outputs(torch, t), outputs(torch, t)
    res = {"reqs": a.reqs, "context": a.context, "dcp_world": 2}
    kwarm_step(torch, t, ko)
    torch.cuda.synchronize()
    eager = {n: v.clone() for n, v in ko.items()}
    replay = graphed(torch, lambda: kwarm_step(torch, t, ko))
    replay()
    torch.cuda.synchronize()
    res["kwarm_graph_bit_equal"] = all(torch.equal(eager[n], ko[n]) for n in ko)
    torch_step(torch, t, to)
    torch.cuda.synchronize()
    diff = (to["logits"] - eager["logits"]).abs().max().item()
    scale = eager["logits"].abs().max().item()
    res["torch_logits_max_rel_diff"] = diff / scale if scale else diff
    for name, fn in (("kwarm_eager", lambda: kwarm_step(torch, t, ko)),
                     ("kwarm_graph", replay),
                     ("torch_eager", lambda: torch_step(torch, t, to)),
                     ("torch_graph", graphed(torch, lambda: torch_step(torch, t, to)))):
        med, lo, hi = timed(torch, fn, a.iters, a.rounds)
        res[name + "_ms"] = med
        res[name + "_spread_ms"] = [lo, hi]
    res["torch_eager_over_kwarm_graph"] = res["torch_eager_ms"] / res["kwarm_graph_ms"]
    res["torch_graph_over_kwarm_graph"] = res["torch_graph_ms"] / res["kwarm_graph_ms"]
    print("decode step, V3.2 at DCP 2 (rank 0), %d requests x %d context"
          % (a.reqs, a.context))
    print("%-13s %10s  %s" % ("", "ms/step", "spread"))
    for n in ("kwarm_eager", "kwarm_graph", "torch_eager", "torch_graph"):
        lo, hi = res[n + "_spread_ms"]
        print("%-13s %10.3f  %.3f..%.3f" % (n, res[n + "_ms"], lo, hi))
    print("kwarm graph replay bit-equal to eager: %s; torch logits within %.2e "
          "(relative) of kwarm's" % (res["kwarm_graph_bit_equal"],
                                     res["torch_logits_max_rel_diff"]))
    print(json.dumps(res))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(res, f)
    return 0 if res["kwarm_graph_bit_equal"] else 1


if __name__ == "__main__":
    sys.exit(main())
