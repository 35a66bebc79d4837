"""kwarm_client: talk to kwarmd from Python, standard library only.

    from kwarm_client import Client, Cuda
    with Client() as c:                       # $KWARM_SOCKET, then defaults
        result = c.warmup(json.load(open("config.json")), {"dcp_world": 2})
        digest = result["manifest"][0]["digest"]
        header, cubin = c.get(digest=digest)  # bytes for cuModuleLoadData
    module, function = Cuda().load(cubin, header["entry"])

Client speaks the protocol: ping, keys, warmup, get, stats, misses,
evict, warmup_detached, and the cache's administration (ls, pins, unpin, resize,
evict_match).  An ERROR reply raises KwarmError (the connection stays
usable); a broken connection raises ConnectionError.  No kwarmd on the
socket raises NoDaemonError (a KwarmError and a ConnectionError), naming
the socket and how to start one.  Cuda, the CUDA driver through ctypes,
is optional: it needs libcuda.so.1 and a GPU only when constructed, and
raises NoDriverError (a KwarmError and a RuntimeError) without them.

The wire format (client/kw_proto.h): a 16-byte little-endian head
(magic "KWRM", version 2, type, header_len, payload_len), a JSON header
object, then an optional binary payload (only in RESULT replies).  keys and
warmup stream their keys and results in PROGRESS frames of up to 256 and
end with a RESULT of counts; this client puts them back into one document.
"""
import errno
import json
import os
import socket
import struct

MAGIC = 0x4D52574B
VERSION = 2
PING, KEYS, WARMUP, GET, STATS, EVICT, MISSES = 1, 2, 3, 4, 5, 6, 7
LS, PINS, UNPIN, RESIZE = 8, 9, 10, 11
PONG, RESULT, PROGRESS, ERROR = 64, 65, 66, 67
HEAD = struct.Struct("<IHHII")
MAX_HEADER = 64 * 1024          # request headers
MAX_REPLY_HEADER = 1024 * 1024  # reply headers (warmup results carry logs)
MAX_PAYLOAD = 64 * 1024 * 1024


class KwarmError(Exception):
    """kwarmd answered with an ERROR frame (code like "KW_ENOTFOUND")."""

    def __init__(self, message, code=None):
        super().__init__(message)
        self.code = code


class NoDaemonError(KwarmError, ConnectionError):
    """No kwarmd answers on the socket (missing, not a socket, refused)."""


class NoDriverError(KwarmError, RuntimeError):
    """Cuda(): no libcuda.so.1 (no NVIDIA driver) or no usable GPU."""


SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_size(size):
    """Bytes of an int or of "512M", "2G", "1.5T" (powers of 1024, as
    kwarm resize takes them)."""
    if isinstance(size, int) and not isinstance(size, bool):
        return size
    text = str(size).strip().upper().removesuffix("B").removesuffix("I")
    unit = text[-1:] if text[-1:] in SIZE_UNITS else ""
    try:
        value = float(text[:len(text) - len(unit)])
    except ValueError:
        raise ValueError("size %r: a number of bytes, or one with K, M, G or T"
                         % (size,)) from None
    return int(value * SIZE_UNITS[unit])


def default_socket():
    """--socket's fallbacks: $KWARM_SOCKET, then /run/kwarm/kwarm.sock for
    root, else $XDG_RUNTIME_DIR/kwarm.sock."""
    if os.environ.get("KWARM_SOCKET"):
        return os.environ["KWARM_SOCKET"]
    run = os.environ.get("XDG_RUNTIME_DIR")
    if os.getuid() != 0 and run:
        return os.path.join(run, "kwarm.sock")
    return "/run/kwarm/kwarm.sock"


def _is_socket(path):
    import stat
    try:
        return stat.S_ISSOCK(os.stat(path).st_mode)
    except OSError:
        return False


