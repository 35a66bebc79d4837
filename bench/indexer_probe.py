#!/usr/bin/env python3
"""Where the time goes: the indexer kernels with parts cut out.

usage (on the GPU machine, from the repository root):
    python3 bench/indexer_probe.py OUT.json [--logits-only [--no-tree]]
        [--no-cuts] [--all-cuts] [TAG=KERNELS_DIR ...]
    python3 bench/indexer_probe.py OUT.json --portable
    python3 bench/indexer_probe.py OUT.json --topk-only

TAG=KERNELS_DIR adds the prefill logits of another kernels/ tree (e.g. a
checkout of an older commit's kernels/), timed in the same process,
alternately with the working tree's (cuts only for the working tree's
unless --all-cuts; --no-cuts: none, three rounds; --no-tree: only the
TAG=KERNELS_DIR trees, the first timed first).  --portable checks the
working tree's prefill key built for compute_80 (the mma.sync path, run
on the GPU through the driver's PTX JIT) against its sm_90a build.

Each variant is kernels/indexer_*.cu with one step removed by a text
replacement (asserted to apply), compiled with cupy's NVRTC, and timed on
the data of bench/indexer_bench.py; the outputs of a cut variant are
garbage, only its time means something.  The differences to the base say
what each step costs (docs/perf.md, "indexer_logits and indexer_topk")."""
import re, statistics, sys, json
import cupy, torch

SRC = "kernels/"
OPTS = ("-std=c++17", "-I/usr/local/cuda/include", "-I/usr/local/cuda/include/cccl")


def timed(fn, iters=5):
    for _ in range(2):
        fn()
    torch.cuda.synchronize()
    ms = []
    for _ in range(iters):
        a = torch.cuda.Event(enable_timing=True); b = torch.cuda.Event(enable_timing=True)
        a.record(); fn(); b.record(); b.synchronize(); ms.append(a.elapsed_time(b))
    return statistics.median(ms)


_built = {}


def build(src, arch, expr, inc=SRC):
    key = (src, arch, expr, inc)
    if key in _built:
        return _built[key]
    mod = cupy.RawModule(code=src, options=OPTS + ("--gpu-architecture=" + arch, "-I" + inc),
                         name_expressions=[expr])
    _built[key] = mod.get_function(expr)
    return _built[key]


def launch(fn, grid, block, shmem, args):
    conv = [cupy.asarray(a) if isinstance(a, torch.Tensor) else cupy.int32(a) for a in args]
    fn.max_dynamic_shared_size_bytes = shmem
    fn(grid, (block,), tuple(conv), shared_mem=shmem)


