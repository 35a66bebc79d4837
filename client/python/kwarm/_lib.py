"""libkwarm through ctypes: the launch contract (launch/kw_launch.h) and the
ops handle (client/kw_ops.h).  Standard library only; kwarm.torch builds
on it.

The library is found, in order, at $KWARM_LIBRARY, by
ctypes.util.find_library("kwarm"), then as libkwarm.so.0 on the loader's
path.  The ops' argument names and kinds are read from the library
(kw_launch_nargs / kw_launch_arg_name / kw_launch_arg_kind_of), so Python
never keeps its own copy of the C argument order.
"""
import ctypes
import ctypes.util
import os

KW_ECAPTURE = -1022
KW_EINVAL = -1009

# kw_launch_arg_kind
IN, OUT, OPT_IN, OPT_OUT, SIZE, FLAG = range(6)
KIND_NAMES = ("IN", "OUT", "OPT_IN", "OPT_OUT", "SIZE", "FLAG")

MAX_ARGS = 20      # KW_LAUNCH_MAX_ARGS
MAX_FIELDS = 13    # KW_LAUNCH_MAX_FIELDS
MAX_RATIOS = 16    # KW_LAUNCH_MAX_RATIOS
NOPS = 8           # KW_LAUNCH_NOPS

c_int64_p = ctypes.POINTER(ctypes.c_int64)


class LaunchCall(ctypes.Structure):
    """kw_launch_call: one call's arguments, in the op's order."""
    _fields_ = [("a", ctypes.c_int64 * MAX_ARGS)]


class LaunchGeo(ctypes.Structure):
    """kw_launch_geo."""
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3),
                ("shmem", ctypes.c_uint)]


DEPLOY_INTS = ("index_topk", "index_n_heads", "index_head_dim", "dcp_world",
               "dcp_rank", "dcp_interleave", "pcp", "max_num_batched_tokens",
               "max_num_seqs", "block_size", "block_stride_rows",
               "max_model_len", "num_speculative_tokens")


class LaunchDeploy(ctypes.Structure):
    """kw_launch_deploy: the settings dispatch reads."""
    _fields_ = [(n, ctypes.c_int64) for n in DEPLOY_INTS] + [
        ("ratios_p", ctypes.c_int64 * MAX_RATIOS),
        ("ratios_s", ctypes.c_int64 * MAX_RATIOS),
        ("nratios_p", ctypes.c_size_t), ("nratios_s", ctypes.c_size_t)]

    def as_dict(self):
        d = {n: int(getattr(self, n)) for n in DEPLOY_INTS}
        d["ratios_p"] = [int(v) for v in self.ratios_p[:self.nratios_p]]
        d["ratios_s"] = [int(v) for v in self.ratios_s[:self.nratios_s]]
        return d


LAUNCH_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_int,
                             c_int64_p, ctypes.POINTER(LaunchGeo),
                             ctypes.POINTER(ctypes.c_void_p), ctypes.c_size_t)
CAPTURING_FN = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t,
                                ctypes.POINTER(ctypes.c_bool))
LOG_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_char_p)
EACH_FN = ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int, c_int64_p,
                           ctypes.c_char_p)


class OpsDevice(ctypes.Structure):
    """kw_ops_device: a stand-in for the GPU."""
    _fields_ = [("ctx", ctypes.c_void_p), ("launch", LAUNCH_FN),
                ("capturing", CAPTURING_FN)]


class OpsOpts(ctypes.Structure):
    """kw_ops_opts."""
    _fields_ = [("socket", ctypes.c_char_p), ("timeout_ms", ctypes.c_int),
                ("config_json", ctypes.c_char_p),
                ("deployment_json", ctypes.c_char_p),
                ("name", ctypes.c_char_p), ("cuda", ctypes.c_void_p),
                ("arch", ctypes.c_char_p),
                ("device", ctypes.POINTER(OpsDevice)),
                ("no_warmup", ctypes.c_bool), ("log", LOG_FN),
                ("log_ctx", ctypes.c_void_p)]


class OpsStats(ctypes.Structure):
    """kw_ops_stats."""
    _fields_ = [("loaded", ctypes.c_uint64), ("runtime_misses", ctypes.c_uint64),
                ("capture_misses", ctypes.c_uint64),
                ("launches", ctypes.c_uint64), ("load_ms", ctypes.c_double)]

    def as_dict(self):
        return {n: getattr(self, n) for n, _ in self._fields_}


def _open():
    """The CDLL of libkwarm, or OSError saying the three places tried."""
    env = os.environ.get("KWARM_LIBRARY")
    if env:
        try:
            return ctypes.CDLL(env)
        except OSError as e:
            raise OSError("libkwarm: $KWARM_LIBRARY=%s does not load: %s"
                          % (env, e)) from None
    found = ctypes.util.find_library("kwarm")
    if found:
        try:
            return ctypes.CDLL(found)
        except OSError:
            pass
    try:
        return ctypes.CDLL("libkwarm.so.0")
    except OSError as e:
        raise OSError(
            "libkwarm not found: $KWARM_LIBRARY is not set, "
            "ctypes.util.find_library('kwarm') found %s, and libkwarm.so.0 "
            "does not load (%s); build it (cmake --build build --target "
            "kwarm_lib) and set KWARM_LIBRARY=/path/to/build/libkwarm.so"
            % (repr(found) if found else "nothing", e)) from None


