/* daemon_util.h: a real kwarmd for the daemon suites (test_daemon.c,
 * test_daemon_faults.c), and the wire protocol spoken by hand.
 *
 * Include it first: it asks for _GNU_SOURCE (setgroups for the uid test).
 *
 * A daemon is forked and exec'd in a fresh kw_test_mkdtemp() directory
 * (socket DIR/s.sock, cache DIR/cache, stderr DIR/kwarmd.log).  Readiness
 * is the "READY=1" datagram kwarmd sends through sd_notify to the
 * NOTIFY_SOCKET the test binds (DIR/n.sock): no sleeping, every wait is a
 * poll() with a deadline, so no test can hang.  The child gets
 * PR_SET_PDEATHSIG, and the suites' .fini (kwd_cleanup) kills anything
 * left, so a failed or timed-out test leaves no kwarmd behind.
 *
 * kwd_stop() asserts exit status 0 (kwarmd is built with ASan/LSan in the
 * sanitizer build: a report or a leak turns the status non-zero) and that
 * the daemon's stderr holds no sanitizer report.
 */
#ifndef KW_TEST_DAEMON_UTIL_H
#define KW_TEST_DAEMON_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <grp.h>
#include <poll.h>
#include <signal.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kw_err.h"
#include "kw_proto.h"
#include "kw_test_util.h"

#define KWD_READY_MS 20000  /* start to READY=1 */
#define KWD_STOP_MS 10000   /* SIGTERM to exit */
#define KWD_REPLY_MS 60000  /* one reply frame (a compile may precede it) */
#define KWD_MAX_PIDS 16

extern char **environ;

/* ---- time --------------------------------------------------------------- */

static inline int64_t kwd_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void kwd_nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* ---- processes ---------------------------------------------------------- */

/* Every child still to be reaped, for kwd_cleanup(). */
static pid_t kwd_pids[KWD_MAX_PIDS];
/* Every directory made by kwd_init(), for kwd_cleanup(). */
static char kwd_dirs[4][128];

static inline void kwd_track(pid_t pid, bool add)
{
    for (size_t i = 0; i < KWD_MAX_PIDS; i++) {
        if (add && kwd_pids[i] == 0) {
            kwd_pids[i] = pid;
            return;
        }
        if (!add && kwd_pids[i] == pid) {
            kwd_pids[i] = 0;
            return;
        }
    }
    cr_assert(!add, "too many children");
}

/* Waits up to ms for pid to exit (waitpid polled every 5 ms).  True with
 * the wait status in *status once it has; false when it is still running. */
static inline bool kwd_wait_exit(pid_t pid, int ms, int *status)
{
    int64_t deadline = kwd_now_ms() + ms;
    for (;;) {
        pid_t r = waitpid(pid, status, WNOHANG);
        if (r == pid) {
            kwd_track(pid, false);
            return true;
        }
        cr_assert(r == 0 || errno == EINTR, "waitpid(%d): %s", (int)pid,
                  strerror(errno));
        if (kwd_now_ms() >= deadline)
            return false;
        kwd_nap_ms(5);
    }
}

/* Kills every child left and removes every directory (suite .fini). */
static inline void kwd_cleanup(void)
{
    for (size_t i = 0; i < KWD_MAX_PIDS; i++) {
        if (kwd_pids[i] > 0) {
            kill(kwd_pids[i], SIGKILL);
            while (waitpid(kwd_pids[i], NULL, 0) < 0 && errno == EINTR)
                ;
            kwd_pids[i] = 0;
        }
    }
    for (size_t i = 0; i < 4; i++) {
        if (kwd_dirs[i][0] != '\0') {
            kw_test_rmtree(kwd_dirs[i]);
            kwd_dirs[i][0] = '\0';
        }
    }
}

/* ---- one daemon --------------------------------------------------------- */

typedef struct kwd {
    char dir[128];
    char sock[256];
    char cache[256];
    char log[256];
    char notify[256];
    int notify_fd; /* AF_UNIX datagram socket bound at notify */
    pid_t pid;     /* 0 once reaped */
} kwd;

