/* pool.h: the compile worker pool of warm/ (internal, prefix kw__pool_).
 *
 * Why processes: on the GPU host, NVRTC compiles in threads of one process
 * do not run in parallel (8 threads: 1.05x, 8 processes: 6.0x), so every
 * compile runs in a worker process, the helper executable `kwarm-compile`
 * (warm/kwarm_compile.c), which links only jit/, kernels/ and common/.
 * A worker also isolates what a compile can do to its caller: it runs under
 * a memory limit (RLIMIT_AS) and a time limit, and when it crashes, hangs
 * or runs out of memory only its key fails; the pool kills it, reaps it and
 * starts a new one.
 *
 * Threads: kw__pool_compile() is called from many threads at once (warm/'s
 * own compile threads); at most `jobs` compiles run at a time and further
 * callers wait for a free worker.  kw__pool_cancel() may be called from any
 * thread (not from a signal handler: it takes a mutex).  start and stop are
 * not concurrent with anything else on the same pool.
 *
 * Each worker talks to the pool over one socketpair, its end being the
 * worker's stdin and stdout (a socket rather than pipes: one fd per worker,
 * and send(MSG_NOSIGNAL) makes a dead worker -EPIPE instead of a SIGPIPE in
 * kwarmd).  Every fd the pool opens is O_CLOEXEC and the spawn closes every
 * fd above 2, so a worker holds only its socket (as 0 and 1) and the
 * parent's stderr (its diagnostics go to kwarmd's log), not kwarmd's
 * listening sockets.  Workers run in their own process group, so a ^C in a
 * terminal reaches only the parent.  When the parent dies a worker exits
 * at EOF (idle) or on EPIPE when it answers (busy); PR_SET_PDEATHSIG is
 * not used, since it fires when the spawning *thread* exits.
 *
 * Memory limit: the helper loads NVRTC and its builtins library, then sets
 * RLIMIT_AS to mem_limit (checked: every family compiles under 4 GiB; the
 * biggest, dcp_stable_topk with CUB, peaks near 150 MiB of address space,
 * an idle worker maps about 120 MiB).  NVRTC fails under the limit in many
 * ways (measured from 64 to 145 MiB): NVRTC_ERROR_OUT_OF_MEMORY; "catastrophic
 * error: out of memory" in the log; ptxas printing "Memory allocation
 * failure" on stderr with only NVRTC_ERROR_COMPILATION in the log; or LLVM
 * printing "LLVM ERROR: out of memory" and calling abort().  Never SIGKILL
 * (that is the kernel's OOM killer, which reads as a crash, signal 9).  The
 * helper turns a failed compile whose log says so, or whose VmPeak came
 * within an eighth of the limit, into KW__POOL_EMEMLIMIT (NVRTC's log kept
 * after the reason), and a fatal signal (SIGABRT, SIGSEGV, SIGBUS) with at
 * least half the limit in use into exit status KW__POOL_EXIT_NOMEM, which
 * the pool reports as KW__POOL_EMEMLIMIT too.  In ASan builds the helper
 * limits RLIMIT_DATA above its start-up size instead (ASan's heap lives in
 * address space reserved at start, which RLIMIT_AS cannot see), and ASan's
 * own death under the limit counts as the limit.
 *
 * ---------------------------------------------------------------------------
 * Pipe protocol between the pool and kwarm-compile (version 1)
 *
 * Every frame is a 12-byte header followed by body_len bytes; all integers
 * are little-endian:
 *     u32 magic     KW__POOL_MAGIC ("KWCP")
 *     u16 version   KW__POOL_VERSION
 *     u16 type      KW__POOL_T_*
 *     u32 body_len  exact for HELLO and REQUEST, capped for RESPONSE
 * A reader checks magic, version, type and body_len against its cap before
 * it allocates anything; a bad frame ends the conversation (the helper
 * exits 2, the pool treats the worker as crashed and replaces it).
 *
 * HELLO (helper -> pool, once, as soon as the helper has set its limits):
 *     u32 pid       the helper's pid (a sanity check)
 * REQUEST (pool -> helper; body_len == KW__POOL_REQ_LEN):
 *     u32 family    kw_k_family
 *     u32 nfields   == kw_keys_nfields(family), <= KW_KEYS_MAX_FIELDS
 *     i64 fields[KW_KEYS_MAX_FIELDS]   unused ones are 0
 *     u8  arch[KW_CONFIG_ARCH_LEN]     NUL-terminated within the array
 *     u8  digest[KW_KEYS_DIGEST_LEN]   (used by the instant test mode)
 * RESPONSE (helper -> pool; body_len <= KW__POOL_MAX_RESP):
 *     i32 rc        0 or the negative code of kw_keys_compile()
 *     u64 seconds   IEEE-754 double bits: compile time in the worker
 *     u32 entry_len < KW__POOL_ENTRY_LEN (no NUL sent)
 *     u32 log_len   <= KW__POOL_MAX_LOG (the helper cuts longer logs)
 *     u32 cubin_len <= KW__POOL_MAX_CUBIN; 0 unless rc == 0
 *     entry, log, cubin bytes, in that order
 *     body_len == 24 + entry_len + log_len + cubin_len
 * The helper answers each REQUEST with one RESPONSE, in order, and exits 0
 * when its stdin reaches EOF.  It writes nothing else on stdout.
 *
 * Helper: `kwarm-compile [--mem-limit BYTES]`; exit codes 0 (stdin
 * closed), 2 (malformed request frame), KW__POOL_EXIT_NOMEM (died under the
 * memory limit, see above), 127 (bad arguments, or setrlimit failed).
 *
 * ---------------------------------------------------------------------------
 * Test-only hooks (environment variables the helper reads when it starts,
 * so set them before kw__pool_start(); the pool passes its environment
 * through unchanged).  Never set them in production:
 *   KWARM_TEST_INSTANT_COMPILE=1   answer at once with rc 0, entry
 *       "kw_test_entry" and a 256-byte fake cubin: the key's digest
 *       repeated 8 times (so daemon tests with >10,000 keys stay fast).
 *       A number above 256 (up to 16 MiB) is the fake cubin's size
 *       instead, for tests that need large replies.
 *   KWARM_TEST_CRASH_FAMILY=<name> abort() on a request for that family
 *       (kw_keys_family_name), e.g. "dcp_stable_topk".
 *   KWARM_TEST_HANG_FAMILY=<name>  never answer a request for that
 *       family (for the timeout test); the worker exits when its stdin
 *       closes, so killing the pool's process leaves none behind.
 *   KWARM_TEST_FAIL_FAMILY=<name>  answer a request for that family as a
 *       failed compile (KW_ENVRTC) with a two-line log, as NVRTC's would
 *       be: how a failure's reason travels, without a broken compiler.
 */
