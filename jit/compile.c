/* compile.c: NVRTC compile of one kernel instantiation (kw_jit.h).
 *
 * nvrtcResult never leaves this file: from_nvrtc() maps it to a kw_err.h
 * code, and nvrtc_fail() records the failing call with nvrtcGetErrorString()
 * in the result's log.  Every compile creates and destroys its own
 * nvrtcProgram and the file has no static mutable data, so concurrent calls
 * share nothing but NVRTC itself, whose API is thread-safe.
 */
#include "kw_jit.h"

#include <limits.h>
#include <nvrtc.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kw_err.h"

#ifndef KW_CUDA_INCLUDE /* set by CMake from KW_CUDA_ROOT */
#define KW_CUDA_INCLUDE "/usr/local/cuda/include"
#endif

/* The defaults after "--gpu-architecture <arch>".  Kept minimal on purpose,
 * since each one is hashed into every digest:
 *  - C++17 explicitly, so a future NVRTC default cannot change the dialect
 *    (and the digests) under us; CCCL needs at least C++17.
 *  - the toolkit and CCCL include directories, so sources can use
 *    <cub/...>, <cuda/std/...> and the CUDA headers.
 * Not set: -default-device (kernels mark device code explicitly; CUB does
 * not need it), -lineinfo/-G (no debug info in cached binaries), fast-math
 * and vectorization flags (a family asks through extra_opts if it wants). */
static const char *const fixed_opts[] = {
    "-std=c++17",
    "-I" KW_CUDA_INCLUDE,
    "-I" KW_CUDA_INCLUDE "/cccl",
};
#define NFIXED (sizeof(fixed_opts) / sizeof(fixed_opts[0]))
#define NDEFAULT (2 + NFIXED) /* "--gpu-architecture", arch, fixed_opts */

