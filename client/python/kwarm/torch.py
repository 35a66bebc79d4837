"""kwarm.torch: a deployment's kernels as torch custom ops.

    import torch, kwarm.torch
    dep = kwarm.torch.load("config.json", {"dcp_world": 2, "dcp_rank": 1})
    # every key of this rank is now loaded on torch's current device
    pos = torch.ops.kwarm.indexer_topk(logits, None, None, rows, stride, row_end)
    torch.ops.kwarm.indexer_topk_out(logits, None, None, rows, stride, pos, row_end)

load() warms the deployment through kwarmd (compiling what is missing),
fetches and loads every key of this process's rank into the primary
context torch uses, all in one call (kw_ops_load); do it before any CUDA
graph capture.  Importing this module registers eight ops in the torch
namespace `kwarm`, one per kw_launch_op, each in two forms:

  kwarm::NAME      allocating: the op's arguments in the C order
                   (launch/kw_launch.h) without its outputs; returns the
                   outputs (a tuple when there are several).  An optional
                   output (index_conversion's valid_count) becomes a bool
                   `with_NAME`; when false its slot in the tuple holds an
                   empty tensor.
  kwarm::NAME_out  mutating: every argument in the C order, outputs
                   included (Tensor(a!)); allocates nothing, returns None.

Sizes and flags are ints and bools, tensors are CUDA tensors on the
deployment's device, contiguous, with the dtype and exact shape the sizes
give (docs/serving.md lists them).  A wrong dtype, shape, device or
layout raises ValueError naming the argument before anything launches; a
size outside its key's class raises ValueError with libkwarm's message.
Each call launches on torch.cuda.current_stream().  Each op has a fake
implementation, so torch.compile(fullgraph=True) traces it.

A call whose key is not loaded (a runtime miss) is served outside graph
capture: libkwarm fetches it from kwarmd (which compiles it and records
the miss) and loads it, once.  During capture it raises RuntimeError
naming the key and the deployment setting that would have warmed it, and
loads nothing.

The argument names and kinds come from libkwarm at import time
(kw_launch_arg_name / kw_launch_arg_kind_of): what Python adds is the
dtype and shape of each tensor argument, below, and the import fails if
the two disagree.
"""
import ctypes
import hashlib
import json
import logging
import marshal
import os
import struct
import sys
import threading

import torch

from . import _lib

__all__ = ["load", "Deployment", "deployment", "OPS", "SPECS"]

_LOG = logging.getLogger("kwarm")

I32, I64, F32 = torch.int32, torch.int64, torch.float32
FP8 = (torch.uint8,) + ((torch.float8_e4m3fn,)
                        if hasattr(torch, "float8_e4m3fn") else ())