#ifndef KW_WARM_POOL_H
#define KW_WARM_POOL_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#include "kw_keys.h"

#define KW__POOL_MAGIC 0x5043574bu /* "KWCP" read as little-endian bytes */
#define KW__POOL_VERSION 1
#define KW__POOL_T_HELLO 1
#define KW__POOL_T_REQUEST 2
#define KW__POOL_T_RESPONSE 3
#define KW__POOL_HDR_LEN 12
#define KW__POOL_HELLO_LEN 4
#define KW__POOL_REQ_LEN \
    (8 + 8 * KW_KEYS_MAX_FIELDS + KW_CONFIG_ARCH_LEN + KW_KEYS_DIGEST_LEN)
#define KW__POOL_RESP_FIXED 24
#define KW__POOL_ENTRY_LEN 256          /* lowered name + NUL */
#define KW__POOL_MAX_LOG (64u << 10)    /* first 64 KiB of the NVRTC log */
#define KW__POOL_MAX_CUBIN (64u << 20)  /* == KW_CACHE_MAX_BLOB */
#define KW__POOL_MAX_RESP                                              \
    (KW__POOL_RESP_FIXED + KW__POOL_ENTRY_LEN + KW__POOL_MAX_LOG +     \
     KW__POOL_MAX_CUBIN)
#define KW__POOL_EXIT_NOMEM 75

#define KW__POOL_DEFAULT_TIMEOUT_MS 120000u          /* --compile-timeout */
#define KW__POOL_DEFAULT_MEM_LIMIT (4ull << 30)      /* 4 GiB */
#define KW__POOL_MAX_JOBS 1024u
/* A helper that never says HELLO fails after this or the compile timeout,
 * whichever is shorter. */
#define KW__POOL_HELLO_TIMEOUT_MS 30000u

/* Result codes of a compile that the worker could not finish.  They are
 * OS errno values (distinct from kwarm's own codes <= -1000); res->log
 * starts with a one-line reason that names the limit or the signal (the
 * limits as given: "killed after 0.3 s", "memory limit (64 MiB)"),
 * followed by the worker's own log when it sent one. */
#define KW__POOL_ETIMEOUT (-ETIMEDOUT) /* "compile worker killed after 120 s" */
#define KW__POOL_EMEMLIMIT (-ENOMEM)   /* "compile worker exceeded its memory
                                          limit (4 GiB)" */
#define KW__POOL_ECRASH (-ECHILD)      /* "compile worker crashed (signal 6)",
                                          "... exited with status 3", or it
                                          broke the pipe protocol */
#define KW__POOL_ECANCELED (-ECANCELED) /* kw__pool_cancel() was called */

typedef struct kw__pool kw__pool;

/* Options of kw__pool_start().  Zero fields take their defaults. */
typedef struct kw__pool_opts {
    const char *helper;  /* path of kwarm-compile; NULL: kw__pool_find_helper */
    unsigned jobs;       /* worker processes, 1 .. KW__POOL_MAX_JOBS */
    unsigned timeout_ms; /* per compile; 0: KW__POOL_DEFAULT_TIMEOUT_MS */
    uint64_t mem_limit;  /* bytes, a worker's RLIMIT_AS; 0: 4 GiB */
} kw__pool_opts;

/* What one compile produced.  kw__pool_compile() initialises every field
 * first, so kw__pool_result_destroy() is correct whatever it returned. */