_PROTOS = {
    # name: (restype, argtypes)
    "kw_launch_nargs": (ctypes.c_size_t, (ctypes.c_int,)),
    "kw_launch_arg_name": (ctypes.c_char_p, (ctypes.c_int, ctypes.c_size_t)),
    "kw_launch_arg_kind_of": (ctypes.c_int, (ctypes.c_int, ctypes.c_size_t)),
    "kw_launch_op_name": (ctypes.c_char_p, (ctypes.c_int,)),
    "kw_launch_op_family": (ctypes.c_int, (ctypes.c_int,)),
    "kw_launch_family_name": (ctypes.c_char_p, (ctypes.c_int,)),
    "kw_launch_nfields": (ctypes.c_size_t, (ctypes.c_int,)),
    "kw_launch_field_name": (ctypes.c_char_p, (ctypes.c_int, ctypes.c_size_t)),
    "kw_ops_load": (ctypes.c_int, (ctypes.POINTER(ctypes.c_void_p),
                                   ctypes.POINTER(OpsOpts), ctypes.c_char_p,
                                   ctypes.c_size_t)),
    "kw_ops_free": (None, (ctypes.c_void_p,)),
    "kw_ops_run": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_int,
                                  ctypes.c_void_p, ctypes.c_void_p)),
    "kw_ops_dispatch": (ctypes.c_int, (ctypes.c_void_p, ctypes.c_int,
                                       ctypes.POINTER(LaunchCall), c_int64_p,
                                       ctypes.POINTER(ctypes.c_bool))),
    "kw_ops_deploy": (ctypes.POINTER(LaunchDeploy), (ctypes.c_void_p,)),
    "kw_launch_table_width": (ctypes.c_int64, (ctypes.POINTER(LaunchDeploy),)),
    "kw_ops_arch": (ctypes.c_char_p, (ctypes.c_void_p,)),
    "kw_ops_stats_get": (None, (ctypes.c_void_p, ctypes.POINTER(OpsStats))),
    "kw_ops_each": (ctypes.c_size_t, (ctypes.c_void_p, EACH_FN, ctypes.c_void_p)),
    "kw_ops_last_error_copy": (None, (ctypes.c_void_p, ctypes.c_char_p,
                                      ctypes.c_size_t)),
    "kw_cuda_open": (ctypes.c_int, (ctypes.POINTER(ctypes.c_void_p), ctypes.c_int,
                                    ctypes.c_char_p, ctypes.c_size_t)),
    "kw_cuda_close": (None, (ctypes.c_void_p,)),
    "kw_err_name": (ctypes.c_char_p, (ctypes.c_int,)),
}


class Lib:
    """libkwarm with the prototypes of the functions kwarm uses."""

    def __init__(self):
        self.cdll = _open()
        missing = []
        for name, (res, args) in _PROTOS.items():
            try:
                f = getattr(self.cdll, name)
            except AttributeError:
                missing.append(name)
                continue
            f.restype, f.argtypes = res, args
            setattr(self, name, f)
        if missing:
            raise OSError("libkwarm at %s lacks %s: it predates the launch "
                          "contract (issue 22); rebuild it"
                          % (self.cdll._name, ", ".join(missing)))
        self.path = self.cdll._name

    def err_name(self, rc):
        return self.kw_err_name(rc).decode()

    def ops(self):
        """[(op name, [(arg name, kind), ...]), ...] in kw_launch_op order."""
        table = []
        for op in range(NOPS):
            name = self.kw_launch_op_name(op)
            if not name:
                raise OSError("libkwarm: kw_launch_op_name(%d) is NULL" % op)
            args = []
            for i in range(self.kw_launch_nargs(op)):
                args.append((self.kw_launch_arg_name(op, i).decode(),
                             self.kw_launch_arg_kind_of(op, i)))
            table.append((name.decode(), args))
        return table

    def fields(self, op, values):
        """{field: value} of op's family for MAX_FIELDS int64 values."""
        fam = self.kw_launch_op_family(op)
        return {self.kw_launch_field_name(fam, i).decode(): int(values[i])
                for i in range(self.kw_launch_nfields(fam))}

    def family_fields(self, fam, values):
        return {self.kw_launch_field_name(fam, i).decode(): int(values[i])
                for i in range(self.kw_launch_nfields(fam))}


_LIB = None


def lib():
    """The process's Lib, opened on first use."""
    global _LIB
    if _LIB is None:
        _LIB = Lib()
    return _LIB