# Per op, the dtype and shape of every tensor argument.  Shapes are Python
# expressions over the op's sizes, `topk` (the deployment's index_topk) and
# `W` (its dcp_world); "*" is a leading dimension of any length.  These are
# docs/spec/kernels.md's arrays.
SPECS = {
    "prefill_chunk_metadata": {
        "query_start_loc": (I32, ("num_reqs + 1",)),
        "seq_lens": (I32, ("num_reqs",)),
        "cu_k": (I32, ("num_reqs + 1",)),
        # an empty slice (stop <= start) writes only token_to_seq
        "ks": (I32, ("max(slice_stop - slice_start, 0)",)),
        "ke": (I32, ("max(slice_stop - slice_start, 0)",)),
        "token_to_seq": (I32, ("total_k",)),
    },
    "compressed_slot_mapping": {
        "slot_mapping": (I64, ("num_tokens",)),
        "query_start_loc": (I32, ("num_reqs + 1",)),
        "seq_lens": (I32, ("num_reqs",)),
        "block_table": (I32, ("num_reqs", "width")),
        "out": (I64, ("num_tokens",)),
    },
    "index_conversion": {
        "req_id": (I32, ("num_rows",)),
        "block_table": (I32, ("num_reqs", "width")),
        "topk_pos": (I32, ("num_rows", "topk")),
        "prefill_req": (I32, ("num_rows",)),
        "workspace_start": (I32, ("num_prefill",)),
        "out": (I32, ("num_rows", "topk")),
        "valid_count": (I32, ("num_rows",)),
    },
    "dcp_pack_topk_candidates": {
        "logits": (F32, ("num_rows", "cols")),
        "topk_local": (I32, ("num_rows", "topk")),
        "row_starts": (I32, ("num_rows",)),
        "packed": (F32, ("num_rows", "topk", "2")),
    },
    "dcp_stable_topk": {
        "gathered": (F32, ("num_rows", "topk * W", "2")),
        "out": (I32, ("num_rows", "topk")),
    },
    "indexer_logits": {
        "q": (FP8, ("num_rows", "heads", "head_dim")),
        "w": (F32, ("num_rows", "heads")),
        "k": (FP8, ("num_k", "head_dim")),
        "k_scale": (F32, ("num_k",)),
        "ks": (I32, ("num_rows",)),
        "ke": (I32, ("num_rows",)),
        "logits": (F32, ("num_rows", "stride")),
    },
    "indexer_topk": {
        "logits": (F32, ("num_rows", "stride")),
        "ks": (I32, ("num_rows",)),
        "ke": (I32, ("num_rows",)),
        "topk_pos": (I32, ("num_rows", "topk")),
        "row_end": (I32, ("num_rows",)),
    },
    "indexer_logits_paged": {
        "q": (FP8, ("num_reqs * next_n", "heads", "head_dim")),
        "w": (F32, ("num_reqs * next_n", "heads")),
        "k_pages": (FP8, ("*", "page_rows", "head_dim")),
        "k_scale_pages": (F32, ("k_pages.shape[0]", "page_rows")),
        "block_table": (I32, ("num_reqs", "width")),
        "row_end": (I32, ("num_reqs * next_n",)),
        "logits": (F32, ("num_reqs * next_n", "max_rows")),
    },
}

# The ops in kw_launch_op order: [(name, [(arg, kind), ...])], from libkwarm.
LIB = _lib.lib()
OPS = LIB.ops()
_TENSOR_KINDS = (_lib.IN, _lib.OUT, _lib.OPT_IN, _lib.OPT_OUT)


def _check_specs():
    """The import fails when Python's table and libkwarm's disagree."""
    for name, args in OPS:
        spec = SPECS.get(name)
        if spec is None:
            raise ImportError("kwarm.torch: libkwarm has op %s, which this "
                              "package does not know" % name)
        tensors = [a for a, k in args if k in _TENSOR_KINDS]
        if sorted(tensors) != sorted(spec):
            raise ImportError(
                "kwarm.torch: op %s: libkwarm's tensor arguments %s differ "
                "from this package's %s" % (name, tensors, sorted(spec)))
    if sorted(SPECS) != sorted(n for n, _ in OPS):
        raise ImportError("kwarm.torch: libkwarm lacks ops %s"
                          % sorted(set(SPECS) - {n for n, _ in OPS}))


_check_specs()

# ---------------------------------------------------------------------------
# Loaded deployments, by device index (-1: a stand-in device, CPU tensors).
# ---------------------------------------------------------------------------
_DEPLOYED = {}


def _fallback(first):
    """The deployment an op checks first's call against when none is on
    first's device: the only one loaded (the device check then names the
    argument), else RuntimeError."""
    if len(_DEPLOYED) == 1:
        return next(iter(_DEPLOYED.values()))
    if not _DEPLOYED:
        raise RuntimeError("kwarm: no deployment loaded; call "
                           "kwarm.torch.load(config, deployment) first")
    raise RuntimeError("kwarm: no deployment loaded on %s (loaded on: %s)"
                       % (getattr(first, "device", first), ", ".join(d.device_name for d in
                                                  _DEPLOYED.values())))


def _fake_deployment(first):
    """The deployment whose settings (topk, W) a fake call reads: the one
    on first's device, else any when all agree (a meta tensor has no
    device of its own), else the error _fallback gives."""
    d = _DEPLOYED.get(first.get_device()) if isinstance(first, torch.Tensor) else None
    if d is not None:
        return d
    deps = list(_DEPLOYED.values())
    if deps and all((x.topk, x.dcp_world) == (deps[0].topk, deps[0].dcp_world)
                    for x in deps):
        return deps[0]
    return _fallback(first)