LOGITS_CUTS = {
    # il_loop::run_halves (sm_90a prefill: the warpgroups share each tile,
    # each folds one half of its columns while the other half's MMA runs)
    "noepilogue": [
        ("        float v[2 * QH] = {};\n"
         "        il_partial<HP>(v, acc, m.ws + h * NH, 0, NH / 8);\n"
         "        lq.write(v, bk, t * IL_ROWS + il_row16(), sc0, sc1,\n"
         "                 out + h * QH * bk.stride);",
         "        if (acc[0] == 123.0f) out[0] = acc[1] + sc0 + sc1;"),
        # il_loop::run_shared (the same, unsplit) and il_loop::run (HEAD)
        ("            il_partial<HP>(v, acc, m.ws, 0, NW / 8);\n"
         "            lq.write(v, bk, tile(j) * IL_ROWS + il_row16(), sc0, sc1, out);",
         "            if (acc[0] == 123.0f) out[0] = acc[1] + sc0 + sc1 + v[0];"),
        ("            il_epilogue<HP, QB>(acc, m.ws, bk, lq, tile(j),\n"
         "                                m.scs + (j % S) * IL_ROWS, out);",
         "            if (acc[0] == 123.0f) out[0] = acc[1];")],
    # the epilogue's fp32 work halved (relu and weighted sum over half the
    # columns) or kept without its quad sums and stores: how its cost
    # scales (docs/perf.md)
    "halfepi": [
        ("            il_partial<HP>(v, acc, m.ws, 0, NW / 8);\n"
         "            lq.write(v, bk, tile(j)",
         "            il_partial<HP>(v, acc, m.ws, 0, NW / 16);\n"
         "            lq.write(v, bk, tile(j)")],
    "nowrite": [
        ("            lq.write(v, bk, tile(j) * IL_ROWS + il_row16(), sc0, sc1, out);",
         "            if (v[0] == 123.0f) out[0] = v[1] + v[2] + v[3] + sc0 + sc1;")],
    "nomma": [
        ("            il_wgmma<NH>::run(acc, il_desc(ka + kk * 256, 8 * D),\n"
         "                              il_desc(qa + kk * 256, 8 * D), kk > 0);",
         "            acc[kk] = (float)kk;"),
        ("            il_mma<NW, D>(m.k0 + st * IL_ROWS * D, m.qa, nullptr, nullptr,\n"
         "                          acc);",
         "            for (int q_ = 0; q_ < NW / 2; q_++) acc[q_] = (float)q_;"),
        ("            il_mma_issue<NW, D>(kd + st * (IL_ROWS * D >> 4), qd, acc);",
         "            for (int q_ = 0; q_ < NW / 2; q_++) acc[q_] = (float)q_;"),
        ("            il_mma(m, j % S, acc);",
         "            for (int q_ = 0; q_ < NQ / 2; q_++) acc[q_] = (float)q_;")],
    "noload": [
        ("                issue_shared(jn, full);\n            }", "            }"),
        ("            il_bar_wait(full + 8 * st, (unsigned)(j / SS) & 1u);",
         "            if (j < PD) il_bar_wait(full + 8 * st, (unsigned)(j / SS) & 1u);"),
        ("                    il_bar_wait(empty + 8 * (jn % SS), (jn / SS - 1) & 1u);",
         "                    {}"),
        ("            if (j + S - 1 < nt)\n                load(j + S - 1, pg);", "")],
}


def logits_cuts(src):
    """The prefill loop with one step cut out (LOGITS_CUTS: whichever of
    the loops the source has): the epilogue, the MMA, or the loads (every
    stage is read as it was after its first fill, so nothing waits on
    memory)."""
    v = {"base": src}
    if "--no-cuts" in sys.argv:
        return v
    for name, reps in LOGITS_CUTS.items():
        s_ = src
        for old, new in reps:
            s_ = s_.replace(old, new)
        assert s_ != src, name
        v[name] = s_
    return v


