/* kwarm_compile.c: the compile worker process of warm/'s pool (pool.h).
 *
 * usage: kwarm-compile [--mem-limit BYTES]
 *
 * Reads REQUEST frames on stdin, compiles each key with kw_keys_compile()
 * and answers with one RESPONSE frame on stdout (the protocol is in
 * pool.h); exits 0 when stdin closes.  It is a separate executable, not a
 * fork of kwarmd, because NVRTC compiles in threads of one process do not
 * run in parallel on the GPU host, and so that a compile which crashes,
 * hangs or eats memory takes down only this process.  It links jit/,
 * kernels/ and common/ only.  Diagnostics go to stderr, kwarmd's log.
 */
/* sigaltstack() and SA_ONSTACK are XSI, beyond _POSIX_C_SOURCE. */
#define _XOPEN_SOURCE 700

#include "pool.h"

#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "kw_bytes.h"
#include "kw_err.h"
#include "kw_journal.h"
#include "kw_keys.h"
#include "kw_parse.h"
#include "pool_frame.h"

#if defined(__SANITIZE_ADDRESS__)
#define KW_ASAN 1
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define KW_ASAN 1
#endif
#endif

#ifdef KW_ASAN
#include <sanitizer/common_interface_defs.h>

/* An allocation refused under the memory limit must come back as NULL (and
 * so as NVRTC's out-of-memory), not as ASan's fatal report. */
const char *__asan_default_options(void);
const char *__asan_default_options(void)
{
    return "allocator_may_return_null=1";
}
#endif

/* The priority prefix p ("<3>") when stderr is journald's own stream,
 * else "" (kw_journal_stderr). */
static const char *prio(const char *p)
{
    return kw_journal_stderr() ? p : "";
}

/* What the test hooks of pool.h ask for (all off in production). */
typedef struct hooks {
    bool instant;
    size_t instant_size; /* bytes of the stand-in cubin (256 by default) */
    int crash_family; /* -1: none */
    int hang_family;
    int fail_family;
} hooks;

static int hook_family(const char *var)
{
    const char *v = getenv(var);
    kw_k_family f;
    if (v == NULL || *v == '\0')
        return -1;
    if (kw_keys_family_from_name(v, &f) < 0) {
        fprintf(stderr, "%skwarm-compile: %s=%s names no family\n",
                prio("<4>"), var, v);
        return -1;
    }
    return (int)f;
}

static void hooks_load(hooks *h)
{
    const char *v = getenv("KWARM_TEST_INSTANT_COMPILE");
    /* "1", or the stand-in cubin's size in bytes (256 .. 16 MiB) */
    long size = v != NULL ? strtol(v, NULL, 10) : 0;
    h->instant = size >= 1;
    h->instant_size = size > 256 && size <= (16l << 20) ? (size_t)size : 256;
    h->crash_family = hook_family("KWARM_TEST_CRASH_FAMILY");
    h->hang_family = hook_family("KWARM_TEST_HANG_FAMILY");
    h->fail_family = hook_family("KWARM_TEST_FAIL_FAMILY");
}

/* Reads exactly len bytes from fd.  Returns 1, 0 on EOF before the first
 * byte, or -1 on EOF inside the frame or a read error. */
static int read_full(int fd, void *buf, size_t len)
{
    uint8_t *p = buf;
    size_t got = 0;
    while (got < len) {
        ssize_t n = read(fd, p + got, len - got);
        if (n < 0 && errno == EINTR)
            continue;
        if (n <= 0)
            return n == 0 && got == 0 ? 0 : -1;
        got += (size_t)n;
    }
    return 1;
}

/* Loads NVRTC's builtins library now, before the memory limit: NVRTC
 * dlopen()s it on its first compile, and under a small limit that mapping
 * fails with a message about a missing library instead of one about memory.
 * Loaded here, it counts toward the baseline, as libnvrtc itself does, and
 * the limit applies to what compiles allocate.  Failure is not fatal: the
 * compile then reports NVRTC's own message. */
static void preload_builtins(void)
{
    int major = 0, minor = 0;
    char name[64];
    if (kw_jit_version(&major, &minor) < 0)
        return;
    snprintf(name, sizeof name, "libnvrtc-builtins.so.%d.%d", major, minor);
    if (dlopen(name, RTLD_NOW | RTLD_GLOBAL) == NULL)
        fprintf(stderr, "%skwarm-compile: %s\n", prio("<4>"), dlerror());
}