_TLS = threading.local()


def _call_blocks():
    """This thread's kw_launch_call per op: filled and read within one
    call, so threads never share one."""
    blocks = []
    for _ in OPS:
        c = _lib.LaunchCall()
        blocks.append((c, ctypes.addressof(c)))
    _TLS.blocks = blocks
    return blocks


def _dtype_text(dt):
    if isinstance(dt, tuple):
        return " or ".join(str(d).replace("torch.", "") for d in dt)
    return str(dt).replace("torch.", "")


def _bad(op, arg, t, what, want, dev=None):
    """The ValueError for tensor argument arg of op."""
    if what == "missing":
        return ValueError("kwarm.%s: %s is required (a %s tensor), got None"
                          % (op, arg, _dtype_text(want)))
    if what == "type":
        return ValueError("kwarm.%s: %s must be a tensor, got %s"
                          % (op, arg, type(t).__name__))
    if what == "dtype":
        return ValueError("kwarm.%s: %s must be %s, got %s"
                          % (op, arg, _dtype_text(want), _dtype_text(t.dtype)))
    if what == "shape":
        return ValueError("kwarm.%s: %s must have shape %s, got %s"
                          % (op, arg, want, tuple(t.shape)))
    if what == "layout":
        return ValueError("kwarm.%s: %s must be contiguous (strides %s)"
                          % (op, arg, tuple(t.stride())))
    return ValueError("kwarm.%s: %s is on %s, the deployment on %s"
                      % (op, arg, t.device, dev))


# ---------------------------------------------------------------------------
# Per-op code, generated at import from OPS and SPECS: straight-line checks
# and one struct.pack_into of the whole kw_launch_call, so a call builds no
# ctypes objects (issue 22: 39-44 us when Python builds them per call).
# ---------------------------------------------------------------------------

def _shape_expr(dims, var):
    """(expected shape expression, condition that the shape differs)."""
    if dims[0] == "*":
        rest = "(%s,)" % ", ".join(dims[1:])
        return ("('*', %s)" % ", ".join(dims[1:]),
                "%s.dim() != %d or %s.shape[1:] != %s"
                % (var, len(dims), var, rest))
    tup = "(%s,)" % ", ".join(dims)
    return tup, "%s.shape != %s" % (var, tup)


def _tensor_checks(op, arg, kind, spec, lines, full=True):
    dt, dims = spec
    optional = kind in (_lib.OPT_IN, _lib.OPT_OUT)
    ind = "    "
    if optional:
        lines.append("    if %s is not None:" % arg)
        ind = "        "
    else:
        lines.append("    if %s is None: raise _bad(%r, %r, None, 'missing', %s)"
                     % (arg, op, arg, _DT_NAME[id(dt)]))
    lines.append("%sif not isinstance(%s, _Tensor): raise _bad(%r, %r, %s, "
                 "'type', None)" % (ind, arg, op, arg, arg))
    if isinstance(dt, tuple):
        lines.append("%sif %s.dtype not in %s: raise _bad(%r, %r, %s, 'dtype', %s)"
                     % (ind, arg, _DT_NAME[id(dt)], op, arg, arg, _DT_NAME[id(dt)]))
    else:
        lines.append("%sif %s.dtype is not %s: raise _bad(%r, %r, %s, 'dtype', %s)"
                     % (ind, arg, _DT_NAME[id(dt)], op, arg, arg, _DT_NAME[id(dt)]))
    want, differs = _shape_expr(dims, arg)
    lines.append("%sif %s: raise _bad(%r, %r, %s, 'shape', %s)"
                 % (ind, differs, op, arg, arg, want))
    if full:
        lines.append("%sif not %s.is_contiguous(): raise _bad(%r, %r, %s, "
                     "'layout', None)" % (ind, arg, op, arg, arg))
        lines.append("%sif %s.get_device() != _dev: raise _bad(%r, %r, %s, "
                     "'device', None, _d.device_name)" % (ind, arg, op, arg, arg))