/* Makes the directory and the NOTIFY_SOCKET of a daemon not yet started. */
static inline void kwd_init(kwd *d, const char *tag)
{
    memset(d, 0, sizeof *d);
    cr_assert_eq(kw_test_mkdtemp(d->dir, sizeof d->dir, tag), 0,
                 "mkdtemp: %s", strerror(errno));
    size_t slot = 0;
    while (slot < 4 && kwd_dirs[slot][0] != '\0')
        slot++;
    cr_assert(slot < 4, "too many daemon directories");
    snprintf(kwd_dirs[slot], sizeof kwd_dirs[slot], "%s", d->dir);
    snprintf(d->sock, sizeof d->sock, "%s/s.sock", d->dir);
    snprintf(d->cache, sizeof d->cache, "%s/cache", d->dir);
    snprintf(d->log, sizeof d->log, "%s/kwarmd.log", d->dir);
    snprintf(d->notify, sizeof d->notify, "%s/n.sock", d->dir);
    d->notify_fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    cr_assert(d->notify_fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, d->notify, strlen(d->notify) + 1);
    cr_assert_eq(bind(d->notify_fd, (struct sockaddr *)&sa, sizeof sa), 0,
                 "bind %s: %s", d->notify, strerror(errno));
}

/* Removes the directory of a daemon that is gone, and frees its slot, so
 * that one test may start more than four daemons in turn. */
static inline void kwd_forget(kwd *d)
{
    kw_test_rmtree(d->dir);
    for (size_t i = 0; i < 4; i++)
        if (strcmp(kwd_dirs[i], d->dir) == 0)
            kwd_dirs[i][0] = '\0';
    if (d->notify_fd >= 0)
        close(d->notify_fd);
    d->notify_fd = -1;
}

/* Forks and execs kwarmd with args (NULL-terminated, after argv[0]),
 * NOTIFY_SOCKET=d->notify, stdin and stdout /dev/null, stderr appended to
 * log.  Returns the pid (tracked for kwd_cleanup). */
static inline pid_t kwd_spawn(const kwd *d, const char *const *args,
                              const char *log)
{
    /* KWD_TEST_AS_UID: run kwarmd as that user (gid the same number),
     * from a copy it can reach (kw_test_stage_kwarmd): the build tree may
     * be in root's 0700 home. */
    const char *as = getenv("KWD_TEST_AS_UID");
    uid_t as_uid = as ? (uid_t)strtoul(as, NULL, 10) : 0;
    static char staged[512];
    const char *exe = KW_KWARMD_BIN;
    if (as_uid != 0) {
        cr_assert_eq(kw_test_stage_kwarmd(d->dir, staged, sizeof staged), 0,
                     "staging kwarmd in %s: %s", d->dir, strerror(errno));
        exe = staged;
    }
    const char *argv[32] = {exe};
    size_t n = 1;
    for (; args[n - 1] != NULL; n++) {
        cr_assert(n < 31, "too many kwarmd arguments");
        argv[n] = args[n - 1];
    }
    argv[n] = NULL;
    /* The environment is built before fork: only async-signal-safe calls
     * run in the child. */
    size_t nenv = 0;
    while (environ[nenv] != NULL)
        nenv++;
    char **envp = calloc(nenv + 2, sizeof *envp);
    char notify_env[300];
    cr_assert_not_null(envp);
    snprintf(notify_env, sizeof notify_env, "NOTIFY_SOCKET=%s", d->notify);
    size_t k = 0;
    for (size_t i = 0; i < nenv; i++)
        if (strncmp(environ[i], "NOTIFY_SOCKET=", 14) != 0 &&
            strncmp(environ[i], "LISTEN_", 7) != 0)
            envp[k++] = environ[i];
    envp[k++] = notify_env;
    envp[k] = NULL;
    int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    int nullfd = open("/dev/null", O_RDWR | O_CLOEXEC);
    cr_assert(logfd >= 0 && nullfd >= 0, "open %s: %s", log, strerror(errno));
    pid_t parent = getpid();
    long maxfd = sysconf(_SC_OPEN_MAX);
    if (maxfd < 0 || maxfd > 65536)
        maxfd = 65536;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        /* Dies with the test process, even one killed by a timeout. */
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        if (dup2(nullfd, 0) < 0 || dup2(nullfd, 1) < 0 || dup2(logfd, 2) < 0)
            _exit(127);
        if (as_uid != 0 && (setgroups(0, NULL) < 0 || setgid(as_uid) < 0 ||
                            setuid(as_uid) < 0))
            _exit(126);
        for (long fd = 3; fd < maxfd; fd++) /* criterion's pipes, clients */
            close((int)fd);
        sigset_t none;
        sigemptyset(&none);
        sigprocmask(SIG_SETMASK, &none, NULL);
        execve(exe, (char *const *)argv, envp);
        _exit(127);
    }
    close(logfd);
    close(nullfd);
    free(envp);
    kwd_track(pid, true);
    return pid;
}