class Client:
    """A blocking connection to kwarmd; one request at a time."""

    def __init__(self, path=None, timeout=None):
        self.path = path or default_socket()
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(timeout)
        try:
            self.sock.connect(self.path)
        except (FileNotFoundError, ConnectionRefusedError, NotADirectoryError) as e:
            self.sock.close()
            if isinstance(e, ConnectionRefusedError) and not _is_socket(self.path):
                why, code = "not a socket", "ENOTSOCK"
            elif isinstance(e, ConnectionRefusedError):
                why, code = "connection refused (no kwarmd listening)", "ECONNREFUSED"
            else:
                why, code = "no such socket", "ENOENT"
            raise NoDaemonError("%s: %s; start one with `kwarmd --socket %s`, or "
                                "point KWARM_SOCKET at a running one"
                                % (self.path, why, self.path), code) from None
        except OSError as e:
            self.sock.close()
            raise NoDaemonError("%s: %s" % (self.path, e.strerror or e),
                                errno.errorcode.get(e.errno, "EIO")) from None

    def close(self):
        self.sock.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def _send(self, type_, header=None):
        body = json.dumps(header, separators=(",", ":")).encode() if header else b""
        if len(body) > MAX_HEADER:
            raise ValueError("request header over %d bytes" % MAX_HEADER)
        self.sock.sendall(HEAD.pack(MAGIC, VERSION, type_, len(body), 0) + body)

    def _recv_exact(self, n):
        buf = bytearray()
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("kwarmd closed the connection")
            buf += chunk
        return bytes(buf)

    def _recv(self):
        magic, version, type_, hlen, plen = HEAD.unpack(self._recv_exact(HEAD.size))
        if magic != MAGIC:
            raise ConnectionError("not a kwarmd reply (bad magic)")
        if version != VERSION:
            raise ConnectionError("kwarmd speaks protocol version %d, this client "
                                  "version %d: upgrade the older one"
                                  % (version, VERSION))
        if hlen > MAX_REPLY_HEADER or plen > MAX_PAYLOAD:
            raise ConnectionError("reply exceeds protocol limits")
        header = json.loads(self._recv_exact(hlen)) if hlen else {}
        payload = self._recv_exact(plen) if plen else b""
        if type_ == ERROR:
            raise KwarmError(header.get("error", "error"), header.get("code"))
        return type_, header, payload

    def _call(self, type_, header=None):
        self._send(type_, header)
        return self._recv()

    def ping(self):
        """The daemon's version."""
        return self._call(PING)[1].get("version")

    @staticmethod
    def _model(config, deployment, name, text_config):
        req = {"config": config, "name": name}
        if deployment:
            req["deployment"] = deployment
        if text_config is not None:
            req["text_config"] = text_config
        return req

    def _stream(self, type_, request, member, progress=None):
        """Sends a streamed request; returns (RESULT header, the items of
        every PROGRESS frame's array `member`, in order)."""
        self._send(type_, request)
        items = []
        while True:
            rtype, header, _ = self._recv()
            if rtype != PROGRESS:
                return header, items
            items.extend(header.get(member, []))
            if progress:
                progress(header)

    def keys(self, config, deployment=None, name="config.json", text_config=None):
        """The document of `kwarm keys --json` for a config dict."""
        doc, keys = self._stream(KEYS, self._model(config, deployment, name,
                                                   text_config), "keys")
        if doc.pop("count", None) != len(keys):
            raise ConnectionError("kwarmd streamed a different number of keys "
                                  "than it counted")
        doc["keys"] = keys
        return doc

    def warmup(self, config, deployment=None, progress=None, name="config.json",
               text_config=None, pin=None):
        """Compiles what is missing.  progress(frame) is called per PROGRESS
        frame ({"done", "total", "results": [...]}; kwarmd sends one with no
        results, a heartbeat, when the warmup has been silent for 2 s, so
        the client's timeout bounds silence, not a compile).  Returns the counts
        {"keys", "hits", "remote_hits", "compiled", "failed", "cancelled",
        "seconds"} plus "manifest": every key's result in key order
        {"index", "digest", "family", "arch", "status", and "error"/"log"
        when it failed}.  pin=NAME records the keys as pin set NAME once
        every one is cached (`kwarm warmup --pin`; "pinned" in the result)."""
        req = self._model(config, deployment, name, text_config)
        if pin is not None:
            req["pin"] = pin
        doc, results = self._stream(WARMUP, req, "results", progress)
        doc["manifest"] = sorted(results, key=lambda r: r["index"])
        return doc

    def warmup_detached(self, config, deployment=None, name="config.json",
                        text_config=None, pin=None):
        """Starts a warmup that kwarmd finishes whatever this client does
        ("detach": true; `kwarm warmup --detach`).  kwarmd checks the
        model, deployment and pin first (KwarmError, nothing started);
        returns its first frame's header, a PROGRESS ({"done", "total",
        "results"}) or the RESULT when the warmup ended at once, and then
        closes this connection (connect again for more requests): the
        cache, stats and kwarmd's log tell the outcome."""
        req = self._model(config, deployment, name, text_config)
        req["detach"] = True
        if pin is not None:
            req["pin"] = pin
        self._send(WARMUP, req)
        try:
            return self._recv()[1]
        finally:
            self.close()

    def get(self, digest=None, family=None, fields=None, arch="sm_90", compile=True):
        """(header, cubin bytes) of one kernel; header has "entry" (the
        lowered name for cuModuleGetFunction), "family", "arch", "digest",
        "size" and "compiled".  Give the digest (64 hex digits), or family,
        fields (a dict with every field of the family) and arch.  A missing
        key given by family/fields/arch is compiled first unless
        compile=False; a missing digest cannot be compiled (it names no
        fields): KwarmError with code "KW_ENOTFOUND"."""
        req = {"digest": digest} if digest else {"family": family, "fields": fields,
                                                 "arch": arch}
        if not compile:
            req["compile"] = False
        _, header, payload = self._call(GET, req)
        return header, payload

    def stats(self):
        """The statistics dict of `kwarm stats --json`: the cache's counts
        (entries, bytes, max_size, hits, misses, ...) and kwarmd's."""
        return self._call(STATS)[1]

    def misses(self, since=0):
        """The miss audit: gets kwarmd could not answer from its cache in the
        last `since` seconds (0: all it keeps), each with its nearest cached
        key, the fields that differ and the pins holding that key."""
        doc, items = self._stream(MISSES, {"since": since}, "misses")
        doc["misses"] = items
        return doc

    def evict(self, digest):
        """Removes the entry of digest (64 hex digits); True when there was
        one."""
        return self._call(EVICT, {"digest": digest})[1].get("evicted", False)

    @staticmethod
    def _filter(family, pinned, digest, unpinned, before):
        f = {}
        if family:
            f["family"] = family
        if pinned:
            f["pinned"] = pinned
        if digest:
            f["digest"] = digest
        if unpinned:
            f["unpinned"] = True
        if before:
            f["before"] = before
        return f

    def ls(self, family=None, pinned=None, digest=None, unpinned=False, before=0):
        """The document of `kwarm ls --json`: {"count", "bytes", "entries":
        [{"digest", "family", "arch", "size", "pins", ...}]}, the entries
        matching every criterion given (a family name, a pin set's name, a
        digest or its prefix, only unpinned ones, or last used more than
        `before` seconds ago)."""
        doc, items = self._stream(LS, self._filter(family, pinned, digest,
                                                   unpinned, before), "entries")
        doc["entries"] = items
        return doc

    def evict_match(self, family=None, digest=None, unpinned=False, before=0,
                    force=False):
        """Removes the entries matching the criteria (as ls takes them; at
        least one); pinned ones only with force=True.  Returns the document
        of `kwarm evict --json` with the removed entries under "entries"."""
        req = {"match": self._filter(family, None, digest, unpinned, before)}
        if force:
            req["force"] = True
        doc, items = self._stream(EVICT, req, "entries")
        doc["entries"] = items
        return doc

    def pins(self):
        """The pin sets: the document of `kwarm pins --json`."""
        return self._call(PINS)[1]

    def unpin(self, name):
        """Removes pin set name; KwarmError (KW_ENOTFOUND) when there is
        none.  Returns kwarmd's document of what was unpinned."""
        return self._call(UNPIN, {"name": name})[1]

    def resize(self, max_size):
        """Sets the cache's size limit (bytes, or "2G" and the like, 1 MiB
        to 16 TiB); KwarmError (KW_EROFS) from a read-only kwarmd."""
        return self._call(RESIZE, {"max_size": parse_size(max_size)})[1]


