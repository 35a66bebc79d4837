"""kwarm.torch without a GPU: the ops' registration, their fake
implementations under FakeTensorMode, the argument checks, torch.compile
tracing, and the miss rules, on a deployment loaded through a real kwarmd
onto a stand-in device (load(stand_in=...): libkwarm dispatches and checks
every call and hands the launch to a Python callable; CPU tensors'
pointers are never dereferenced).

Needs torch (the whole module is skipped in one line without it) and
KWARMD (the kwarmd binary) and KWARM_LIBRARY (libkwarm.so), as `make
test` sets them.
"""
import json
import os
import tempfile
import unittest

try:
    import torch
except ImportError:
    raise unittest.SkipTest("torch is not importable: kwarm.torch tests skipped")

import kwarm_client
import kw_calls
from test_client import Kwarmd

# kwarm.torch keeps its generated code in a cache directory: a private one
os.environ.setdefault("KWARM_CACHE_DIR", tempfile.mkdtemp(prefix="kw-test-cache-"))

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
V32 = os.path.join(ROOT, "tests", "fixtures", "deepseek-v3.2-exp.json")
RANK = {"dcp_world": 2, "dcp_rank": 1}

kt = None       # kwarm.torch, imported in setUpModule
DAEMON = None
DEP = None


class Recorder:
    """The stand-in device: records every launch."""

    def __init__(self):
        self.launches = []
        self.capturing = False

    def __call__(self, family, fields, geo):
        self.launches.append((family, fields, geo))


REC = Recorder()


def setUpModule():
    global kt, DAEMON, DEP
    DAEMON = Kwarmd()   # SkipTest without KWARMD
    try:
        import kwarm.torch as kt_mod
    except Exception:
        DAEMON.stop()
        raise
    kt = kt_mod
    DEP = kt.load(V32, RANK, socket=DAEMON.sock, stand_in=REC, timeout_ms=-1)


def tearDownModule():
    if DEP is not None:
        DEP.close()
    if DAEMON is not None:
        status = DAEMON.stop()
        assert status == 0, "kwarmd exit status %d" % status


def kinds(op):
    return dict(kt.OPS)[op]


def families():
    return {fam for fam, _, _ in DEP.keys()}


def has_keys(op):
    fam = {"indexer_logits_paged": "indexer_logits"}.get(op, op)
    return fam in families()


class Base(unittest.TestCase):
    def setUp(self):
        kt._DEPLOYED.clear()
        kt._DEPLOYED[-1] = DEP
        REC.launches.clear()
        REC.capturing = False
        self.calls = kw_calls.calls(DEP.topk, DEP.dcp_world)

    def out_op(self, op):
        return getattr(torch.ops.kwarm, op + "_out")

    def alloc_op(self, op):
        return getattr(torch.ops.kwarm, op)


class Registration(Base):
    def test_every_op_has_both_forms_with_the_c_arguments(self):
        self.assertEqual(len(kt.OPS), 8)
        for op, args in kt.OPS:
            out = self.out_op(op).default._schema
            self.assertEqual([a.name for a in out.arguments],
                             [a for a, _ in args], op)
            for a, (_, k) in zip(out.arguments, args):
                mutable = a.alias_info is not None and a.alias_info.is_write
                self.assertEqual(mutable, k in (1, 3), (op, a.name))
            self.assertEqual(len(out.returns), 0)
            alloc = self.alloc_op(op).default._schema
            nout = sum(1 for _, k in args if k in (1, 3))
            self.assertEqual(len(alloc.returns), nout, op)
            self.assertFalse(any(a.alias_info for a in alloc.arguments), op)

    def test_deployment_reads_the_rank(self):
        self.assertEqual(DEP.dcp_world, 2)
        self.assertEqual(DEP.dcp_rank, 1)
        self.assertEqual(DEP.topk, 2048)
        self.assertEqual(DEP.arch, "sm_90")
        s = DEP.stats()
        self.assertGreater(s["loaded"], 0)
        self.assertEqual(s["loaded"], len(DEP.keys()))
        self.assertIs(kt.deployment("stand-in"), DEP)
        self.assertIn("dcp 1/2", repr(DEP))