typedef struct kw__pool_result {
    /* 0; KW_ENVRTC (log = NVRTC's log); KW_EINVAL, KW_ENOFAMILY (the key
     * was refused before NVRTC; log says why when jit/ said); KW_ENOSPC,
     * KW_E2BIG (entry name over 255 bytes, cubin over 64 MiB); KW_ENOMEM
     * (this process ran out of memory); KW__POOL_ETIMEOUT,
     * KW__POOL_EMEMLIMIT, KW__POOL_ECRASH (log says which and why);
     * KW__POOL_ECANCELED; or -errno of a failed pipe or spawn. */
    int rc;
    void *cubin;      /* malloc'd ELF image, only when rc == 0; owned */
    size_t cubin_len;
    char entry[KW__POOL_ENTRY_LEN]; /* lowered entry name ("" on failure) */
    char *log;        /* malloc'd NUL-terminated, or NULL; <= 64 KiB; owned */
    double seconds;   /* compile time inside the worker (0 when none ran) */
} kw__pool_result;

/* Finds the kwarm-compile helper: $KWARM_COMPILE_HELPER when set (returned
 * as is, even if it does not exist, so that kw__pool_start() names it in
 * its error), else the first executable of <dir of /proc/self/exe>/
 * kwarm-compile, <that dir>/../libexec/kwarm/kwarm-compile and the
 * configured install path (<libexecdir>/kwarm/kwarm-compile).
 * path: receives the path (cap bytes).  Returns 0, -ENOENT when none is
 * found, or KW_ENOSPC when the path does not fit.  Thread-safe. */
int kw__pool_find_helper(char *path, size_t cap);

/* Starts o->jobs workers now (posix_spawn of `helper --mem-limit BYTES`,
 * a socketpair as its stdin and stdout) and waits for each one's HELLO.
 * out: receives the pool, untouched on error.  o: options (copied; the
 *     helper string need not outlive the call).
 * err, errlen: on failure, a one-line reason such as "compile helper
 *     /x/kwarm-compile: No such file or directory" or "compile helper
 *     /x/kwarm-compile failed before it was ready: exited with status 1".
 * Returns 0; KW_EINVAL (o NULL, jobs 0 or > KW__POOL_MAX_JOBS); -ENOENT,
 * -EACCES (helper missing or not executable); KW__POOL_ECRASH (a worker
 * died or spoke garbage before its HELLO); KW__POOL_ETIMEOUT (no HELLO
 * within KW__POOL_HELLO_TIMEOUT_MS or the compile timeout); KW_ENOMEM;
 * -errno.  Never hangs: every
 * worker started is killed and reaped on failure. */
int kw__pool_start(kw__pool **out, const kw__pool_opts *o, char *err,
                   size_t errlen);

/* Compiles key k in a free worker, blocking until it is done.  Thread-safe:
 * at most `jobs` compiles run at once, further callers wait (in FIFO-ish
 * order of the condition variable) for a free worker.  A worker that
 * crashed, timed out, exceeded its memory limit or broke the protocol is
 * killed, reaped and replaced by a new one before this returns; only this
 * key fails.  If the replacement cannot start, the slot stays empty and
 * the next compile that takes it tries again (and fails with the reason).
 * k: the key (read during the call only).  res: always initialised; the
 * caller owns what it holds and frees it with kw__pool_result_destroy().
 * Returns res->rc (see kw__pool_result); KW_EINVAL at once, costing no
 * worker, when p, k or res is NULL, k->family is out of range or k->arch
 * is not NUL-terminated.  After kw__pool_cancel(), returns
 * KW__POOL_ECANCELED at once, and compiles under way or waiting for a
 * worker return it within milliseconds. */
int kw__pool_compile(kw__pool *p, const kw_keys_key *k, kw__pool_result *res);

/* Frees what r owns (cubin, log) and zeroes it.  NULL-safe, idempotent. */
void kw__pool_result_destroy(kw__pool_result *r);

/* For SIGTERM: from now on every compile (under way, waiting or later)
 * returns KW__POOL_ECANCELED.  Busy workers are SIGKILLed at once (by the
 * thread that runs their compile, woken through an eventfd) and reaped;
 * idle ones stay until kw__pool_stop().  Idempotent; any thread, but not
 * async-signal-safe.  NULL is a no-op. */
void kw__pool_cancel(kw__pool *p);

/* Cancels, waits until no thread is inside kw__pool_compile() (they leave
 * promptly once cancelled), closes every worker's stdin and SIGKILLs and
 * reaps every child, then frees the pool.  No call on p may start once
 * stop has begun.  NULL is a no-op. */
void kw__pool_stop(kw__pool *p);

/* A snapshot of the pool's counters (stats, and tests that wait for a
 * state).  Thread-safe; NULL p or out is a no-op. */
typedef struct kw__pool_counts {
    unsigned live;     /* worker processes running now */
    unsigned busy;     /* callers holding a worker (compiling) */
    unsigned waiting;  /* callers waiting for a free worker */
    uint64_t replaced; /* workers killed or lost and started again */
} kw__pool_counts;
void kw__pool_get_counts(kw__pool *p, kw__pool_counts *out);

#endif /* KW_WARM_POOL_H */
