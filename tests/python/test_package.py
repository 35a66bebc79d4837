"""The installed package without torch: kwarm_client and kwarm._lib are
standard library only, kwarm.torch is the only part that imports torch,
and libkwarm is found as kwarm/_lib.py says.

Run by `make test` (KWARM_LIBRARY names the built libkwarm.so there).
"""
import os
import subprocess
import sys
import unittest

import kwarm_client

NO_TORCH = "import sys; sys.modules['torch'] = None; "  # every `import torch` fails

EXPECTED_OPS = [
    "prefill_chunk_metadata", "compressed_slot_mapping", "index_conversion",
    "dcp_pack_topk_candidates", "dcp_stable_topk", "indexer_logits",
    "indexer_topk", "indexer_logits_paged",
]


def run(code, env=None):
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=120, env=env)


class WithoutTorch(unittest.TestCase):
    def test_client_and_lib_import_without_torch(self):
        out = run(NO_TORCH + "import kwarm_client, kwarm, kwarm._lib; "
                  "assert 'torch' not in [m for m in sys.modules if sys.modules[m]]; "
                  "print(kwarm.__version__)")
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertRegex(out.stdout.strip(), r"^\d+\.\d+")

    def test_kwarm_torch_needs_torch(self):
        out = run(NO_TORCH + "import kwarm.torch")
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("torch", out.stderr)

    def test_installed_next_to_kwarm_client(self):
        import kwarm
        self.assertEqual(os.path.dirname(os.path.dirname(
            os.path.abspath(kwarm.__file__))),
            os.path.dirname(os.path.abspath(kwarm_client.__file__)))


class FindsLibkwarm(unittest.TestCase):
    def test_a_bad_kwarm_library_is_named(self):
        env = dict(os.environ, KWARM_LIBRARY="/nonexistent/libkwarm.so")
        out = run("import kwarm._lib as l; l.lib()", env)
        self.assertNotEqual(out.returncode, 0)
        self.assertIn("$KWARM_LIBRARY=/nonexistent/libkwarm.so", out.stderr)

    def test_not_found_names_all_three_places(self):
        env = {k: v for k, v in os.environ.items()
               if k not in ("KWARM_LIBRARY", "LD_LIBRARY_PATH")}
        code = ("import ctypes.util, ctypes, kwarm._lib as l\n"
                "ctypes.util.find_library = lambda n: None\n"
                "real = ctypes.CDLL\n"
                "def cdll(name, *a, **k):\n"
                "    if 'kwarm' in str(name): raise OSError(name + ': no such file')\n"
                "    return real(name, *a, **k)\n"
                "l.ctypes.CDLL = cdll\n"
                "l.lib()\n")
        out = run(code, env)
        self.assertNotEqual(out.returncode, 0)
        for what in ("$KWARM_LIBRARY", "find_library('kwarm')", "libkwarm.so.0"):
            self.assertIn(what, out.stderr)

    def test_ops_and_arguments_come_from_libkwarm(self):
        if not os.environ.get("KWARM_LIBRARY"):
            self.skipTest("KWARM_LIBRARY (the built libkwarm.so) not set")
        from kwarm import _lib
        ops = _lib.lib().ops()
        self.assertEqual([n for n, _ in ops], EXPECTED_OPS)
        for name, args in ops:
            self.assertTrue(args, name)
            self.assertLessEqual(len(args), _lib.MAX_ARGS)
            for arg, kind in args:
                self.assertRegex(arg, r"^[a-z][a-z0-9_]*$")
                self.assertIn(kind, range(6), (name, arg))
        topk = dict(ops)["indexer_topk"]
        self.assertEqual(topk, [("logits", _lib.IN), ("ks", _lib.OPT_IN),
                                ("ke", _lib.OPT_IN), ("num_rows", _lib.SIZE),
                                ("stride", _lib.SIZE), ("topk_pos", _lib.OUT),
                                ("row_end", _lib.OPT_IN)])

    def test_table_width_comes_from_libkwarm(self):
        """The block-table width a launcher passes index_conversion is
        libkwarm's (spec section 4.3), not a copy of the formula."""
        if not os.environ.get("KWARM_LIBRARY"):
            self.skipTest("KWARM_LIBRARY (the built libkwarm.so) not set")
        from kwarm import _lib
        lib = _lib.lib()
        d = _lib.LaunchDeploy(dcp_world=2, block_size=64, max_model_len=163840)
        # 163840 rows over 2 ranks of 64-row blocks: 1280, a multiple of 2.
        self.assertEqual(lib.kw_launch_table_width(d), 1280)
        d = _lib.LaunchDeploy(dcp_world=8, block_size=16, max_model_len=100000)
        # ceil(100000 / 128) = 782, rounded up to a multiple of 128/16 = 8.
        self.assertEqual(lib.kw_launch_table_width(d), 784)


if __name__ == "__main__":
    unittest.main()