/* The memory limit, for the fatal-signal handler (set once in main before
 * the handler is installed; the only global state of this program). */
static struct {
    uint64_t limit; /* bytes this process may add to base */
    uint64_t base;  /* bytes counted when the limit was set (ASan only) */
    uint64_t page;
} g_mem;

#ifdef KW_ASAN
/* ASan maps its heap inside a region it reserved at start, so the address
 * space does not grow with malloc and RLIMIT_AS would not bite; the data
 * segment (private writable mappings) does grow.  statm field 6: data. */
#define KW_MEM_RLIMIT RLIMIT_DATA
#define KW_MEM_FIELD 5
#else
#define KW_MEM_RLIMIT RLIMIT_AS
#define KW_MEM_FIELD 0 /* statm field 1: total program size */
#endif

/* Bytes counted against the limit now, from /proc/self/statm, with only
 * async-signal-safe calls (the fatal-signal handler uses it).  0 when it
 * cannot be read. */
static uint64_t mapped_bytes(void)
{
    char buf[128];
    int fd = open("/proc/self/statm", O_RDONLY | O_CLOEXEC);
    if (fd < 0)
        return 0;
    ssize_t n = read(fd, buf, sizeof buf - 1);
    close(fd);
    uint64_t pages = 0;
    int field = 0;
    for (ssize_t i = 0; i < n && field <= KW_MEM_FIELD; i++) {
        if (buf[i] == ' ')
            field++;
        else if (field == KW_MEM_FIELD && buf[i] >= '0' && buf[i] <= '9')
            pages = pages * 10 + (uint64_t)(buf[i] - '0');
    }
    return pages * g_mem.page;
}

/* SIGABRT, SIGSEGV, SIGBUS: NVRTC (LLVM) answers an allocation refused by
 * RLIMIT_AS with "LLVM ERROR: out of memory" and abort(), or sometimes a
 * fault.  When at least half the limit is in use at that moment, the limit
 * is the likely cause: exit with KW__POOL_EXIT_NOMEM, which the pool
 * reports as the memory limit.  Otherwise die of the signal (a crash). */
static void on_fatal(int sig)
{
    uint64_t used = mapped_bytes();
    if (used > g_mem.base && used - g_mem.base >= g_mem.limit / 2)
        _exit(KW__POOL_EXIT_NOMEM);
    raise(sig); /* SA_RESETHAND: the default action now */
}

#ifdef KW_ASAN
/* ASan dies (exit 1) when its own mapping is refused under the limit;
 * apply the same rule as on_fatal() there. */
static void on_asan_death(void)
{
    uint64_t used = mapped_bytes();
    if (used > g_mem.base && used - g_mem.base >= g_mem.limit / 2)
        _exit(KW__POOL_EXIT_NOMEM);
}
#endif

static void catch_fatal_signals(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_fatal;
    sa.sa_flags = SA_RESETHAND | SA_NODEFER;
    sigemptyset(&sa.sa_mask);
#ifdef KW_ASAN
    /* No alternate stack: ASan would map shadow for it, under the limit,
     * inside the handler, and deadlock on its own report. */
    __sanitizer_set_death_callback(on_asan_death);
#else
    static uint8_t alt[64 << 10]; /* a stack overflow still runs on_fatal */
    stack_t ss = {.ss_sp = alt, .ss_size = sizeof alt};
    if (sigaltstack(&ss, NULL) == 0)
        sa.sa_flags |= SA_ONSTACK;
#endif
    sigaction(SIGABRT, &sa, NULL);
    sigaction(SIGSEGV, &sa, NULL);
    sigaction(SIGBUS, &sa, NULL);
}

/* Limits the address space to limit bytes (RLIMIT_AS: what NVRTC maps and
 * allocates beyond the libraries loaded at start).  Under ASan, whose
 * shadow and allocator reservations are terabytes, the data segment is
 * limited instead, to what it holds now plus limit. */
static int set_mem_limit(uint64_t limit)
{
    struct rlimit rl;
    g_mem.page = (uint64_t)sysconf(_SC_PAGESIZE);
    g_mem.limit = limit;
#ifdef KW_ASAN
    g_mem.base = mapped_bytes();
#endif
    rl.rlim_cur = rl.rlim_max = (rlim_t)(g_mem.base + limit);
    if (setrlimit(KW_MEM_RLIMIT, &rl) < 0) {
        fprintf(stderr, "%skwarm-compile: setrlimit: %s\n", prio("<3>"),
                strerror(errno));
        return -1;
    }
    catch_fatal_signals();
    return 0;
}