_DT_NAME = {id(I32): "_I32", id(I64): "_I64", id(F32): "_F32", id(FP8): "_FP8"}


def _gen_op(opi, name, args):
    """Source of _out_NAME (the mutating form, every argument), _alloc_NAME
    (the allocating form), _fake_out_NAME and _fake_alloc_NAME."""
    spec = SPECS[name]
    names = [a for a, _ in args]
    first = names[0]
    for arg, (_, dims) in spec.items():
        for dim in dims:
            if dim == "*":
                continue
            unknown = set(compile(dim, "<shape>", "eval").co_names) - set(names) - {
                "topk", "W", "max", "shape"}
            if unknown:
                raise ImportError("kwarm.torch: op %s: the shape of %s names %s, "
                                  "which libkwarm's arguments %s lack"
                                  % (name, arg, sorted(unknown), names))
    outs = [(a, k) for a, k in args if k in (_lib.OUT, _lib.OPT_OUT)]
    alloc_params = []
    for a, k in args:
        if k == _lib.OUT:
            continue
        alloc_params.append("with_" + a if k == _lib.OPT_OUT else a)
    src = []

    def head(lines, fake=False):
        if fake:
            lines.append("    _d = _fake_deployment(%s)" % first)
        else:
            lines.append("    _d = _DEPLOYED.get(%s.get_device()) if isinstance(%s, "
                         "_Tensor) else None" % (first, first))
            lines.append("    if _d is None: _d = _fallback(%s)" % first)
        lines.append("    _dev = _d.device_index; topk = _d.topk; W = _d.dcp_world")

    # The mutating form: checks, one pack, one kw_ops_run.
    body = ["def _out_%s(%s):" % (name, ", ".join(names))]
    head(body)
    for a, k in args:
        if k in _TENSOR_KINDS:
            _tensor_checks(name, a, k, spec[a], body)
    vals = []
    for a, k in args:
        if k in (_lib.IN, _lib.OUT):
            vals.append("%s.data_ptr()" % a)
        elif k in (_lib.OPT_IN, _lib.OPT_OUT):
            vals.append("(0 if %s is None else %s.data_ptr())" % (a, a))
        elif k == _lib.FLAG:
            vals.append("(1 if %s else 0)" % a)
        else:
            vals.append(a)
    body.append("    try: _c, _addr = _TLS.blocks[%d]" % opi)
    body.append("    except AttributeError: _c, _addr = _call_blocks()[%d]" % opi)
    body.append("    _PACK_%d(_c, 0, %s)" % (opi, ", ".join(vals)))
    body.append("    if _dev >= 0 and _GETDEV() != _dev: _rc = _d._run_on_device(%d, _addr)"
                % opi)
    body.append("    else: _rc = _RUN(_d._h, %d, _addr, _STREAM(_dev) if _dev >= 0 else 0)"
                % opi)
    body.append("    if _rc: _d._raise(%d, _rc)" % opi)
    src.append("\n".join(body))

    # The allocating form: outputs from new_empty, then the mutating form.
    def alloc_lines(lines, call):
        for a, k in outs:
            dt, dims = spec[a]
            shape = "(%s,)" % ", ".join(dims)
            if k == _lib.OPT_OUT:
                lines.append("    %s = %s.new_empty(%s if with_%s else (0,), "
                             "dtype=%s)" % (a, first, shape, a, _DT_NAME[id(dt)]))
            else:
                lines.append("    %s = %s.new_empty(%s, dtype=%s)"
                             % (a, first, shape, _DT_NAME[id(dt)]))
        if call:
            cargs = []
            for a, k in args:
                if k == _lib.OPT_OUT:
                    cargs.append("(%s if with_%s else None)" % (a, a))
                else:
                    cargs.append(a)
            lines.append("    _out_%s(%s)" % (name, ", ".join(cargs)))
        ret = ", ".join(a for a, _ in outs)
        lines.append("    return %s" % (ret if len(outs) == 1 else "(%s,)" % ret))

    body = ["def _alloc_%s(%s):" % (name, ", ".join(alloc_params))]
    head(body)
    alloc_lines(body, True)
    src.append("\n".join(body))

    # Fakes: dtype and shape checks only (no device, no launch).
    body = ["def _fake_out_%s(%s):" % (name, ", ".join(names))]
    head(body, True)
    for a, k in args:
        if k in _TENSOR_KINDS:
            _tensor_checks(name, a, k, spec[a], body, full=False)
    body.append("    return None")
    src.append("\n".join(body))

    body = ["def _fake_alloc_%s(%s):" % (name, ", ".join(alloc_params))]
    head(body, True)
    for a, k in args:
        if k in (_lib.IN, _lib.OPT_IN):
            _tensor_checks(name, a, k, spec[a], body, full=False)
    alloc_lines(body, False)
    src.append("\n".join(body))
    return "\n\n".join(src) + "\n"