class Fakes(Base):
    def test_allocating_forms_give_shapes_and_dtypes(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        want = kw_calls.expected(DEP.topk, DEP.dcp_world)
        mode = FakeTensorMode()
        for op, args in self.calls.items():
            with self.subTest(op=op):
                real = kw_calls.alloc_args(args, kinds(op))
                with mode:
                    fake = [mode.from_tensor(v) if isinstance(v, torch.Tensor)
                            else v for v in real]
                    got = self.alloc_op(op)(*fake)
                got = got if isinstance(got, tuple) else (got,)
                self.assertEqual([(t.dtype, tuple(t.shape)) for t in got],
                                 want[op])
                for t in got:
                    self.assertEqual(type(t).__name__, "FakeTensor")
        self.assertEqual(REC.launches, [], "a fake launched")

    def test_optional_output_not_asked_for_is_empty(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        args = kw_calls.alloc_args(self.calls["index_conversion"],
                                   kinds("index_conversion"))
        i = [a for a, k in kinds("index_conversion") if k != 1].index("valid_count")
        args[i] = False
        mode = FakeTensorMode()
        with mode:
            fake = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                    for v in args]
            out, valid = torch.ops.kwarm.index_conversion(*fake)
        self.assertEqual(tuple(out.shape), (kw_calls.ROWS, DEP.topk))
        self.assertEqual(tuple(valid.shape), (0,))

    def test_out_forms_return_nothing_and_launch_nothing(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        mode = FakeTensorMode()
        for op, args in self.calls.items():
            with self.subTest(op=op):
                with mode:
                    fake = [mode.from_tensor(v) if isinstance(v, torch.Tensor)
                            else v for _, v in args]
                    self.assertIsNone(self.out_op(op)(*fake))
        self.assertEqual(REC.launches, [])

    def test_fakes_check_shapes_too(self):
        from torch._subclasses.fake_tensor import FakeTensorMode
        mode = FakeTensorMode()
        args = [v for _, v in self.calls["indexer_topk"]]
        args[0] = torch.zeros(kw_calls.ROWS, 99)
        with mode:
            fake = [mode.from_tensor(v) if isinstance(v, torch.Tensor) else v
                    for v in args]
            with self.assertRaisesRegex(ValueError, r"indexer_topk: logits "):
                self.out_op("indexer_topk")(*fake)


class Launches(Base):
    def test_each_valid_call_launches_its_family_once(self):
        for op, args in self.calls.items():
            with self.subTest(op=op):
                REC.launches.clear()
                before = DEP.stats()["launches"]
                values = [v for _, v in args]
                if not has_keys(op):
                    # e.g. compressed_slot_mapping on V3.2 (no compress
                    # ratios): libkwarm names the argument no key serves.
                    with self.assertRaises(ValueError) as e:
                        self.out_op(op)(*values)
                    self.assertIn(op, str(e.exception))
                    self.assertEqual(REC.launches, [])
                    continue
                self.out_op(op)(*values)
                fam = {"indexer_logits_paged": "indexer_logits"}.get(op, op)
                self.assertEqual([f for f, _, _ in REC.launches], [fam])
                self.assertEqual(DEP.stats()["launches"], before + 1)
                fields, loaded = DEP.dispatch(op, *values)
                self.assertTrue(loaded)
                self.assertEqual(fields, REC.launches[0][1])
                geo = REC.launches[0][2]
                self.assertGreater(geo["grid"][0], 0)
                self.assertGreater(geo["block"][0], 0)

    def test_allocating_form_launches_and_returns_its_outputs(self):
        want = kw_calls.expected(DEP.topk, DEP.dcp_world)
        for op, args in self.calls.items():
            if not has_keys(op):
                continue
            with self.subTest(op=op):
                REC.launches.clear()
                got = self.alloc_op(op)(*kw_calls.alloc_args(args, kinds(op)))
                got = got if isinstance(got, tuple) else (got,)
                self.assertEqual([(t.dtype, tuple(t.shape)) for t in got], want[op])
                self.assertEqual(len(REC.launches), 1)

    def test_direct_entry_points_are_the_same_calls(self):
        args = [v for _, v in self.calls["indexer_topk"]]
        kt.direct.indexer_topk_out(*args)
        self.out_op("indexer_topk")(*args)
        self.assertEqual(len(REC.launches), 2)
        self.assertEqual(REC.launches[0], REC.launches[1])

    def test_fp8_tensors_are_taken_as_bytes(self):
        if not hasattr(torch, "float8_e4m3fn"):
            self.skipTest("this torch has no float8_e4m3fn")
        args = [v for _, v in self.calls["indexer_logits"]]
        args[0] = args[0].view(torch.float8_e4m3fn)
        args[2] = args[2].view(torch.float8_e4m3fn)
        self.out_op("indexer_logits")(*args)
        self.assertEqual(len(REC.launches), 1)


def _bad_dtype(t):
    return t.to({torch.int32: torch.int64, torch.int64: torch.int32,
                 torch.float32: torch.float64, torch.uint8: torch.int8}[t.dtype])


def _bad_shape(t):
    shape = list(t.shape)
    shape[-1] += 1
    return torch.zeros(shape, dtype=t.dtype)


def _strided(t):
    s = torch.zeros(tuple(t.shape) + (2,), dtype=t.dtype)[..., 0]
    assert s.shape == t.shape and not s.is_contiguous()
    return s


class Validation(Base):
    """Every defect of every tensor argument raises ValueError naming the
    argument, and nothing launches."""

    def each_tensor(self):
        for op, args in self.calls.items():
            for i, (name, v) in enumerate(args):
                if isinstance(v, torch.Tensor):
                    yield op, args, i, name, v

    def assert_refused(self, op, values, pattern):
        before = DEP.stats()["launches"]
        with self.assertRaisesRegex(ValueError, pattern):
            self.out_op(op)(*values)
        self.assertEqual(REC.launches, [])
        self.assertEqual(DEP.stats()["launches"], before)

    def test_wrong_dtype(self):
        for op, args, i, name, v in self.each_tensor():
            with self.subTest(op=op, arg=name):
                values = [a for _, a in args]
                values[i] = _bad_dtype(v)
                self.assert_refused(op, values, r"^kwarm\.%s: %s must be \S+" % (op, name))

    def test_wrong_shape(self):
        for op, args, i, name, v in self.each_tensor():
            with self.subTest(op=op, arg=name):
                values = [a for _, a in args]
                values[i] = _bad_shape(v)
                self.assert_refused(op, values,
                                    r"^kwarm\.%s: %s must have shape" % (op, name))

    def test_wrong_rank(self):
        for op, args, i, name, v in self.each_tensor():
            with self.subTest(op=op, arg=name):
                values = [a for _, a in args]
                values[i] = v.reshape(-1)[:1].reshape((1,) * (v.dim() + 1))
                self.assert_refused(op, values,
                                    r"^kwarm\.%s: %s must have shape" % (op, name))

    def test_not_contiguous(self):
        for op, args, i, name, v in self.each_tensor():
            with self.subTest(op=op, arg=name):
                values = [a for _, a in args]
                values[i] = _strided(v)
                self.assert_refused(op, values,
                                    r"^kwarm\.%s: %s must be contiguous" % (op, name))

    def test_required_tensor_missing(self):
        for op, args, i, name, v in self.each_tensor():
            if kinds(op)[i][1] not in (0, 1):
                continue
            with self.subTest(op=op, arg=name):
                values = [a for _, a in args]
                values[i] = None
                if i == 0:
                    # The first argument picks the deployment; the
                    # dispatcher itself refuses None for a Tensor.
                    with self.assertRaises((ValueError, RuntimeError, TypeError)):
                        self.out_op(op)(*values)
                    self.assertEqual(REC.launches, [])
                    continue
                self.assert_refused(op, values, r"^kwarm\.%s: %s is required" % (op, name))

    def test_wrong_device(self):
        # Play a deployment on cuda:0: every CPU tensor is then on the
        # wrong device, and the first one checked is named.
        kt._DEPLOYED.clear()
        kt._DEPLOYED[0] = DEP
        DEP.device_index, DEP.device_name = 0, "cuda:0"
        try:
            for op, args in self.calls.items():
                with self.subTest(op=op):
                    self.assert_refused(op, [v for _, v in args],
                                        r"^kwarm\.%s: %s is on cpu, the deployment "
                                        r"on cuda:0" % (op, args[0][0]))
        finally:
            DEP.device_index, DEP.device_name = -1, "cpu (stand-in)"

    def test_libkwarm_names_a_size_no_key_serves(self):
        values = [v for _, v in self.calls["prefill_chunk_metadata"]]
        values[[n for n, _ in self.calls["prefill_chunk_metadata"]]
               .index("compress_ratio")] = 3   # V3.2 has ratio 1 only
        self.assert_refused("prefill_chunk_metadata", values, r"compress_ratio")

    def test_no_deployment_loaded(self):
        kt._DEPLOYED.clear()
        with self.assertRaisesRegex(RuntimeError, r"kwarm\.torch\.load"):
            self.out_op("indexer_topk")(*[v for _, v in self.calls["indexer_topk"]])


class Compile(Base):
    def test_fullgraph_traces_the_decode_pipeline(self):
        c = self.calls
        topk_args = [v for _, v in c["indexer_topk"]]
        pack = [v for _, v in c["dcp_pack_topk_candidates"]]
        stable = [v for _, v in c["dcp_stable_topk"]]
        conv = [v for _, v in c["index_conversion"]]
        r = kw_calls.ROWS

        def step(logits, row_end, gathered, req_id, block_table):
            pos = torch.ops.kwarm.indexer_topk(logits, None, None, r, 100, row_end)
            packed = torch.ops.kwarm.dcp_pack_topk_candidates(logits, pos, None, r, 100)
            both = torch.cat([packed, gathered[:, DEP.topk:]], dim=1)
            best = torch.ops.kwarm.dcp_stable_topk(both, r)
            out = torch.empty_like(best)
            valid = torch.empty_like(req_id)
            # DCP decode rows: count_valid is part of every DCP key
            # (docs/spec/warmup-keys.md §4.3), so valid_count is given.
            torch.ops.kwarm.index_conversion_out(
                req_id, block_table, best, None, None, r, 2, 0, 16, 0, out,
                valid, False, False)
            return out, valid

        inputs = (topk_args[0], topk_args[-1], stable[0], conv[0], conv[1])
        step(*inputs)
        eager = [(f, fl) for f, fl, _ in REC.launches]
        self.assertEqual([f for f, _ in eager], ["indexer_topk",
                                                 "dcp_pack_topk_candidates",
                                                 "dcp_stable_topk",
                                                 "index_conversion"])
        REC.launches.clear()
        torch._dynamo.reset()
        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        compiled(*inputs)
        self.assertEqual([(f, fl) for f, fl, _ in REC.launches], eager)
        self.assertEqual(DEP.stats()["runtime_misses"], 0)
        del pack

    def test_opcheck(self):
        opcheck = getattr(torch.library, "opcheck", None)
        if opcheck is None:
            self.skipTest("this torch has no torch.library.opcheck")
        for op in ("indexer_topk", "dcp_stable_topk", "index_conversion"):
            args = self.calls[op]
            with self.subTest(op=op, form="out"):
                opcheck(self.out_op(op).default, tuple(v for _, v in args),
                        test_utils=("test_schema", "test_faketensor",
                                    "test_aot_dispatch_dynamic"))
            with self.subTest(op=op, form="alloc"):
                opcheck(self.alloc_op(op).default,
                        tuple(kw_calls.alloc_args(args, kinds(op))),
                        test_utils=("test_schema", "test_faketensor"))


class CodeCache(unittest.TestCase):
    """The generated per-op code is kept in KWARM_CACHE_DIR; a cached file
    that is not a code object is replaced, never executed."""

    def test_cached_then_reused_and_a_bad_file_replaced(self):
        import marshal
        import subprocess
        import sys
        d = tempfile.mkdtemp(prefix="kw-cache-")
        env = dict(os.environ, KWARM_CACHE_DIR=d)
        code = ("import torch, kwarm.torch as k; print(sorted(k.SCHEMAS.values())); "
                "print(torch.ops.kwarm.indexer_topk_out.default._schema)")

        def run():
            p = subprocess.run([sys.executable, "-c", code], capture_output=True,
                               text=True, env=env, timeout=300)
            self.assertEqual(p.returncode, 0, p.stderr)
            return p.stdout
        first = run()
        files = [f for f in os.listdir(d) if f.endswith(".marshal")]
        self.assertEqual(len(files), 1, os.listdir(d))
        path = os.path.join(d, files[0])
        self.assertEqual(run(), first)
        for bad in (b"\x00not marshal", marshal.dumps(42)):
            with open(path, "wb") as f:
                f.write(bad)
            self.assertEqual(run(), first)
            with open(path, "rb") as f:
                self.assertEqual(type(marshal.load(f)).__name__, "code")
        self.assertIn("def _out_indexer_topk(", kt.source("indexer_topk"))


class Misses(unittest.TestCase):
    """A key the deployment did not warm: refused while "capturing",
    served (and audited by kwarmd) outside.  Its own kwarmd, so that the
    key is not in the cache."""

    @classmethod
    def setUpClass(cls):
        cls.daemon = Kwarmd()
        cls.rec = Recorder()
        # One batched token: prefill_chunk_metadata warms query_slice_stop
        # classes 1 and 2 only (docs/spec/warmup-keys.md §4.1).
        cls.dep = kt.load(V32, dict(RANK, max_num_batched_tokens=1),
                          socket=cls.daemon.sock, stand_in=cls.rec,
                          timeout_ms=-1)

    @classmethod
    def tearDownClass(cls):
        cls.dep.close()
        kt._DEPLOYED.clear()
        kt._DEPLOYED[-1] = DEP
        assert cls.daemon.stop() == 0

    def setUp(self):
        kt._DEPLOYED.clear()
        kt._DEPLOYED[-1] = self.dep

    def missing_call(self):
        """A prefill_chunk_metadata call whose key is not loaded."""
        i32 = lambda v: torch.tensor(v, dtype=torch.int32)
        tried = []
        for stop in (32, 16, 17, 48, 3):
            args = [i32([0, stop]), i32([stop + 100]), i32([0, 40]), 1, 0, stop,
                    40, torch.zeros(stop, dtype=torch.int32),
                    torch.zeros(stop, dtype=torch.int32),
                    torch.zeros(40, dtype=torch.int32), 1, False]
            try:
                fields, loaded = self.dep.dispatch("prefill_chunk_metadata", *args)
            except ValueError as e:
                tried.append((stop, str(e)))
                continue
            if not loaded:
                return args, fields
            tried.append((stop, fields))
        self.fail("no unwarmed prefill_chunk_metadata call found: %s" % tried)

    def test_capture_refuses_then_outside_serves(self):
        args, fields = self.missing_call()
        before, keys = self.dep.stats(), self.dep.keys()
        self.rec.capturing = True
        with self.assertRaises(RuntimeError) as e:
            torch.ops.kwarm.prefill_chunk_metadata_out(*args)
        self.assertIn("prefill_chunk_metadata", str(e.exception))
        self.assertEqual(self.rec.launches, [])
        after = self.dep.stats()
        self.assertEqual(after["loaded"], before["loaded"])
        self.assertEqual(after["capture_misses"], before["capture_misses"] + 1)
        self.assertEqual(self.dep.keys(), keys)

        self.rec.capturing = False
        torch.ops.kwarm.prefill_chunk_metadata_out(*args)
        self.assertEqual([(f, fl) for f, fl, _ in self.rec.launches],
                         [("prefill_chunk_metadata", fields)])
        after = self.dep.stats()
        self.assertEqual(after["loaded"], before["loaded"] + 1)
        self.assertEqual(after["runtime_misses"], before["runtime_misses"] + 1)
        self.assertTrue(self.dep.dispatch("prefill_chunk_metadata", *args)[1])
        with kwarm_client.Client(self.daemon.sock, timeout=60) as c:
            misses = c.misses()["misses"]
        text = json.dumps(misses)
        self.assertIn("prefill_chunk_metadata", text)
        self.assertIn(str(os.getpid()), text)

        # Served once: the same call again is a plain launch.
        self.rec.launches.clear()
        torch.ops.kwarm.prefill_chunk_metadata_out(*args)
        self.assertEqual(self.dep.stats()["runtime_misses"],
                         before["runtime_misses"] + 1)


if __name__ == "__main__":
    unittest.main()