/* The daemon's stderr so far (free() it), "" when none. */
static inline char *kwd_log(const char *log)
{
    char *s = kw_test_read_file(log, NULL);
    return s ? s : strdup("");
}

/* Waits for READY=1 on d's notify socket (d->pid must keep running). */
static inline void kwd_wait_ready(kwd *d)
{
    int64_t deadline = kwd_now_ms() + KWD_READY_MS;
    for (;;) {
        int64_t left = deadline - kwd_now_ms();
        int st;
        if (waitpid(d->pid, &st, WNOHANG) == d->pid) {
            kwd_track(d->pid, false);
            d->pid = 0;
            char *log = kwd_log(d->log);
            cr_assert_fail("kwarmd exited before READY=1 (status 0x%x): %s", st, log);
        }
        cr_assert(left > 0, "no READY=1 from kwarmd within %d ms",
                  KWD_READY_MS);
        struct pollfd p = {d->notify_fd, POLLIN, 0};
        int r = poll(&p, 1, left < 100 ? (int)left : 100);
        cr_assert(r >= 0 || errno == EINTR, "poll: %s", strerror(errno));
        if (r <= 0)
            continue;
        char msg[512];
        ssize_t n = recv(d->notify_fd, msg, sizeof msg - 1, 0);
        cr_assert(n >= 0, "recv: %s", strerror(errno));
        msg[n] = '\0';
        if (strncmp(msg, "READY=1", 7) == 0 || strstr(msg, "\nREADY=1") != NULL)
            return;
    }
}

/* Starts kwarmd --socket DIR/s.sock --cache DIR/cache --jobs JOBS plus
 * extra (NULL-terminated, or NULL) and waits until it is ready.  Unless
 * extra names --loops, kwarmd serves from KWD_LOOPS loops, so that every
 * daemon suite runs connections spread over several loop threads (the
 * default on a small machine is one). */
#define KWD_LOOPS "3"
static inline void kwd_start(kwd *d, unsigned jobs, const char *const *extra)
{
    char j[16];
    snprintf(j, sizeof j, "%u", jobs);
    const char *args[24] = {"--socket", d->sock, "--cache", d->cache,
                            "--jobs", j};
    size_t n = 6;
    bool loops = false;
    for (size_t i = 0; extra != NULL && extra[i] != NULL; i++) {
        cr_assert(n < 21);
        loops |= strcmp(extra[i], "--loops") == 0;
        args[n++] = extra[i];
    }
    if (!loops) {
        args[n++] = "--loops";
        args[n++] = KWD_LOOPS;
    }
    args[n] = NULL;
    d->pid = kwd_spawn(d, args, d->log);
    kwd_wait_ready(d);
}

/* Fails the test when the daemon's stderr holds a sanitizer report. */
static inline void kwd_assert_clean_log(const char *log)
{
    char *s = kwd_log(log);
    bool dirty = strstr(s, "AddressSanitizer") != NULL ||
                 strstr(s, "LeakSanitizer") != NULL ||
                 strstr(s, "runtime error:") != NULL;
    cr_expect(!dirty, "sanitizer report from kwarmd:\n%s", s);
    free(s);
}