def _schema(name, args, out_form):
    """The torch schema of one form."""
    params, alias = [], iter("abcdefghijklmnop")
    for a, k in args:
        if k == _lib.IN:
            params.append("Tensor " + a)
        elif k == _lib.OPT_IN:
            params.append("Tensor? " + a)
        elif k == _lib.SIZE:
            params.append("int " + a)
        elif k == _lib.FLAG:
            params.append("bool " + a)
        elif k == _lib.OUT:
            if out_form:
                params.append("Tensor(%s!) %s" % (next(alias), a))
        elif k == _lib.OPT_OUT:
            params.append(("Tensor(%s!)? %s" % (next(alias), a)) if out_form
                          else "bool with_" + a)
    if out_form:
        return "%s_out(%s) -> ()" % (name, ", ".join(params))
    nout = sum(1 for _, k in args if k in (_lib.OUT, _lib.OPT_OUT))
    ret = "Tensor" if nout == 1 else "(%s)" % ", ".join(["Tensor"] * nout)
    return "%s(%s) -> %s" % (name, ", ".join(params), ret)


_NS = {
    "_DEPLOYED": _DEPLOYED, "_fallback": _fallback, "_bad": _bad,
    "_fake_deployment": _fake_deployment,
    "_TLS": _TLS, "_call_blocks": _call_blocks, "_Tensor": torch.Tensor,
    "_I32": I32, "_I64": I64, "_F32": F32, "_FP8": FP8,
    "_RUN": LIB.kw_ops_run,
    "_STREAM": torch._C._cuda_getCurrentRawStream
    if hasattr(torch._C, "_cuda_getCurrentRawStream") else (lambda i: 0),
    "_GETDEV": torch._C._cuda_getDevice
    if hasattr(torch._C, "_cuda_getDevice") else (lambda: -1),
}


def source(op=None):
    """The generated Python of op (every op when None), as executed."""
    names = [n for n, _ in OPS] if op is None else [op]
    return "\n".join(_gen_op(i, n, a) for i, (n, a) in enumerate(OPS) if n in names)


def _cache_dir():
    d = os.environ.get("KWARM_CACHE_DIR")
    if d:
        return d
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),
                                                            ".cache")
    return os.path.join(base, "kwarm")


def _ops_code():
    """The compiled per-op code.  Generating and compiling it costs tens of
    ms, most of a rank's start-up, so the code object is kept (marshal) in
    the cache directory ($KWARM_CACHE_DIR, else $XDG_CACHE_HOME/kwarm or
    ~/.cache/kwarm) under a digest of everything it is made from: the C
    argument table, SPECS, this file and the interpreter's version.  A
    cache that cannot be read or written is only slower."""
    with open(__file__, "rb") as f:
        me = f.read()
    key = hashlib.sha256(repr((OPS, sorted((k, repr(v)) for k, v in SPECS.items()),
                               sys.version, torch.__version__)).encode() + me).hexdigest()
    path = os.path.join(_cache_dir(), "torch-ops-%s.marshal" % key[:32])
    try:
        with open(path, "rb") as f:
            code = marshal.load(f)
        if isinstance(code, type(_ops_code.__code__)):
            return code
    except (OSError, EOFError, ValueError, TypeError):
        pass
    code = compile(source(), "<kwarm.torch ops>", "exec")
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        tmp = "%s.%d.tmp" % (path, os.getpid())
        with open(tmp, "wb") as f:
            marshal.dump(code, f)
        os.replace(tmp, path)
    except OSError:
        pass
    return code