def smem_bytes(nq, d=128, cap=4):
    """il_smem_bytes (kernels/indexer_logits.cu) for nq columns, at most
    cap stages."""
    s = max(1, min(cap, (217088 - nq * d - nq * 4) // (128 * (d + 4))))
    return nq * d + s * 128 * (d + 4) + nq * 4


def logits_variants(dirs):
    """Each kernels directory of dirs (TAG=DIR; the first is the working
    tree's) with its cuts, on the same data in one process."""
    T, N, H, D = 4096, 65536, 64, 128
    g = torch.Generator(device="cuda").manual_seed(2)
    q = (torch.randn(T, H, D, generator=g, device="cuda")).to(torch.float8_e4m3fn)
    k = (torch.randn(N, D, generator=g, device="cuda")).to(torch.float8_e4m3fn)
    w = torch.randn(T, H, generator=g, device="cuda") / H
    ksc = torch.rand(N, generator=g, device="cuda") + 0.5
    ks = torch.zeros(T, dtype=torch.int32, device="cuda")
    ke = (N - T + 1 + torch.arange(T, device="cuda")).to(torch.int32)
    out = torch.empty(T, N, device="cuda")
    flops = 2.0 * H * D * float((ke - ks).sum().item())
    res = {}
    rounds = 3 if "--no-cuts" in sys.argv else 2
    for rnd in range(rounds):
        for tag, d in dirs:
            src = open(d + "/indexer_logits.cu").read()
            # queries per block and threads of each generation of the kernel
            qb, nt = (8, 512) if "il_nwg" in src else (4, 256) if "run_shared" in src else (2, 256)
            cap = 6 if "nq >= 512 ? 6 : 4" in src and qb * 64 >= 512 else 4
            for name, s in logits_cuts(src).items():
                if (rnd or "--no-cuts" in sys.argv or
                        tag != dirs[0][0] and "--all-cuts" not in sys.argv) and name != "base":
                    continue
                fn = build(s, "sm_90a", "kw_k_indexer_logits<64,128,false,0,1>", d)
                shm = smem_bytes(qb * 64, cap=cap)
                ms = timed(lambda: launch(fn, (T // qb,), nt, shm, [q.view(torch.uint8), w, k.view(torch.uint8), ksc, ks, ke, T, N, N, out]))
                res[f"{tag}_{name}_{rnd}"] = ms
                print(f"logits {tag} {name} (round {rnd}): {ms:.3f} ms = {flops / ms / 1e9:.0f} TFLOP/s", flush=True)
    return res


def decode_cuts(src):
    """The sm_90a decode path (il_loop::run_tma) with one step cut out:
    the fold (epilogue), the MMA, or the bulk copies (every stage is read
    as it was after its first fill, so nothing waits on memory)."""
    v = {"base": src}
    v["noepilogue"] = src.replace(
        "            fold(acc, tile(j), sc0, sc1);",
        "            asm volatile(\"wgmma.wait_group.sync.aligned 0;\\n\" ::: \"memory\");\n"
        "            if (acc[0] == 123.0f) out[0] = acc[1] + sc0 + sc1;")
    v["nomma"] = src.replace(
        "            mma_regs(kr, acc);",
        "            for (int q_ = 0; q_ < NQ / 2; q_++) acc[q_] = __int_as_float(kr[q_ % 8]);")
    v["noload"] = src.replace(
        "            il_bar_wait(bar0 + 8 * st, (unsigned)(j / S) & 1u);",
        "            if (j < S) il_bar_wait(bar0 + 8 * st, (unsigned)(j / S) & 1u);").replace(
        "            if (producer && j + S < nt) {", "            if (false) {")
    for k_, s_ in v.items():
        assert k_ == "base" or s_ != src, k_
    return v


def decode_variants():
    v = decode_cuts(open(SRC + "indexer_logits.cu").read())
    B, rows, PR, D, H = 128, 65536, 64, 128, 64
    width = rows // PR
    g = torch.Generator(device="cuda").manual_seed(3)
    pages = B * width
    kp = torch.randn(pages, PR, D, generator=g, device="cuda").to(torch.float8_e4m3fn)
    ksc = torch.rand(pages, PR, generator=g, device="cuda") + 0.5
    bt = torch.randperm(pages, generator=g, device="cuda").to(torch.int32).view(B, width)
    q = torch.randn(B, H, D, generator=g, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(B, H, generator=g, device="cuda") / H
    re_ = torch.full((B,), rows, dtype=torch.int32, device="cuda")
    out = torch.empty(B, rows, device="cuda")
    a = torch.empty(1 << 30, dtype=torch.uint8, device="cuda"); b2 = torch.empty_like(a)
    cms = timed(lambda: b2.copy_(a)); cg = 2 * (1 << 30) / cms / 1e6
    del a, b2
    res = {}
    for name, s in v.items():
        fn = build(s, "sm_90a", "kw_k_indexer_logits<64,128,true,64,1>")
        for split in ((2, 3, 4, 9) if name == "base" else (3,)):
            ms = timed(lambda: launch(fn, (split, B, 1), 256, 76032, [q.view(torch.uint8), w, kp.view(torch.uint8), ksc, bt, re_, B, width, rows, out]))
            gb = B * rows * D / ms / 1e6
            res[f"{name}_{split}"] = ms
            print(f"decode n1 {name} split {split}: {ms:.3f} ms, {gb:.0f} GB/s = {gb / cg:.2f} of copy {cg:.0f}", flush=True)
    return res


def topk_variants():
    src = open(SRC + "indexer_topk.cu").read()
    v = {"base": src}
    a = """    if (n > 4 * IT_THREADS)
        it_sort_emit<8>(sel, n, out);
    else if (n > 2 * IT_THREADS)
        it_sort_emit<4>(sel, n, out);
    else if (n > 1024)
        it_sort_emit<2>(sel, n, out);"""
    assert a in src
    v["nosort"] = "#define IT_BUCKET 0\n" + src.replace(a, """    if (n > 1024)
        it_emit(sel, n, out);""")
    v["network"] = "#define IT_BUCKET 0\n" + src
    b = "        kw_u64 thr = it_select_smem(cand, ctl->ncand, TOPK - above, hist, ctl);"
    assert b in src
    v["noselect"] = src.replace(b, "        kw_u64 thr = cand[0];")
    c = "    it_gather(row, len, bin, sel, cand, &ctl->placed);"
    assert c in src
    v["nogather"] = src.replace(c, "")
    v["forward"] = "#define IT_BACK 0\n" + src
    R, N, K = 4096, 65536, 2048
    g = torch.Generator(device="cuda").manual_seed(4)
    # Unrounded normal scores: the 11-bit bin of the 2048th best holds
    # about 1,100 of 65,536 (1.7%), as on the indexer's own logits
    # (indexer_peer.py --only topk prints theirs: median 1,134).
    x = torch.randn(R, N, generator=g, device="cuda")
    re_ = torch.full((R,), N, dtype=torch.int32, device="cuda")
    out = torch.empty(R, K, dtype=torch.int32, device="cuda")
    res = {}
    for name, s in v.items():
        fn = build(s, "sm_90", "kw_k_indexer_topk<2048,false>")
        res[name] = timed(lambda: launch(fn, (R,), 512, 73728, [x, re_, re_, R, N, out]))
        print(f"topk {name}: {res[name]:.3f} ms", flush=True)
    return res


def portable_check(d="kernels"):
    """The prefill key of d built for compute_80 (the mma.sync path, PTX
    JIT-compiled by the driver) against the sm_90a build on the same data:
    the largest difference relative to the row's largest magnitude, and
    whether the -inf positions agree."""
    src = open(d + "/indexer_logits.cu").read()
    qb, nt = (8, 512) if "il_nwg" in src else (4, 256) if "run_shared" in src else (2, 256)
    T, N, H, D = 512, 8192, 64, 128
    g = torch.Generator(device="cuda").manual_seed(5)
    q = torch.randn(T, H, D, generator=g, device="cuda").to(torch.float8_e4m3fn)
    k = torch.randn(N, D, generator=g, device="cuda").to(torch.float8_e4m3fn)
    w = torch.randn(T, H, generator=g, device="cuda") / H
    ksc = torch.rand(N, generator=g, device="cuda") + 0.5
    ks = torch.randint(0, N // 2, (T,), generator=g, device="cuda").to(torch.int32)
    ke = (ks + torch.randint(1, N // 2, (T,), generator=g, device="cuda")).to(torch.int32)
    outs = []
    for arch in ("sm_90a", "compute_80"):
        fn = build(src, arch, "kw_k_indexer_logits<64,128,false,0,1>", d)
        out = torch.full((T, N), 7.0, device="cuda")
        launch(fn, ((T + qb - 1) // qb,), nt, smem_bytes(qb * 64),
               [q.view(torch.uint8), w, k.view(torch.uint8), ksc, ks, ke, T - 3, N, N, out])
        torch.cuda.synchronize()
        outs.append(out)
    a, b = outs
    fin = torch.isfinite(b)
    same_inf = bool(torch.equal(torch.isinf(a), torch.isinf(b)))
    untouched = bool((a[T - 3:] == 7.0).all() and (b[T - 3:] == 7.0).all())
    rel = ((a - b).abs()[fin].max() / b[fin].abs().max()).item()
    print(f"portable (compute_80) vs sm_90a prefill: max rel diff {rel:.2e}, "
          f"-inf positions equal {same_inf}, rows past num_rows untouched {untouched}", flush=True)
    return {"rel": rel, "same_inf": same_inf, "untouched": untouched}


if __name__ == "__main__":
    extra = [a.split("=", 1) for a in sys.argv[2:] if "=" in a]
    if "--portable" in sys.argv:
        r = {"portable": portable_check()}
    elif "--topk-only" in sys.argv:
        r = {"topk": topk_variants()}
    elif "--logits-only" in sys.argv:
        tree = [] if "--no-tree" in sys.argv else [("tree", "kernels")]
        r = {"logits": logits_variants(tree + extra)}
    else:
        r = {"topk": topk_variants(), "logits": logits_variants([("tree", "kernels")] + extra),
             "decode": decode_variants()}
    json.dump(r, open(sys.argv[1], "w"), indent=1)
