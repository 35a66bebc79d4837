"""The Python client as pip installs it, against a real kwarmd.

Run by `make test` inside a temporary virtual environment that
`pip install ./client/python` filled (issue 12 point 12):

    KWARMD=build/kwarmd python -m unittest discover -s tests/python

KWARMD names the kwarmd binary.  Each test class starts its own kwarmd on
a socket and cache in a temporary directory and waits for its READY=1 on
a NOTIFY_SOCKET, as systemd would; tearDown stops it with SIGTERM and
expects exit status 0.
"""
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import unittest

import kwarm_client

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
FIXTURE = os.path.join(ROOT, "tests", "fixtures", "deepseek-v3.2-exp.json")
DEMO = os.path.join(ROOT, "client", "python", "demo_serving.py")
READY_SECONDS = 60


class Kwarmd:
    """kwarmd on DIR/s.sock with cache DIR/cache, ready when constructed."""

    def __init__(self, binary=None, jobs=2):
        binary = binary or os.environ.get("KWARMD")
        if not binary:
            raise unittest.SkipTest("KWARMD (the kwarmd binary) not set")
        self.dir = tempfile.mkdtemp(prefix="kw-pytest-")
        self.sock = os.path.join(self.dir, "s.sock")
        notify = os.path.join(self.dir, "n.sock")
        ready = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        ready.bind(notify)
        ready.settimeout(READY_SECONDS)
        env = dict(os.environ, NOTIFY_SOCKET=notify)
        self.log = open(os.path.join(self.dir, "kwarmd.log"), "wb")
        self.proc = subprocess.Popen(
            [binary, "--socket", self.sock, "--cache",
             os.path.join(self.dir, "cache"), "--jobs", str(jobs)],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=self.log, env=env)
        try:
            while b"READY=1" not in ready.recv(4096).split(b"\n"):
                pass
        except socket.timeout:
            self.stop()
            raise AssertionError("no READY=1 from kwarmd in %d s" % READY_SECONDS)
        finally:
            ready.close()

    def stop(self):
        """SIGTERM; returns the exit status."""
        self.proc.terminate()
        status = self.proc.wait(timeout=60)
        self.log.close()
        shutil.rmtree(self.dir, ignore_errors=True)
        return status


class Installed(unittest.TestCase):
    def test_module_comes_from_this_environment(self):
        # The venv's copy, not the source tree's.
        self.assertTrue(os.path.abspath(kwarm_client.__file__).startswith(
            os.path.abspath(sys.prefix)), kwarm_client.__file__)
        for name in ("Client", "Cuda", "KwarmError", "default_socket"):
            self.assertTrue(hasattr(kwarm_client, name), name)

    def test_module_docstring_names_the_real_api(self):
        # Every c.NAME( and Cuda().NAME( of the usage example exists, and
        # the example is valid Python.
        import re
        doc = kwarm_client.__doc__
        example = "\n".join(l[4:] for l in doc.splitlines()
                             if l.startswith("    "))
        compile(example, "docstring", "exec")
        for name in re.findall(r"\bc\.(\w+)\(", example):
            self.assertTrue(hasattr(kwarm_client.Client, name), name)
        for name in re.findall(r"Cuda\(\)\.(\w+)\(", example):
            self.assertTrue(hasattr(kwarm_client.Cuda, name), name)
        for name in re.findall(r"import ([\w, ]+)", example)[0].split(","):
            self.assertTrue(hasattr(kwarm_client, name.strip()), name)

    def test_demo_help_needs_no_numpy(self):
        # sys.modules["numpy"] = None makes every `import numpy` fail.
        code = ("import sys, runpy; sys.modules['numpy'] = None; "
                "sys.argv = [sys.argv[1], '--help']; "
                "runpy.run_path(sys.argv[0], run_name='__main__')")
        out = subprocess.run([sys.executable, "-c", code, DEMO],
                             capture_output=True, text=True, timeout=60)
        self.assertEqual(out.returncode, 0, out.stderr)
        self.assertIn("--model", out.stdout)
        self.assertIn("--socket", out.stdout)