for _i, (_name, _args) in enumerate(OPS):
    _NS["_PACK_%d" % _i] = struct.Struct("=%dq" % len(_args)).pack_into
exec(_ops_code(), _NS)

# Direct entry points (no torch dispatcher): kwarm.torch.direct.NAME_out(...)
# takes the same arguments as torch.ops.kwarm.NAME_out.


class _Direct:
    pass


direct = _Direct()
for _name, _ in OPS:
    setattr(direct, _name, _NS["_alloc_" + _name])
    setattr(direct, _name + "_out", _NS["_out_" + _name])

# ---------------------------------------------------------------------------
# torch.library registration: define + impl (not custom_op: issue 22
# measured 23 us per call for custom_op against 4.5-4.8 us for this).
# ---------------------------------------------------------------------------
_LIBRARY = torch.library.Library("kwarm", "DEF")
SCHEMAS = {}
for _name, _args in OPS:
    for _out in (True, False):
        _s = _schema(_name, _args, _out)
        _op = _name + ("_out" if _out else "")
        SCHEMAS[_op] = _s
        _LIBRARY.define(_s)
        _fn = _NS[("_out_" if _out else "_alloc_") + _name]
        # CPU: tensors of a stand-in deployment (load(stand_in=...)), and
        # the argument checks on hosts without a GPU.
        for _key in ("CUDA", "CPU"):
            _LIBRARY.impl(_op, _fn, _key)
        # The fake implementation, as the Meta kernel that FakeTensorMode
        # and torch.compile run: shapes from the sizes alone.  (register_fake
        # gives the same, at about 1 ms an op of import time for inspect.)
        _LIBRARY.impl(_op, _NS[("_fake_out_" if _out else "_fake_alloc_") + _name],
                      "Meta")


# ---------------------------------------------------------------------------
# Loading.
# ---------------------------------------------------------------------------

class Deployment:
    """One rank's kernels, loaded on one device (kw_ops)."""

    def __init__(self, handle, cuda, device_index, keep):
        self._h = handle
        self._cuda = cuda
        self._keep = keep
        self.device_index = device_index
        self.device_name = "cuda:%d" % device_index if device_index >= 0 \
            else "cpu (stand-in)"
        self._deploy = LIB.kw_ops_deploy(handle)
        d = self._deploy.contents
        self.settings = d.as_dict()
        self.topk = self.settings["index_topk"]
        self.dcp_world = self.settings["dcp_world"]
        self.dcp_rank = self.settings["dcp_rank"]
        self.arch = LIB.kw_ops_arch(handle).decode()

    def table_width(self):
        """The block-table width vLLM allocates for this deployment
        (kw_launch_table_width: spec section 4.3), for index_conversion's
        block_table argument."""
        return int(LIB.kw_launch_table_width(self._deploy))

    def _error(self):
        buf = ctypes.create_string_buffer(1024)
        LIB.kw_ops_last_error_copy(self._h, buf, len(buf))
        return buf.value.decode(errors="replace")

    def _run_on_device(self, op, addr):
        """kw_ops_run with this deployment's device current (tensors on a
        device other than torch's current one, as torch's own ops allow)."""
        with torch.cuda.device(self.device_index):
            return LIB.kw_ops_run(self._h, op, addr,
                                  torch._C._cuda_getCurrentRawStream(self.device_index))

    def _raise(self, op, rc):
        msg = "kwarm.%s: %s (%s)" % (OPS[op][0], self._error(), LIB.err_name(rc))
        if rc == _lib.KW_EINVAL:
            raise ValueError(msg)
        raise RuntimeError(msg)

    def stats(self):
        """kw_ops_stats as a dict: loaded, runtime_misses, capture_misses,
        launches, load_ms."""
        s = _lib.OpsStats()
        LIB.kw_ops_stats_get(self._h, ctypes.byref(s))
        return s.as_dict()

    def keys(self):
        """The loaded keys: [(family, {field: value}, digest)]."""
        out = []

        def each(_ctx, fam, fields, digest):
            out.append((LIB.kw_launch_family_name(fam).decode(),
                        LIB.family_fields(fam, fields), digest.decode()))
        LIB.kw_ops_each(self._h, _lib.EACH_FN(each), None)
        return out

    def dispatch(self, op, *args):
        """(key fields, loaded) of a call of op (a name; the arguments of
        torch.ops.kwarm.OP_out, positionally), without launching."""
        opi = [n for n, _ in OPS].index(op)
        kinds = OPS[opi][1]
        if len(args) != len(kinds):
            raise TypeError("%s takes %d arguments" % (op, len(kinds)))
        call = _lib.LaunchCall()
        for i, ((_, k), v) in enumerate(zip(kinds, args)):
            if k in _TENSOR_KINDS:
                call.a[i] = 0 if v is None else v.data_ptr()
            else:
                call.a[i] = int(v)
        fields = (ctypes.c_int64 * _lib.MAX_FIELDS)()
        loaded = ctypes.c_bool()
        rc = LIB.kw_ops_dispatch(self._h, opi, ctypes.byref(call), fields,
                                 ctypes.byref(loaded))
        if rc:
            self._raise(opi, rc)
        return LIB.fields(opi, fields), bool(loaded.value)

    def use(self):
        """A context manager: the ops use this deployment on its device
        inside the block (another rank's, for example), then the one they
        used before."""
        return _Using(self)

    def close(self):
        """Unloads every kernel (synchronise first)."""
        if self._h:
            if _DEPLOYED.get(self.device_index) is self:
                del _DEPLOYED[self.device_index]
            LIB.kw_ops_free(self._h)
            self._h = None
            if self._cuda:
                LIB.kw_cuda_close(self._cuda)
                self._cuda = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<kwarm.torch.Deployment %s on %s, topk %d, dcp %d/%d>" % (
            self.arch, self.device_name, self.topk, self.dcp_rank,
            self.dcp_world)