static double now_seconds(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Maps an NVRTC failure to our code: only allocation failure is ENOMEM. */
static int from_nvrtc(nvrtcResult r)
{
    if (r == NVRTC_SUCCESS)
        return 0;
    return r == NVRTC_ERROR_OUT_OF_MEMORY ? KW_ENOMEM : KW_ENVRTC;
}

/* Appends text to res->log (which may be NULL), keeping it NUL-terminated.
 * Returns 0 or KW_ENOMEM (the old log is then left as it was). */
static int log_append(kw_jit_result *res, const char *text)
{
    size_t old = res->log ? strlen(res->log) : 0;
    size_t add = strlen(text);
    char *p = realloc(res->log, old + add + 1);
    if (!p)
        return KW_ENOMEM;
    memcpy(p + old, text, add + 1);
    res->log = p;
    return 0;
}

/* Appends one formatted line (a newline is added) to res->log.  A failure to
 * record the message is not reported: the caller is already failing. */
static void log_line(kw_jit_result *res, const char *fmt, ...)
{
    char line[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(line, sizeof(line), fmt, ap);
    va_end(ap);
    if (res->log && res->log[0] && res->log[strlen(res->log) - 1] != '\n')
        (void)log_append(res, "\n");
    (void)log_append(res, line);
    (void)log_append(res, "\n");
}

/* Records that NVRTC call `call` returned r and returns our code for it. */
static int nvrtc_fail(kw_jit_result *res, const char *call, nvrtcResult r)
{
    log_line(res, "%s: %s", call, nvrtcGetErrorString(r));
    return from_nvrtc(r);
}

/* Parses "sm_" + 2-3 digits + optional 'a'/'f'; stores the number and the
 * suffix (0 when none).  Pure syntax, no NVRTC query. */
static bool parse_arch(const char *arch, int *num, char *suffix)
{
    if (!arch || strncmp(arch, "sm_", 3) != 0)
        return false;
    const char *p = arch + 3;
    int n = 0, digits = 0;
    while (*p >= '0' && *p <= '9' && digits < 4) {
        n = n * 10 + (*p++ - '0');
        digits++;
    }
    if (digits < 2 || digits > 3)
        return false;
    *suffix = 0;
    if (*p == 'a' || *p == 'f')
        *suffix = *p++;
    *num = n;
    return *p == '\0';
}

/* NVRTC's supported archs, asked once: kwarmd checks the arch of every
 * get by family and fields, a path that should neither allocate nor call
 * NVRTC each time. */
#define MAX_ARCHS 128
static int g_archs[MAX_ARCHS];
static int g_narchs;
static pthread_once_t g_archs_once = PTHREAD_ONCE_INIT;

static void archs_init_once(void)
{
    int n = 0;
    if (nvrtcGetNumSupportedArchs(&n) != NVRTC_SUCCESS || n <= 0 ||
        n > MAX_ARCHS || nvrtcGetSupportedArchs(g_archs) != NVRTC_SUCCESS)
        return;
    g_narchs = n;
}

/* True when NVRTC lists sm_<num> in nvrtcGetSupportedArchs(). */
static bool nvrtc_supports(int num)
{
    pthread_once(&g_archs_once, archs_init_once);
    for (int i = 0; i < g_narchs; i++)
        if (g_archs[i] == num)
            return true;
    return false;
}

bool kw_jit_arch_valid(const char *arch)
{
    int num;
    char suffix;
    if (!parse_arch(arch, &num, &suffix))
        return false;
    /* 'a' exists from Hopper on, 'f' from Blackwell on (NVRTC 13 rejects
     * sm_80a and sm_90f with a catastrophic "--nv_arch" error). */
    if ((suffix == 'a' && num < 90) || (suffix == 'f' && num < 100))
        return false;
    return nvrtc_supports(num);
}

size_t kw_jit_default_opts(const char *arch, const char **opts, size_t cap)
{
    const char *all[NDEFAULT] = {"--gpu-architecture", arch};
    for (size_t i = 0; i < NFIXED; i++)
        all[2 + i] = fixed_opts[i];
    for (size_t i = 0; i < NDEFAULT && i < cap; i++)
        opts[i] = all[i];
    return NDEFAULT;
}

int kw_jit_version(int *major, int *minor)
{
    int ma = 0, mi = 0;
    if (nvrtcVersion(&ma, &mi) != NVRTC_SUCCESS)
        return KW_ENVRTC;
    if (major)
        *major = ma;
    if (minor)
        *minor = mi;
    return 0;
}

/* Checks what kw_jit_compile() needs before any NVRTC call; explains a
 * rejection in res->log.  Returns 0 or KW_EINVAL. */
static int check_req(const kw_jit_req *req, kw_jit_result *res)
{
    if (!req->source) {
        log_line(res, "kw_jit: no source");
        return KW_EINVAL;
    }
    if (!req->arch || !kw_jit_arch_valid(req->arch)) {
        int ma = 0, mi = 0;
        (void)kw_jit_version(&ma, &mi);
        log_line(res, "kw_jit: arch \"%s\" is not a real architecture that "
                      "NVRTC %d.%d supports (sm_XX[a|f])",
                 req->arch ? req->arch : "(null)", ma, mi);
        return KW_EINVAL;
    }
    if (req->nheaders > INT_MAX || req->nextra > INT_MAX - NDEFAULT ||
        (req->nheaders && !req->headers) || (req->nextra && !req->extra_opts)) {
        log_line(res, "kw_jit: bad header or option list");
        return KW_EINVAL;
    }
    for (size_t i = 0; i < req->nheaders; i++) {
        if (!req->headers[i].name || !req->headers[i].text) {
            log_line(res, "kw_jit: header %zu has no name or text", i);
            return KW_EINVAL;
        }
    }
    return 0;
}

/* Creates the NVRTC program for req, with its named headers.  NVRTC copies
 * the strings, so the temporary pointer arrays are freed here.
 * Returns 0 (with *prog set), KW_ENOMEM or KW_ENVRTC. */
static int create_program(const kw_jit_req *req, kw_jit_result *res,
                          nvrtcProgram *prog)
{
    size_t n = req->nheaders;
    const char **texts = NULL, **names = NULL;
    if (n && (!(texts = malloc(n * sizeof(*texts))) ||
              !(names = malloc(n * sizeof(*names))))) {
        free(texts);
        return KW_ENOMEM;
    }
    for (size_t i = 0; i < n; i++) {
        texts[i] = req->headers[i].text;
        names[i] = req->headers[i].name;
    }
    const char *sname = req->source_name ? req->source_name : "kw_jit.cu";
    nvrtcResult r = nvrtcCreateProgram(prog, req->source, sname, (int)n,
                                       texts, names);
    free(texts);
    free(names);
    return r == NVRTC_SUCCESS ? 0 : nvrtc_fail(res, "nvrtcCreateProgram", r);
}

/* Copies NVRTC's program log into res->log when it is not empty. */
static int take_program_log(nvrtcProgram prog, kw_jit_result *res)
{
    size_t len = 0;
    nvrtcResult r = nvrtcGetProgramLogSize(prog, &len);
    if (r != NVRTC_SUCCESS)
        return nvrtc_fail(res, "nvrtcGetProgramLogSize", r);
    if (len <= 1) /* the size counts the NUL */
        return 0;
    char *text = malloc(len);
    if (!text)
        return KW_ENOMEM;
    int rc;
    if ((r = nvrtcGetProgramLog(prog, text)) != NVRTC_SUCCESS) {
        rc = nvrtc_fail(res, "nvrtcGetProgramLog", r);
    } else {
        text[len - 1] = '\0';
        rc = log_append(res, text);
    }
    free(text);
    return rc;
}

/* Runs nvrtcCompileProgram with the defaults, then req->extra_opts, and
 * always collects the log.  Returns 0, KW_ENVRTC or KW_ENOMEM. */
static int compile_program(nvrtcProgram prog, const kw_jit_req *req,
                           kw_jit_result *res)
{
    size_t n = NDEFAULT + req->nextra;
    const char **opts = malloc(n * sizeof(*opts));
    if (!opts)
        return KW_ENOMEM;
    (void)kw_jit_default_opts(req->arch, opts, NDEFAULT);
    for (size_t i = 0; i < req->nextra; i++)
        opts[NDEFAULT + i] = req->extra_opts[i];
    nvrtcResult r = nvrtcCompileProgram(prog, (int)n, opts);
    free(opts);
    int lrc = take_program_log(prog, res);
    if (r != NVRTC_SUCCESS)
        return nvrtc_fail(res, "nvrtcCompileProgram", r);
    return lrc;
}

/* Copies the cubin, the PTX (when asked) and the lowered name out of a
 * compiled program into res.  Returns 0, KW_ENVRTC or KW_ENOMEM. */
static int take_outputs(nvrtcProgram prog, const kw_jit_req *req,
                        kw_jit_result *res)
{
    size_t len = 0;
    nvrtcResult r = nvrtcGetCUBINSize(prog, &len);
    if (r != NVRTC_SUCCESS)
        return nvrtc_fail(res, "nvrtcGetCUBINSize", r);
    if (len == 0) { /* cannot happen for a real arch; never return empty */
        log_line(res, "kw_jit: NVRTC produced no cubin for %s", req->arch);
        return KW_ENVRTC;
    }
    if (!(res->cubin = malloc(len)))
        return KW_ENOMEM;
    res->cubin_len = len;
    if ((r = nvrtcGetCUBIN(prog, (char *)res->cubin)) != NVRTC_SUCCESS)
        return nvrtc_fail(res, "nvrtcGetCUBIN", r);
    if (req->want_ptx) {
        if ((r = nvrtcGetPTXSize(prog, &len)) != NVRTC_SUCCESS)
            return nvrtc_fail(res, "nvrtcGetPTXSize", r);
        if (!(res->ptx = malloc(len + 1))) /* len counts NVRTC's NUL */
            return KW_ENOMEM;
        if ((r = nvrtcGetPTX(prog, res->ptx)) != NVRTC_SUCCESS)
            return nvrtc_fail(res, "nvrtcGetPTX", r);
        res->ptx[len] = '\0';
        res->ptx_len = strlen(res->ptx);
    }
    if (req->name_expr) {
        const char *lowered = NULL; /* owned by prog */
        r = nvrtcGetLoweredName(prog, req->name_expr, &lowered);
        if (r != NVRTC_SUCCESS)
            return nvrtc_fail(res, "nvrtcGetLoweredName", r);
        if (!(res->lowered_name = strdup(lowered)))
            return KW_ENOMEM;
    }
    return 0;
}

/* Frees the outputs of a failed compile but keeps its log. */
static void drop_outputs(kw_jit_result *res)
{
    char *log = res->log;
    res->log = NULL;
    kw_jit_result_destroy(res);
    res->log = log;
}

int kw_jit_compile(const kw_jit_req *req, kw_jit_result *res)
{
    if (!res)
        return KW_EINVAL;
    memset(res, 0, sizeof(*res));
    if (!req)
        return KW_EINVAL;
    double t0 = now_seconds();
    nvrtcProgram prog = NULL;
    nvrtcResult r;
    int rc;
    if ((rc = check_req(req, res)) < 0)
        goto out;
    if ((rc = create_program(req, res, &prog)) < 0)
        goto out;
    if (req->name_expr &&
        (r = nvrtcAddNameExpression(prog, req->name_expr)) != NVRTC_SUCCESS) {
        rc = nvrtc_fail(res, "nvrtcAddNameExpression", r);
        goto out;
    }
    if ((rc = compile_program(prog, req, res)) < 0)
        goto out;
    rc = take_outputs(prog, req, res);
out:
    if (prog)
        nvrtcDestroyProgram(&prog);
    if (rc < 0)
        drop_outputs(res);
    res->seconds = now_seconds() - t0;
    return rc;
}

void kw_jit_result_destroy(kw_jit_result *res)
{
    if (!res)
        return;
    free(res->cubin);
    free(res->ptx);
    free(res->lowered_name);
    free(res->log);
    memset(res, 0, sizeof(*res));
}