class Cuda:
    """The CUDA driver through ctypes (no dependency): enough to turn a
    cubin into a launchable CUfunction in this process's primary context."""

    def __init__(self, device=0):
        import ctypes
        self.ct = ctypes
        try:
            self.lib = ctypes.CDLL("libcuda.so.1")
        except OSError as e:
            raise NoDriverError("libcuda.so.1 could not be loaded (%s): no NVIDIA "
                                "driver on this machine; Cuda needs one and a GPU"
                                % e, "KW_ENODRIVER") from None
        rc = self.lib.cuInit(0)
        if rc != 0:
            raise NoDriverError("cuInit failed with CUDA error %d: the driver "
                                "sees no usable GPU" % rc, "KW_ENODRIVER")
        dev = ctypes.c_int()
        self._check(self.lib.cuDeviceGet(ctypes.byref(dev), device), "cuDeviceGet")
        self.ctx = ctypes.c_void_p()
        self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(self.ctx), dev),
                    "cuDevicePrimaryCtxRetain")
        self._check(self.lib.cuCtxSetCurrent(self.ctx), "cuCtxSetCurrent")

    def _check(self, rc, what):
        if rc != 0:
            raise RuntimeError("%s failed: CUDA error %d" % (what, rc))

    def load(self, cubin, entry):
        """(module, function) handles; the function is launchable."""
        ct = self.ct
        mod, fn = ct.c_void_p(), ct.c_void_p()
        self._check(self.lib.cuModuleLoadData(ct.byref(mod), ct.c_char_p(cubin)),
                    "cuModuleLoadData")
        self._check(self.lib.cuModuleGetFunction(ct.byref(fn), mod, entry.encode()),
                    "cuModuleGetFunction")
        return mod, fn