class _Using:
    def __init__(self, dep):
        self.dep, self.prev = dep, None

    def __enter__(self):
        self.prev = _DEPLOYED.get(self.dep.device_index)
        _DEPLOYED[self.dep.device_index] = self.dep
        return self.dep

    def __exit__(self, *exc):
        if self.prev is None:
            _DEPLOYED.pop(self.dep.device_index, None)
        else:
            _DEPLOYED[self.dep.device_index] = self.prev


def _text(value, what):
    """JSON text and a name for config / deployment (dict, JSON text, or a
    path)."""
    if value is None:
        return None, None
    if isinstance(value, dict):
        return json.dumps(value), None
    if isinstance(value, (str, os.PathLike)):
        s = os.fspath(value)
        if s.lstrip().startswith("{"):
            return s, None
        with open(s) as f:
            return f.read(), os.path.basename(s)
    raise TypeError("kwarm.torch.load: %s must be a dict, JSON text or a "
                    "path, not %s" % (what, type(value).__name__))


def _device_index(device):
    if device is None:
        return torch.cuda.current_device()
    if isinstance(device, int):
        return device
    d = torch.device(device)
    if d.type != "cuda":
        raise ValueError("kwarm.torch.load: device must be a CUDA device, "
                         "not %s" % d)
    return d.index if d.index is not None else torch.cuda.current_device()