/* Sends one RESPONSE: rc, seconds, entry, the first KW__POOL_MAX_LOG
 * bytes of log, and the cubin (only when rc == 0).  Allocates nothing, so
 * it still works when the compile ran out of memory.  Returns 0 or -errno. */
static int send_response(int rc, double secs, const char *entry,
                         const char *log, const void *cubin, size_t cubin_len)
{
    kw__pool_resp_head h = {.rc = rc, .seconds = secs};
    size_t elen = entry ? strlen(entry) : 0, llen = log ? strlen(log) : 0;
    if (elen >= KW__POOL_ENTRY_LEN)
        elen = 0; /* callers refuse this case first; never send a bad frame */
    h.entry_len = (uint32_t)elen;
    h.log_len = (uint32_t)(llen > KW__POOL_MAX_LOG ? KW__POOL_MAX_LOG : llen);
    h.cubin_len = rc == 0 ? (uint32_t)cubin_len : 0;
    uint8_t hdr[KW__POOL_HDR_LEN + KW__POOL_RESP_FIXED];
    uint32_t body = KW__POOL_RESP_FIXED + h.entry_len + h.log_len + h.cubin_len;
    kw__pool_hdr_put(hdr, KW__POOL_T_RESPONSE, body);
    kw__pool_resp_put(hdr + KW__POOL_HDR_LEN, &h);
    int e;
    if ((e = kw__pool_write_all(1, hdr, sizeof hdr)) < 0 ||
        (e = kw__pool_write_all(1, entry, h.entry_len)) < 0 ||
        (e = kw__pool_write_all(1, log, h.log_len)) < 0)
        return e;
    return kw__pool_write_all(1, cubin, h.cubin_len);
}

/* The instant test mode: a 256-byte fake cubin, the digest 8 times. */
static int answer_instant(const kw_keys_key *k, size_t size)
{
    uint8_t *fake = malloc(size);
    if (fake == NULL)
        return -1;
    for (size_t i = 0; i < size; i += KW_KEYS_DIGEST_LEN)
        memcpy(fake + i, k->digest,
               size - i < KW_KEYS_DIGEST_LEN ? size - i : KW_KEYS_DIGEST_LEN);
    int rc = send_response(0, 0.0, "kw_test_entry", NULL, fake, size);
    free(fake);
    return rc;
}

#ifndef KW_ASAN
/* Peak address space of this process (VmPeak), in bytes; 0 if unknown. */
static uint64_t vm_peak(void)
{
    FILE *f = fopen("/proc/self/status", "re");
    char line[128];
    unsigned long long kb = 0;
    while (f != NULL && fgets(line, sizeof line, f) != NULL)
        if (sscanf(line, "VmPeak: %llu kB", &kb) == 1)
            break;
    if (f != NULL)
        fclose(f);
    return (uint64_t)kb * 1024u;
}
#endif

/* Whether a failed NVRTC compile (rc) failed for want of memory.  NVRTC
 * says so in many ways under RLIMIT_AS (measured at 64 to 145 MiB):
 * NVRTC_ERROR_OUT_OF_MEMORY (KW_ENOMEM), "catastrophic error: out of
 * memory" in its log, or ptxas printing "Memory allocation failure" on
 * stderr while the log only says NVRTC_ERROR_COMPILATION.  So besides the
 * log, the address space is asked: a peak within an eighth of the limit
 * means the compile ran into it.  (Not under ASan, whose reservations make
 * VmPeak meaningless; its own death is caught in on_asan_death().) */
static bool failed_for_memory(int rc, const char *log)
{
    static const char *const says[] = {"out of memory", "bad_alloc",
                                       "Memory allocation failure",
                                       "Cannot allocate memory"};
    if (rc == KW_ENOMEM)
        return true;
    if (rc != KW_ENVRTC)
        return false;
    for (size_t i = 0; log != NULL && i < sizeof says / sizeof *says; i++)
        if (strstr(log, says[i]) != NULL)
            return true;
#ifdef KW_ASAN
    return false;
#else
    return vm_peak() >= g_mem.limit - g_mem.limit / 8;
#endif
}

/* The hang hook: never answers, and exits once stdin reaches EOF (no
 * request comes while one is in flight, so EOF means the pool is gone).
 * A test that kills the pool's process, SIGKILL included, leaves no
 * worker behind, as pause() did. */
static void hang_until_eof(void)
{
    char b;
    for (;;) {
        ssize_t n = read(0, &b, 1);
        if (n == 0 || (n < 0 && errno != EINTR))
            _exit(0);
    }
}