/* Waits up to ms for d to exit and asserts a clean exit with status 0. */
static inline void kwd_expect_exit0(kwd *d, int ms)
{
    int st = 0;
    bool gone = kwd_wait_exit(d->pid, ms, &st);
    cr_assert(gone, "kwarmd still running %d ms after SIGTERM", ms);
    d->pid = 0;
    char *log = kwd_log(d->log);
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 0,
              "kwarmd exit: %s %d; stderr:\n%s",
              WIFEXITED(st) ? "status" : "signal",
              WIFEXITED(st) ? WEXITSTATUS(st) : WTERMSIG(st), log);
    free(log);
    kwd_assert_clean_log(d->log);
}

/* SIGTERM, then a bounded wait: exit status 0 expected. */
static inline void kwd_stop(kwd *d)
{
    cr_assert(d->pid > 0);
    cr_assert_eq(kill(d->pid, SIGTERM), 0);
    kwd_expect_exit0(d, KWD_STOP_MS);
}

/* ---- one connection ----------------------------------------------------- */

#define KWC_EOF 1

typedef struct kwc {
    int fd;
    uint8_t *buf; /* received, not yet parsed */
    size_t len, cap;
} kwc;

/* One frame received; payload copied out (free with kwr_free). */
typedef struct kwr {
    uint16_t type;
    cJSON *hdr;
    uint8_t *payload;
    size_t payload_len;
} kwr;

static inline void kwr_free(kwr *r)
{
    cJSON_Delete(r->hdr);
    free(r->payload);
    memset(r, 0, sizeof *r);
}

/* Connects to path.  Returns 0, or -errno (c->fd is then -1). */
static inline int kwc_open(kwc *c, const char *path)
{
    memset(c, 0, sizeof *c);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    cr_assert(strlen(path) < sizeof sa.sun_path, "path too long: %s", path);
    memcpy(sa.sun_path, path, strlen(path) + 1);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return -errno;
    if (connect(c->fd, (struct sockaddr *)&sa, sizeof sa) < 0) {
        int e = errno;
        close(c->fd);
        c->fd = -1;
        return -e;
    }
    return 0;
}

/* Connects or fails the test. */
static inline void kwc_must_open(kwc *c, const char *path)
{
    int rc = kwc_open(c, path);
    cr_assert_eq(rc, 0, "connect %s: %s", path, strerror(-rc));
}

static inline void kwc_close(kwc *c)
{
    if (c->fd >= 0)
        close(c->fd);
    free(c->buf);
    memset(c, 0, sizeof *c);
    c->fd = -1;
}

/* Writes n raw bytes.  Returns 0 or -errno (EPIPE: no SIGPIPE). */
static inline int kwc_send_raw(kwc *c, const void *p, size_t n)
{
    const uint8_t *b = p;
    while (n > 0) {
        ssize_t w = send(c->fd, b, n, MSG_NOSIGNAL);
        if (w < 0 && errno == EINTR)
            continue;
        if (w < 0)
            return -errno;
        b += w;
        n -= (size_t)w;
    }
    return 0;
}

/* Encodes and sends one request (hdr NULL: {}).  0 or a negative code. */
static inline int kwc_send(kwc *c, uint16_t type, const cJSON *hdr)
{
    uint8_t *frame = NULL;
    size_t len = 0;
    int rc = kw_proto_encode(type, hdr, NULL, 0, &frame, &len);
    if (rc == 0)
        rc = kwc_send_raw(c, frame, len);
    free(frame);
    return rc;
}

/* Receives one reply frame within ms.  Returns 0 (*r filled), KWC_EOF,
 * -ETIMEDOUT, -errno of a failed read (ECONNRESET...), or the parse error
 * of a frame that is not a valid reply. */