def load(config, deployment=None, socket=None, device=None, *, arch=None,
         name=None, no_warmup=False, timeout_ms=0, stand_in=None, log=None,
         activate=True):
    """Warms `deployment` of `config` through kwarmd and loads every key of
    this rank on `device` (torch's current CUDA device by default), in
    the primary context torch uses.  Returns the Deployment, which the ops
    then use for tensors on that device (a second load() on a device
    replaces the first there).

    config: the model's config.json (dict, JSON text or path).
    deployment: a --deploy object (dict or JSON text or path) naming one
      rank: {"dcp_world": 2, "dcp_rank": 1, ...}; None: the defaults.
    socket: kwarmd's socket (None: $KWARM_SOCKET, then the default).
    arch: the arch to load (None: the device's).
    no_warmup: fetch only, compile nothing.
    stand_in: instead of a GPU, a callable(family, fields, geo) run for
      each launch (tests and dry runs: the ops then take CPU tensors,
      whose pointers libkwarm never dereferences); arch defaults to sm_90.
      Its attribute `capturing`, when true, plays a capturing stream.
    log: a callable(line) for libkwarm's log lines (a runtime miss, once
      per key); None: the "kwarm" logger at WARNING.
    activate: False loads without making the ops use it (see
      Deployment.use(): another rank's kernels in the same process).
    Raises RuntimeError with libkwarm's one-line reason on failure.
    """
    cfg, cfg_name = _text(config, "config")
    dep_json, _ = _text(deployment, "deployment")
    keep = []
    opts = _lib.OpsOpts()
    opts.config_json = cfg.encode()
    opts.deployment_json = dep_json.encode() if dep_json else None
    opts.name = (name or cfg_name or "config.json").encode()
    opts.socket = os.fspath(socket).encode() if socket else None
    opts.timeout_ms = timeout_ms
    opts.no_warmup = bool(no_warmup)
    opts.arch = arch.encode() if arch else None

    logfn = log or (lambda line: _LOG.warning("%s", line))

    def _log(_ctx, line):
        try:
            logfn(line.decode(errors="replace"))
        except Exception:  # a callback must not unwind through C
            _LOG.exception("kwarm log callback failed")
    opts.log = _lib.LOG_FN(_log)
    keep.append(opts.log)

    cuda = None
    if stand_in is not None:
        index = -1

        def _launch(_ctx, fam, fields, geo, _args, _stream):
            try:
                g = geo.contents
                stand_in(LIB.kw_launch_family_name(fam).decode(),
                         LIB.family_fields(fam, fields),
                         {"grid": tuple(g.grid), "block": tuple(g.block),
                          "shmem": g.shmem})
                return 0
            except Exception:
                _LOG.exception("kwarm stand-in launch failed")
                return -1004

        def _capturing(_ctx, _stream, out):
            out[0] = bool(getattr(stand_in, "capturing", False))
            return 0
        dev = _lib.OpsDevice(None, _lib.LAUNCH_FN(_launch),
                             _lib.CAPTURING_FN(_capturing))
        keep += [dev, dev.launch, dev.capturing]
        opts.device = ctypes.pointer(dev)
        if not arch:
            opts.arch = b"sm_90"
    else:
        if not torch.cuda.is_available():
            raise RuntimeError("kwarm.torch.load: torch sees no CUDA device "
                               "(use stand_in= for a dry run)")
        torch.cuda.init()
        index = _device_index(device)
        with torch.cuda.device(index):
            torch.cuda.current_device()
            torch.empty(1, device="cuda:%d" % index)  # torch's context exists
            c = ctypes.c_void_p()
            err = ctypes.create_string_buffer(512)
            rc = LIB.kw_cuda_open(ctypes.byref(c), index, err, len(err))
            if rc:
                raise RuntimeError("kwarm.torch.load: kw_cuda_open(%d): %s (%s)"
                                   % (index, err.value.decode(errors="replace"),
                                      LIB.err_name(rc)))
            cuda = c.value
            opts.cuda = cuda
            h, rc, msg = _ops_load(opts)
    if stand_in is not None:
        h, rc, msg = _ops_load(opts)
    if rc:
        if cuda:
            LIB.kw_cuda_close(cuda)
        raise RuntimeError("kwarm.torch.load: %s (%s)" % (msg, LIB.err_name(rc)))
    dep = Deployment(h, cuda, index, keep)
    if not activate:
        return dep
    old = _DEPLOYED.get(index)
    _DEPLOYED[index] = dep
    if old is not None:
        _LOG.info("kwarm: %r replaces %r", dep, old)
    return dep


def _ops_load(opts):
    h = ctypes.c_void_p()
    err = ctypes.create_string_buffer(2048)
    rc = LIB.kw_ops_load(ctypes.byref(h), ctypes.byref(opts), err, len(err))
    return h.value, rc, err.value.decode(errors="replace")


def deployment(device=None):
    """The Deployment the ops use on device (None: torch's current), or
    None."""
    if device == "stand-in":
        return _DEPLOYED.get(-1)
    return _DEPLOYED.get(_device_index(device))
