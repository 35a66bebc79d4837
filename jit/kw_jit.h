/* kw_jit.h: NVRTC compile of one kernel instantiation (prefix kw_jit_).
 *
 * kw_jit_compile() turns CUDA C++ source text (plus named headers) into a
 * cubin for one real GPU architecture, the lowered (mangled) name of one
 * template instantiation, and optionally PTX.  It knows nothing about kernel
 * families or keys: callers render a key into a name expression and extra
 * options, and put kw_jit_default_opts() and kw_jit_version() into their
 * digest so that a new NVRTC or a changed default never reuses an old cubin.
 *
 * Thread safety: every function may be called from any number of threads at
 * once.  Each compile owns its NVRTC program; this module keeps no state.
 */
#ifndef KW_JIT_H
#define KW_JIT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One NVRTC named header: `#include "name"` in the source resolves to text.
 * Both strings are borrowed for the duration of kw_jit_compile(). */
typedef struct kw_jit_header {
    const char *name;
    const char *text;
} kw_jit_header;

/* What to compile.  Every pointer is borrowed for the duration of the call. */
typedef struct kw_jit_req {
    const char *source;      /* program text, NUL-terminated; required */
    const char *source_name; /* its name in logs; NULL means "kw_jit.cu" */
    const kw_jit_header *headers; /* nheaders named headers (may be NULL) */
    size_t nheaders;
    /* Template instantiation (or any __global__ function) to lower, for
     * example "kw_k_foo<16, 1, true>".  NULL when the entry is extern "C":
     * the caller then knows its name and lowered_name stays NULL. */
    const char *name_expr;
    const char *arch; /* "sm_90", "sm_90a", "sm_100f"...; required */
    const char *const *extra_opts; /* nextra options, after the defaults */
    size_t nextra;
    bool want_ptx; /* also return the PTX (for newer GPUs to JIT) */
} kw_jit_req;

/* What a compile produced.  Every pointer is owned by the result and freed by
 * kw_jit_result_destroy().  kw_jit_compile() initialises all fields first, so
 * destroying the result is correct whatever the call returned. */
typedef struct kw_jit_result {
    uint8_t *cubin;     /* ELF image for req->arch; NULL on failure */
    size_t cubin_len;
    char *ptx;          /* NUL-terminated PTX, only when req->want_ptx */
    size_t ptx_len;     /* bytes, without the NUL */
    char *lowered_name; /* mangled entry for cuModuleGetFunction, or NULL */
    /* NVRTC's log, NUL-terminated: warnings on success (NULL when NVRTC
     * printed nothing), the errors on KW_ENVRTC followed by a line naming the
     * failing NVRTC call and its nvrtcGetErrorString(), the reason on
     * KW_EINVAL. */
    char *log;
    double seconds; /* wall time of the whole call */
} kw_jit_result;

/* Compiles req for req->arch with the default options (kw_jit_default_opts)
 * followed by req->extra_opts.
 * Returns 0; KW_ENVRTC when NVRTC rejects the program or an option (the
 * reason is in res->log); KW_EINVAL when req or res is NULL, a required field
 * is missing, or the arch fails kw_jit_arch_valid() (res->log says why);
 * KW_ENOMEM.  Only on 0 are cubin (and ptx, lowered_name as asked) set. */
int kw_jit_compile(const kw_jit_req *req, kw_jit_result *res);

/* Frees everything res owns and zeroes it.  NULL-safe and idempotent. */
void kw_jit_result_destroy(kw_jit_result *res);

/* The linked NVRTC's version (nvrtcVersion), e.g. 13 and 0.  Either pointer
 * may be NULL.  Returns 0 or KW_ENVRTC. */
int kw_jit_version(int *major, int *minor);

/* Stores in opts (up to cap entries) the default NVRTC options that
 * kw_jit_compile() uses for arch, in order, and returns how many there are
 * (which may exceed cap: call with cap 0 to size the array).  The strings are
 * static, except the one that is arch itself: it stays valid as long as arch
 * does.  Callers hash these, in order, into their compile digests. */
size_t kw_jit_default_opts(const char *arch, const char **opts, size_t cap);

/* True when arch names a real architecture that the linked NVRTC can build a
 * cubin for: "sm_" followed by 2 or 3 digits that NVRTC lists in
 * nvrtcGetSupportedArchs(), then optionally 'a' (arch-specific features, for
 * sm_90 and later; runs only on exactly that compute capability) or 'f'
 * (family-specific features, for sm_100 and later; runs on the same family).
 * "compute_90" (virtual, no cubin), "sm_9", "sm_80a", "sm_90f" are false. */
bool kw_jit_arch_valid(const char *arch);

#endif /* KW_JIT_H */