static inline int kwc_recv(kwc *c, kwr *r, int ms)
{
    int64_t deadline = kwd_now_ms() + ms;
    memset(r, 0, sizeof *r);
    for (;;) {
        kw_msg m;
        size_t used = 0;
        int rc = kw_proto_parse_reply(c->buf, c->len, &m, &used);
        if (rc == KW_PROTO_OK) {
            r->type = m.type;
            r->hdr = m.header;
            r->payload_len = m.payload_len;
            if (m.payload_len > 0) {
                r->payload = malloc(m.payload_len);
                cr_assert_not_null(r->payload);
                memcpy(r->payload, m.payload, m.payload_len);
            }
            memmove(c->buf, c->buf + used, c->len - used);
            c->len -= used;
            return 0;
        }
        if (rc != KW_PROTO_MORE)
            return rc;
        if (c->cap - c->len < 65536) {
            size_t ncap = c->cap ? c->cap * 2 : 131072;
            cr_assert(ncap <= 2 * KW_PROTO_MAX_FRAME, "reply buffer overgrown");
            c->buf = realloc(c->buf, ncap);
            cr_assert_not_null(c->buf);
            c->cap = ncap;
        }
        int64_t left = deadline - kwd_now_ms();
        if (left <= 0)
            return -ETIMEDOUT;
        struct pollfd p = {c->fd, POLLIN, 0};
        int pr = poll(&p, 1, (int)left);
        if (pr < 0 && errno == EINTR)
            continue;
        if (pr < 0)
            return -errno;
        if (pr == 0)
            return -ETIMEDOUT;
        ssize_t n = read(c->fd, c->buf + c->len, c->cap - c->len);
        if (n < 0 && errno == EINTR)
            continue;
        if (n < 0)
            return -errno;
        if (n == 0)
            return c->len == 0 ? KWC_EOF : -EPIPE; /* EOF inside a frame */
        c->len += (size_t)n;
    }
}

/* Receives one frame or fails the test. */
static inline kwr kwc_must_recv(kwc *c, int ms)
{
    kwr r;
    int rc = kwc_recv(c, &r, ms);
    cr_assert_eq(rc, 0, "no reply frame: %d (%s)", rc,
                 rc == KWC_EOF ? "EOF" : kw_strerror(rc));
    return r;
}

static inline double kwr_num(const kwr *r, const char *name);

/* Moves the items of the streamed array of PROGRESS frame r (keys:
 * "keys", warmup: "results") to the end of items; returns how many. */
static inline size_t kwc_take_items(kwr *r, cJSON *items)
{
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(r->hdr, "results");
    if (arr == NULL)
        arr = cJSON_GetObjectItemCaseSensitive(r->hdr, "keys");
    if (arr == NULL)
        arr = cJSON_GetObjectItemCaseSensitive(r->hdr, "misses");
    cr_assert(cJSON_IsArray(arr), "PROGRESS frame without results, keys or misses");
    size_t n = 0;
    for (; arr->child != NULL; n++)
        cJSON_AddItemToArray(items, cJSON_DetachItemViaPointer(arr, arr->child));
    return n;
}

/* Sorts streamed warmup results by "index" (each distinct, below their
 * count), as libkwarm does for its manifest. */
static inline void kwc_sort_results(cJSON *items)
{
    int n = cJSON_GetArraySize(items);
    cJSON **slot = calloc((size_t)n + 1, sizeof *slot);
    cr_assert_not_null(slot);
    while (items->child != NULL) {
        cJSON *it = cJSON_DetachItemViaPointer(items, items->child);
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(it, "index");
        cr_assert(cJSON_IsNumber(ix) && ix->valuedouble >= 0 &&
                  ix->valuedouble < n && slot[(int)ix->valuedouble] == NULL,
                  "a result without a distinct index below %d", n);
        slot[(int)ix->valuedouble] = it;
    }
    for (int i = 0; i < n; i++)
        cJSON_AddItemToArray(items, slot[i]);
    free(slot);
}

/* Sends a request and returns its final reply (PONG, RESULT or ERROR).
 * The items streamed in PROGRESS frames before it (protocol 2) are put
 * back into a RESULT, as libkwarm does: a keys reply gets "keys" (and its
 * "count" checked), a warmup "manifest".  *nprogress (may be NULL) gets
 * the number of streamed items, *nframes (may be NULL) of frames. */