/* Compiles k and answers.  A compile that failed under the memory limit is
 * reported as KW__POOL_EMEMLIMIT (with NVRTC's log) so the pool names the
 * limit. */
static int answer_compile(const kw_keys_key *k, const hooks *h)
{
    if ((int)k->family == h->crash_family)
        abort();
    if ((int)k->family == h->hang_family)
        hang_until_eof();
    if ((int)k->family == h->fail_family)
        return send_response(KW_ENVRTC, 0.0, NULL,
                             "kwarm-compile: failed by KWARM_TEST_FAIL_FAMILY\n"
                             "(a test hook: no compiler ran)", NULL, 0);
    if (h->instant)
        return answer_instant(k, h->instant_size);
    kw_jit_result r;
    int rc = kw_keys_compile(k, false, &r);
    const char *entry = rc == 0 ? r.lowered_name : NULL;
    if (rc == 0 && (entry == NULL || strlen(entry) >= KW__POOL_ENTRY_LEN))
        rc = KW_ENOSPC;
    if (rc < 0 && failed_for_memory(rc, r.log))
        rc = KW__POOL_EMEMLIMIT;
    const char *log = r.log;
    if (rc == KW_ENOSPC && entry != NULL)
        log = "lowered entry name longer than 255 bytes";
    if (rc == 0 && r.cubin_len > KW__POOL_MAX_CUBIN) {
        rc = KW_E2BIG; /* what the pool would refuse as a broken frame */
        log = "cubin larger than 64 MiB";
    }
    int e = send_response(rc, r.seconds, rc == 0 ? entry : NULL, log,
                          r.cubin, r.cubin_len);
    kw_jit_result_destroy(&r);
    return e;
}

/* Serves requests until stdin closes.  Returns the exit status. */
static int serve(const hooks *h)
{
    for (;;) {
        uint8_t hdr[KW__POOL_HDR_LEN], body[KW__POOL_REQ_LEN];
        uint32_t len;
        kw_keys_key k;
        /* EOF, or a read error (ECONNRESET: the pool died with our last
         * answer unread), at any point of a frame: the pool is gone, and
         * there is nobody to tell.  Only bytes that came and do not parse
         * are a malformed frame. */
        if (read_full(0, hdr, sizeof hdr) != 1)
            return 0;
        bool ok = kw__pool_hdr_parse(hdr, KW__POOL_T_REQUEST, &len) == 0;
        if (ok && read_full(0, body, sizeof body) != 1)
            return 0;
        if (!ok || kw__pool_req_parse(body, &k) < 0) {
            fprintf(stderr, "%skwarm-compile: malformed request frame\n",
                    prio("<3>"));
            return 2;
        }
        if (answer_compile(&k, h) < 0)
            return 0; /* the pool went away mid-answer: nothing to tell */
    }
}

/* Parses argv into *limit.  Returns 0 or -1. */
static int parse_args(int argc, char **argv, uint64_t *limit)
{
    *limit = KW__POOL_DEFAULT_MEM_LIMIT;
    if (argc == 1)
        return 0;
    if (argc != 3 || strcmp(argv[1], "--mem-limit") != 0)
        return -1;
    return kw_parse_u64(argv[2], UINT64_MAX, limit) < 0 || *limit == 0 ? -1
                                                                       : 0;
}

int main(int argc, char **argv)
{
    uint64_t limit;
    hooks h;
    if (parse_args(argc, argv, &limit) < 0) {
        fprintf(stderr, "usage: kwarm-compile [--mem-limit BYTES] "
                        "(run by kwarmd, not by hand)\n");
        return 127;
    }
    /* No PR_SET_PDEATHSIG: it fires when the *thread* that spawned us
     * exits, and warm/ replaces workers from its compile threads.  When
     * kwarmd dies, our stdin reaches EOF (idle) or our answer meets EPIPE
     * (busy), and we exit either way. */
    hooks_load(&h);
    preload_builtins();
    if (set_mem_limit(limit) < 0)
        return 127;
    uint8_t hello[KW__POOL_HDR_LEN + KW__POOL_HELLO_LEN];
    kw__pool_hdr_put(hello, KW__POOL_T_HELLO, KW__POOL_HELLO_LEN);
    kw_le32_put(hello + KW__POOL_HDR_LEN, (uint32_t)getpid());
    if (kw__pool_write_all(1, hello, sizeof hello) < 0)
        return 0;
    return serve(&h);
}