class AgainstKwarmd(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        cls.daemon = Kwarmd()
        with open(FIXTURE) as f:
            cls.config = json.load(f)

    @classmethod
    def tearDownClass(cls):
        status = cls.daemon.stop()
        assert status == 0, "kwarmd exit status %d" % status

    def client(self):
        return kwarm_client.Client(self.daemon.sock, timeout=300)

    def test_ping_gives_the_version(self):
        with self.client() as c:
            version = c.ping()
        self.assertIsInstance(version, str)
        self.assertRegex(version, r"^\d+\.\d+")

    def test_warmup_then_get_and_stats(self):
        with self.client() as c:
            seen = []
            first = c.warmup(self.config, {"dcp_world": 1},
                             progress=seen.append, name="v32.json")
            for k in ("keys", "compiled", "hits", "failed", "manifest"):
                self.assertIn(k, first)
            self.assertGreater(first["keys"], 0)
            self.assertEqual(first["failed"], 0, first)
            self.assertEqual(first["compiled"] + first["hits"], first["keys"])
            self.assertEqual(len(first["manifest"]), first["keys"])
            self.assertTrue(seen, "no progress callback")
            second = c.warmup(self.config, {"dcp_world": 1}, name="v32.json")
            self.assertEqual(second["hits"], second["keys"])
            self.assertEqual(second["compiled"], 0)

            entry = first["manifest"][0]
            self.assertRegex(entry["digest"], r"^[0-9a-f]{64}$")
            header, cubin = c.get(digest=entry["digest"])
            self.assertEqual(cubin[:4], b"\x7fELF")
            self.assertTrue(header["entry"])
            self.assertEqual(header["family"], entry["family"])

            stats = c.stats()
            for k in ("entries", "bytes", "hits", "misses", "compiles"):
                self.assertIsInstance(stats[k], int, k)
            self.assertGreaterEqual(stats["entries"], first["keys"])
            self.assertGreaterEqual(stats["hits"], 1)

    def test_get_by_family_compiles_and_a_missing_digest_is_an_error(self):
        with self.client() as c:
            header, cubin = c.get(family="dcp_stable_topk",
                                  fields={"topk": 64, "num_candidates": 128},
                                  arch="sm_90")
            self.assertEqual(cubin[:4], b"\x7fELF")
            self.assertEqual(header["family"], "dcp_stable_topk")
            with self.assertRaises(kwarm_client.KwarmError) as err:
                c.get(digest="0" * 64)
            self.assertIn("NOTFOUND", err.exception.code or "")
            # The connection survives an error reply.
            self.assertTrue(c.ping())


class InstantKwarmd(unittest.TestCase):
    """A class's own kwarmd whose compiles are instant
    (KWARM_TEST_INSTANT_COMPILE: the worker stores a stand-in cubin at
    once), and the V3.2 fixture as cls.config."""

    @classmethod
    def setUpClass(cls):
        os.environ["KWARM_TEST_INSTANT_COMPILE"] = "1"
        try:
            cls.daemon = Kwarmd()
        finally:
            del os.environ["KWARM_TEST_INSTANT_COMPILE"]
        with open(FIXTURE) as f:
            cls.config = json.load(f)

    @classmethod
    def tearDownClass(cls):
        assert cls.daemon.stop() == 0


class Administration(InstantKwarmd):
    """ls, pins, unpin, resize and evict_match."""

    def test_pinned_warmup_then_ls_pins_evict_unpin_and_resize(self):
        with kwarm_client.Client(self.daemon.sock, timeout=120) as c:
            w = c.warmup(self.config, {"dcp_world": 1}, name="v32.json", pin="v32")
            self.assertEqual(w["failed"], 0, w)
            n = w["keys"]
            c.get(family="dcp_stable_topk", fields={"topk": 64, "num_candidates": 128})
            every = c.ls()
            self.assertEqual(every["count"], n + 1)
            self.assertEqual(len(every["entries"]), n + 1)
            pinned = c.ls(pinned="v32")
            self.assertEqual(pinned["count"], n)
            self.assertTrue(all("v32" in e["pins"] for e in pinned["entries"]))
            self.assertEqual(c.ls(family="dcp_stable_topk", unpinned=True)["count"], 1)
            self.assertIn("v32", [p["name"] for p in c.pins()["pins"]])
            # Only the unpinned entry goes; the pinned ones stay.
            gone = c.evict_match(unpinned=True)
            self.assertEqual([e["family"] for e in gone["entries"]], ["dcp_stable_topk"])
            self.assertEqual(c.ls()["count"], n)
            c.unpin("v32")
            with self.assertRaises(kwarm_client.KwarmError) as err:
                c.unpin("v32")
            self.assertIn("NOTFOUND", err.exception.code or "")
            self.assertEqual(c.pins()["pins"], [])
            c.resize("2G")
            self.assertEqual(c.stats()["max_size"], 2 << 30)
            with self.assertRaises(kwarm_client.KwarmError):
                c.resize(1000)  # under 1 MiB
            self.assertTrue(c.ping())  # the connection survives both errors

    def test_sizes_parse_as_resize_takes_them(self):
        self.assertEqual(kwarm_client.parse_size("512M"), 512 << 20)
        self.assertEqual(kwarm_client.parse_size("1.5G"), 3 << 29)
        self.assertEqual(kwarm_client.parse_size(4096), 4096)
        with self.assertRaises(ValueError):
            kwarm_client.parse_size("lots")


class Detached(InstantKwarmd):
    """warmup_detached: kwarmd finishes the warmup after the client left."""

    def test_a_detached_warmup_goes_on_after_the_client_leaves(self):
        c = kwarm_client.Client(self.daemon.sock, timeout=120)
        with self.assertRaises(kwarm_client.KwarmError):  # checked first
            c.warmup_detached(self.config, {"dcp_world": 2, "arch": "sm_35"})
        c = kwarm_client.Client(self.daemon.sock, timeout=120)
        first = c.warmup_detached(self.config, {"dcp_world": 2}, name="v32.json")
        total = first["total"] if "total" in first else first["keys"]
        self.assertGreater(total, 0)
        with self.assertRaises(OSError):  # this connection is closed
            c.ping()
        # Every key ends up cached, each compiled once, none failed.
        deadline = time.monotonic() + 60
        with kwarm_client.Client(self.daemon.sock, timeout=120) as c2:
            while c2.stats()["entries"] < total and time.monotonic() < deadline:
                time.sleep(0.05)
            st = c2.stats()
        self.assertEqual(st["entries"], total, st)
        self.assertEqual(st["compiles"], total, st)
        self.assertEqual(st["compile_failures"], 0, st)


class NoDaemon(unittest.TestCase):
    """The client's own errors name the socket and how to start kwarmd."""

    def setUp(self):
        self.dir = tempfile.mkdtemp(prefix="kw-pyerr-")

    def tearDown(self):
        shutil.rmtree(self.dir, ignore_errors=True)

    def expect(self, path, why):
        with self.assertRaises(kwarm_client.NoDaemonError) as err:
            kwarm_client.Client(path)
        e = err.exception
        self.assertIsInstance(e, ConnectionError)
        self.assertIsInstance(e, kwarm_client.KwarmError)
        self.assertIn(path, str(e))
        self.assertIn(why, str(e))
        self.assertIn("kwarmd --socket", str(e))

    def test_a_missing_socket(self):
        self.expect(os.path.join(self.dir, "none.sock"), "no such socket")

    def test_a_file_that_is_not_a_socket(self):
        path = os.path.join(self.dir, "file")
        open(path, "w").close()
        self.expect(path, "not a socket")

    def test_a_socket_nobody_listens_on(self):
        path = os.path.join(self.dir, "dead.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(path)  # bound, never listening: connect is refused
        try:
            self.expect(path, "connection refused")
        finally:
            s.close()


class Loader(unittest.TestCase):
    def test_cuda_loader_needs_a_driver(self):
        try:
            cuda = kwarm_client.Cuda()
        except kwarm_client.NoDriverError as e:  # no libcuda.so.1, or no GPU
            self.assertIn("driver", str(e))
            self.skipTest("no usable CUDA driver on this host: %s" % e)
        self.assertTrue(cuda.ctx.value)


if __name__ == "__main__":
    unittest.main()
