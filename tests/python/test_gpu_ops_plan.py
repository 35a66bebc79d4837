"""gpu_ops.py's plan, run on the CPU: every call gpu_ops.py makes goes
through the real kwarm.torch and libkwarm (dispatch to a loaded key, C's
size checks) on a stand-in device, while the outputs come from gpu_ops.py's
references.  So the GPU script's inputs, shapes and classes are known good
before the GPU run, and the keys its calls reach are compared with the
deployment's warmed keys (issue 22 point 3, seen from Python).

Needs torch (skipped in one line without it), KWARMD and KWARM_LIBRARY.
"""
import os
import tempfile
import unittest

try:
    import torch
except ImportError:
    raise unittest.SkipTest("torch is not importable: gpu_ops.py plan skipped")

from test_client import Kwarmd

# kwarm.torch keeps its generated code in a cache directory: a private one
os.environ.setdefault("KWARM_CACHE_DIR", tempfile.mkdtemp(prefix="kw-test-cache-"))

G = kt = REAL = None
launches = []


def rec(fam, fields, geo):
    launches.append((fam, fields))


def geo(local):
    s = kt._DEPLOYED[-1].settings
    W = s["dcp_world"]
    return (1, 0, 1) if local or W <= 1 else (W, s["dcp_rank"], s["dcp_interleave"])


class Emu:
    """torch.ops.kwarm as gpu_ops.py calls it: the real op (checks,
    dispatch, a stand-in launch), then the reference's outputs."""

    def prefill_chunk_metadata(self, qsl, seq, cu, B, s0, s1, tk, ratio, local):
        REAL.prefill_chunk_metadata(qsl, seq, cu, B, s0, s1, tk, ratio, local)
        return G.ref_prefill_chunk_metadata(qsl, seq, cu, s0, s1, tk, ratio, *geo(local))

    def prefill_chunk_metadata_out(self, qsl, seq, cu, B, s0, s1, tk, ks, ke, t2s, ratio, local):
        REAL.prefill_chunk_metadata_out(qsl, seq, cu, B, s0, s1, tk, ks, ke, t2s, ratio, local)
        for o, r in zip((ks, ke, t2s), G.ref_prefill_chunk_metadata(
                qsl, seq, cu, s0, s1, tk, ratio, *geo(local))):
            o.copy_(r)

    def compressed_slot_mapping(self, slot, qsl, seq, bt, T, B, width, bs, ratio, local):
        REAL.compressed_slot_mapping(slot, qsl, seq, bt, T, B, width, bs, ratio, local)
        return G.ref_compressed_slot_mapping(slot, qsl, seq, bt, bs, ratio, *geo(local))

    def _ic(self, req_id, bt, pos, preq, wss, wrs, ctf, local):
        d = kt._DEPLOYED[-1].settings
        return G.ref_index_conversion(req_id, bt, pos, preq, wss, wrs, d["block_size"], d["block_stride_rows"], *geo(local), ctf)

    def index_conversion(self, req_id, bt, pos, preq, wss, rows, reqs, npre, width, wrs, wvc, ctf, local):
        REAL.index_conversion(req_id, bt, pos, preq, wss, rows, reqs, npre, width, wrs, wvc, ctf, local)
        o, v = self._ic(req_id, bt, pos, preq, wss, wrs, ctf, local)
        return o, (v if wvc else v[:0])

    def index_conversion_out(self, req_id, bt, pos, preq, wss, rows, reqs, npre, width, wrs, out, valid, ctf, local):
        REAL.index_conversion_out(req_id, bt, pos, preq, wss, rows, reqs, npre, width, wrs, out, valid, ctf, local)
        o, v = self._ic(req_id, bt, pos, preq, wss, wrs, ctf, local)
        out.copy_(o)
        if valid is not None: valid.copy_(v)

    def dcp_pack_topk_candidates(self, logits, p, rs, rows, cols):
        REAL.dcp_pack_topk_candidates(logits, p, rs, rows, cols)
        return G.ref_pack(logits, p, rs, *geo(False))

    def dcp_stable_topk(self, g, rows):
        REAL.dcp_stable_topk(g, rows)
        return G.ref_stable_topk(g, kt._DEPLOYED[-1].topk)

    def indexer_logits(self, q, w, k, ksc, ks, ke, T, N, stride, H, D):
        REAL.indexer_logits(q, w, k, ksc, ks, ke, T, N, stride, H, D)
        out = torch.full((T, stride), 12345.0)
        out[:, :N] = G.ref_logits(q, w, k, ksc, ks, ke)[0].to(torch.float32)
        return out

    def indexer_topk(self, logits, ks, ke, rows, stride, re):
        REAL.indexer_topk(logits, ks, ke, rows, stride, re)
        return G.ref_topk(logits, ks, ke, re, kt._DEPLOYED[-1].topk)

    def indexer_logits_paged(self, q, w, kp, sp, bt, re, B, width, max_rows, pr, nn, H, D):
        REAL.indexer_logits_paged(q, w, kp, sp, bt, re, B, width, max_rows, pr, nn, H, D)
        return G.ref_logits_paged(q, w, kp, sp, bt, re, nn, max_rows)[0].to(torch.float32)