static inline kwr kwc_call_frames(kwc *c, uint16_t type, const cJSON *hdr,
                                  size_t *nprogress, size_t *nframes)
{
    int rc = kwc_send(c, type, hdr);
    cr_assert_eq(rc, 0, "send %s: %s", kw_proto_type_name(type),
                 kw_strerror(rc));
    size_t n = 0, frames = 0;
    cJSON *items = cJSON_CreateArray();
    for (;;) {
        kwr r = kwc_must_recv(c, KWD_REPLY_MS);
        if (r.type != KW_PROTO_PROGRESS) {
            if (nprogress)
                *nprogress = n;
            if (nframes)
                *nframes = frames;
            if (r.type == KW_PROTO_RESULT && type == KW_PROTO_KEYS) {
                cr_expect_eq(kwr_num(&r, "count"), (double)n, "keys count");
                cJSON_DeleteItemFromObjectCaseSensitive(r.hdr, "count");
                cJSON_AddItemToObject(r.hdr, "keys", items);
            } else if (r.type == KW_PROTO_RESULT && type == KW_PROTO_WARMUP) {
                kwc_sort_results(items);
                cJSON_AddItemToObject(r.hdr, "manifest", items);
            } else {
                cJSON_Delete(items);
            }
            return r;
        }
        frames++;
        n += kwc_take_items(&r, items);
        kwr_free(&r);
    }
}

static inline kwr kwc_call(kwc *c, uint16_t type, const cJSON *hdr,
                           size_t *nprogress)
{
    return kwc_call_frames(c, type, hdr, nprogress, NULL);
}

/* Text of a reply header, for messages (free() it). */
static inline char *kwr_text(const kwr *r)
{
    char *s = r->hdr ? cJSON_PrintUnformatted(r->hdr) : NULL;
    return s ? s : strdup("(none)");
}

/* Asserts r is of type want, naming the header otherwise. */
static inline void kwr_expect_type(const kwr *r, uint16_t want, const char *what)
{
    if (r->type != want) {
        char *s = kwr_text(r);
        cr_assert_fail("%s: got %s %s, want %s", what, kw_proto_type_name(r->type), s,
                 kw_proto_type_name(want));
    }
}

/* A number member of a header, or -1 when it is missing. */
static inline double kwr_num(const kwr *r, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->hdr, name);
    return cJSON_IsNumber(v) ? v->valuedouble : -1;
}

/* A string member of a header, or "" when it is missing. */
static inline const char *kwr_str(const kwr *r, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->hdr, name);
    return cJSON_IsString(v) ? v->valuestring : "";
}

/* PING must be answered by a PONG carrying a version. */
static inline void kwc_expect_pong(kwc *c, const char *when)
{
    kwr r = kwc_call(c, KW_PROTO_PING, NULL, NULL);
    kwr_expect_type(&r, KW_PROTO_PONG, when);
    cr_expect(kwr_str(&r, "version")[0] != '\0', "%s: PONG without version",
              when);
    kwr_free(&r);
}

/* One STATS counter, asked over c. */
static inline double kwc_stat(kwc *c, const char *name)
{
    kwr r = kwc_call(c, KW_PROTO_STATS, NULL, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "stats");
    double v = kwr_num(&r, name);
    cr_assert(v >= 0, "stats lacks %s", name);
    kwr_free(&r);
    return v;
}

/* kwd_init + kwd_start (jobs, extra) + one connected client c. */
static inline void kwd_up(kwd *d, const char *tag, unsigned jobs,
                          const char *const *extra, kwc *c)
{
    kwd_init(d, tag);
    kwd_start(d, jobs, extra);
    kwc_must_open(c, d->sock);
}

/* Closes c and stops d (exit status 0 expected). */
static inline void kwd_down(kwd *d, kwc *c)
{
    kwc_close(c);
    kwd_stop(d);
}

/* ---- requests ----------------------------------------------------------- */

/* A fixture's JSON (tests/fixtures/NAME). */
static inline cJSON *kwd_fixture(const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, name);
    char *text = kw_test_read_file(path, NULL);
    cr_assert_not_null(text, "%s: %s", path, strerror(errno));
    cJSON *j = cJSON_Parse(text);
    free(text);
    cr_assert_not_null(j, "%s: not JSON", path);
    return j;
}

/* A keys/warmup header: {"config": fixture, "name": path of the fixture,
 * "deployment": {"dcp_world": dcp}} (no deployment when dcp is 0). */
