#!/usr/bin/env python3
"""Paged decode logits alone, with a copy measured before and after.

usage: indexer_decode.py DIR [SPEC ...]

DIR is what `bench_indexer DIR` wrote.  Each SPEC is TAG:CUBIN:NEXT_N[:SPLIT]
(default: n1:logits_decode_n1:1 n2:logits_decode_n2:2): CUBIN.cubin in DIR
is timed as the decode key of that next_n with indexer_bench.py's decode()
(B=128 x 65,536 rows, pages of 64, 5 launches after 2 warm-ups, the median,
two queries checked against float64), SPLIT 0 or absent picking the grid as
indexer_bench.py does.  NEXT_N 0 times CUBIN as the prefill key instead
(indexer_bench.py's prefill() without its peers).  A variant cubin built
from other sources with the same entry can be timed beside the key's own;
a CUBIN of the form SUBDIR/NAME is DIR/SUBDIR/NAME.cubin with the launch
geometry of DIR/SUBDIR/kernels.json (another bench_indexer output, e.g.
HEAD's build beside a change's).
Copy bandwidth on this GPU moved between runs of one process (3.6 to 4.2
TB/s here), so both copies are printed and each row's ratio is against the
first.
"""
import json
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import indexer_bench as ib  # noqa: E402


def main():
    if len(sys.argv) < 2 or sys.argv[1] in ("-h", "--help"):
        print(__doc__.strip())
        return 0 if len(sys.argv) >= 2 else 2
    d = sys.argv[1]
    specs = sys.argv[2:] or ["n1:logits_decode_n1:1", "n2:logits_decode_n2:2"]
    meta = json.load(open(f"{d}/kernels.json"))
    copy0 = ib.copy_gbps(5)
    print(f"copy {copy0:.0f} GB/s", flush=True)
    bad = 0
    for spec in specs:
        tag, cubin, nn, split = (spec + ":0").split(":")[:4]
        nn, split = int(nn), int(split)
        kd, km = d, meta
        if "/" in cubin:
            sub, cubin = cubin.rsplit("/", 1)
            kd = f"{d}/{sub}"
            km = json.load(open(f"{kd}/kernels.json"))
        if nn == 0:
            k = ib.Kernel(kd, cubin, {cubin: dict(km["logits_prefill"])})
            r = {}
            ib.prefill(k, 5, r, peers=False)
            bad += r["prefill_mismatches"]
            print(f"{tag}: prefill {r['prefill_ms']:.3f} ms = {r['prefill_tflops']:.0f} TFLOP/s, "
                  f"{r['prefill_mismatches']} mismatches", flush=True)
            torch.cuda.empty_cache()
            continue
        k = ib.Kernel(kd, cubin, {cubin: dict(km[f"logits_decode_n{nn}"])})
        r = {}
        ib.decode(k, nn, 5, r, split)
        gbps = r[f"decode_n{nn}_k_gbps"]
        bad += r[f"decode_n{nn}_mismatches"]
        print(f"{tag}: next_n {nn}, split {r[f'decode_n{nn}_split']}, "
              f"{ib.blocks_per_sm(k)} blocks/SM: {r[f'decode_n{nn}_ms']:.3f} ms, "
              f"K read {gbps:.0f} GB/s = {gbps / copy0:.3f} of copy, "
              f"{r[f'decode_n{nn}_mismatches']} mismatches", flush=True)
        torch.cuda.empty_cache()
    print(f"copy {ib.copy_gbps(5):.0f} GB/s", flush=True)
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