def eager_only(c, name, step, args, check):
    check(step(*args), "%s eager" % name)


class Plan(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        global G, kt, REAL
        import gpu_ops
        import kwarm.torch
        G, kt, REAL = gpu_ops, kwarm.torch, torch.ops.kwarm
        cls.saved = (G.OPS, G.eager_graph_compile, torch.cuda.synchronize)
        G.OPS, G.eager_graph_compile = Emu(), eager_only
        torch.cuda.synchronize = lambda *a: None

    @classmethod
    def tearDownClass(cls):
        G.OPS, G.eager_graph_compile, torch.cuda.synchronize = cls.saved

    def run_case(self, name):
        fixture, deploy = G.CASES[name]
        config = os.path.join(G.ROOT, "tests", "fixtures", fixture)
        daemon = Kwarmd()
        G.R = G.Report()
        launches.clear()
        saved = dict(kt._DEPLOYED)
        try:
            dep = kt.load(config, deploy or None, socket=daemon.sock, stand_in=rec,
                          timeout_ms=-1)
            others = {}
            W = dep.settings["dcp_world"]
            for rank in range(W if 1 < W <= 2 else 0):
                if rank != dep.dcp_rank:
                    others[rank] = kt.load(config, dict(deploy, dcp_rank=rank),
                                           socket=daemon.sock, timeout_ms=-1,
                                           stand_in=rec, activate=False)
            c = G.Case(name, dep, G.Gen(1, "cpu"), others)
            for part in (c.ops_prefill_chunk_metadata, c.ops_compressed_slot_mapping,
                         c.ops_index_conversion, c.ops_dcp, c.ops_logits, c.ops_topk):
                G.R.guard(part.__name__, part)
            G.R.guard("pipelines", G.pipelines, c)
            self.assertEqual([(f["check"], f["detail"][:2000]) for f in G.R.failed()], [])
            self.assertGreater(len(G.R.checks), 50)
            self.assertEqual(dep.stats()["runtime_misses"], 0)
            reached = {(f, tuple(sorted(fl.items()))) for f, fl in launches}
            unreached = [(fam, fl) for fam, fl, _ in dep.keys()
                         if (fam, tuple(sorted(fl.items()))) not in reached]
            self.assertEqual(unreached, [])
            for o in others.values():
                o.close()
            dep.close()
        finally:
            kt._DEPLOYED.clear()
            kt._DEPLOYED.update(saved)
            self.assertEqual(daemon.stop(), 0)

    def test_v32_dcp2_rank1(self):
        self.run_case("v32")

    def test_v4_flash(self):
        self.run_case("v4")


if __name__ == "__main__":
    unittest.main()