static inline cJSON *kwd_model_hdr(const char *fixture, int dcp)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, fixture);
    cJSON *h = cJSON_CreateObject();
    cJSON_AddItemToObject(h, "config", kwd_fixture(fixture));
    cJSON_AddStringToObject(h, "name", path);
    if (dcp > 0) {
        cJSON *dep = cJSON_AddObjectToObject(h, "deployment");
        cJSON_AddNumberToObject(dep, "dcp_world", dcp);
    }
    return h;
}

/* `kwarm keys --model FIXTURE [--dcp-world DCP] --json`, parsed. */
static inline cJSON *kwd_kwarm_keys(const char *fixture, int dcp)
{
    char path[512], w[16];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, fixture);
    snprintf(w, sizeof w, "%d", dcp);
    const char *argv[] = {KW_KWARM_BIN, "keys", "--model", path, "--json",
                          dcp > 0 ? "--dcp-world" : NULL, w, NULL};
    char *out = NULL, *err = NULL;
    int st = kw_test_run(argv, &out, &err);
    cr_assert_eq(st, 0, "kwarm keys: exit %d: %s", st, err ? err : "");
    cJSON *j = cJSON_Parse(out);
    cr_assert(cJSON_IsObject(j), "kwarm keys --json: not an object: %.200s", out);
    free(out);
    free(err);
    return j;
}

/* Gets key `index` of fixture (at DCP world dcp) by family, fields and
 * arch sm_90, compiling it on a miss, and returns the RESULT (its digest
 * and cubin; kwr_free it).  With KWARM_TEST_INSTANT_COMPILE=N set before
 * kwarmd started, the cubin is N stand-in bytes. */
static inline kwr kwd_get_key(kwc *c, const char *fixture, int dcp, int index)
{
    cJSON *doc = kwd_kwarm_keys(fixture, dcp);
    const cJSON *pick = cJSON_GetArrayItem(
        cJSON_GetObjectItemCaseSensitive(doc, "keys"), index);
    cr_assert_not_null(pick, "%s has no key %d", fixture, index);
    cJSON *g = cJSON_CreateObject();
    cJSON_AddItemToObject(g, "family", cJSON_Duplicate(
        cJSON_GetObjectItemCaseSensitive(pick, "family"), 1));
    cJSON_AddItemToObject(g, "fields", cJSON_Duplicate(
        cJSON_GetObjectItemCaseSensitive(pick, "fields"), 1));
    cJSON_AddStringToObject(g, "arch", "sm_90");
    kwr r = kwc_call(c, KW_PROTO_GET, g, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "get of a fixture's key");
    cJSON_Delete(g);
    cJSON_Delete(doc);
    return r;
}

/* The digests of a "keys" (kwarm keys --json) or "manifest" array, in
 * order: a new cJSON array of strings. */
/* How many keys `kwarm keys` derives for fixture at DCP world dcp (0:
 * the default deployment). */
static inline int kwd_count_keys(const char *fixture, int dcp)
{
    cJSON *doc = kwd_kwarm_keys(fixture, dcp);
    int n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "keys"));
    cJSON_Delete(doc);
    cr_assert(n > 0, "%s: no keys", fixture);
    return n;
}

static inline cJSON *kwd_digests(const cJSON *arr)
{
    cr_assert(cJSON_IsArray(arr), "not an array");
    cJSON *out = cJSON_CreateArray();
    const cJSON *e;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(e, "digest");
        cr_assert(cJSON_IsString(d) && strlen(d->valuestring) == 64,
                  "entry without a digest");
        cJSON_AddItemToArray(out, cJSON_CreateString(d->valuestring));
    }
    return out;
}

/* True when the string arrays a and b hold the same set (each entry of
 * one is somewhere in the other, and the lengths match). */
static inline bool kwd_same_set(const cJSON *a, const cJSON *b)
{
    if (cJSON_GetArraySize(a) != cJSON_GetArraySize(b))
        return false;
    for (int pass = 0; pass < 2; pass++) {
        const cJSON *x = pass ? b : a, *y = pass ? a : b, *e, *f;
        cJSON_ArrayForEach(e, x) {
            bool found = false;
            cJSON_ArrayForEach(f, y) found = found || strcmp(e->valuestring,
                                                             f->valuestring) == 0;
            if (!found)
                return false;
        }
    }
    return true;
}

#endif /* KW_TEST_DAEMON_UTIL_H */
