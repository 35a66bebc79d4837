/* pool_worker.c: starting, reading from and ending one worker process of
 * the compile pool (pool.h): posix_spawn of the helper, its HELLO, reads
 * under a deadline that a cancel cuts short, and how a dead worker ended.
 */
/* posix_spawn_file_actions_addclosefrom_np() (glibc 2.34) is a GNU
 * extension; it keeps fds that kwarmd holds without O_CLOEXEC (systemd's
 * LISTEN_FDS sockets) out of the workers. */
#define _GNU_SOURCE

#include "pool_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "pool_frame.h"

extern char **environ;

#ifndef KW_POOL_INSTALLED_HELPER
#define KW_POOL_INSTALLED_HELPER "/usr/local/libexec/kwarm/kwarm-compile"
#endif

uint64_t kw__pool_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000u + (uint64_t)ts.tv_nsec / 1000000u;
}

/* Writes "compile worker exceeded its memory limit (4 GiB)" into msg. */
void kw__pool_mem_msg(const kw__pool *p, char *msg, size_t cap)
{
    static const char *const unit[] = {"bytes", "KiB", "MiB", "GiB", "TiB"};
    uint64_t v = p->mem_limit;
    int u = 0;
    while (u < 4 && v >= 1024 && v % 1024 == 0) {
        v /= 1024;
        u++;
    }
    snprintf(msg, cap, "compile worker exceeded its memory limit (%llu %s)",
             (unsigned long long)v, unit[u]);
}

/* Reads exactly len bytes of fd into buf before deadline (kw__pool_now_ms()).
 * Returns 0; KW__POOL_ECANCELED when the pool is cancelled first (checked
 * before the data, so a cancel is seen within one poll); KW__POOL_ETIMEOUT;
 * -EPIPE on EOF; or -errno. */
int kw__pool_recv_full(kw__pool *p, int fd, void *buf, size_t len,
                     uint64_t deadline)
{
    uint8_t *b = buf;
    size_t got = 0;
    while (got < len) {
        if (atomic_load(&p->cancelled))
            return KW__POOL_ECANCELED;
        uint64_t now = kw__pool_now_ms();
        if (now >= deadline)
            return KW__POOL_ETIMEOUT;
        uint64_t wait = deadline - now;
        struct pollfd pf[2] = {{.fd = fd, .events = POLLIN},
                               {.fd = p->cancel_fd, .events = POLLIN}};
        int n = poll(pf, 2, wait > INT_MAX ? INT_MAX : (int)wait);
        if (n < 0 && errno != EINTR)
            return -errno;
        if (n <= 0 || (pf[0].revents == 0))
            continue; /* timeout, EINTR or cancel: the loop head decides */
        ssize_t r = recv(fd, b + got, len - got, MSG_DONTWAIT);
        if (r == 0)
            return -EPIPE;
        if (r < 0 && errno != EAGAIN && errno != EINTR)
            return -errno;
        if (r > 0)
            got += (size_t)r;
    }
    return 0;
}

int kw__pool_find_helper(char *path, size_t cap)
{
    const char *env = getenv("KWARM_COMPILE_HELPER");
    if (env != NULL && *env != '\0')
        return snprintf(path, cap, "%s", env) < (int)cap ? 0 : KW_ENOSPC;
    char exe[PATH_MAX];
    ssize_t n = readlink("/proc/self/exe", exe, sizeof exe - 1);
    char cand[3][PATH_MAX + 64];
    int ncand = 0;
    if (n > 0) {
        exe[n] = '\0';
        char *slash = strrchr(exe, '/');
        if (slash != NULL) {
            *slash = '\0';
            snprintf(cand[ncand++], sizeof cand[0], "%s/kwarm-compile", exe);
            snprintf(cand[ncand++], sizeof cand[0],
                     "%s/../libexec/kwarm/kwarm-compile", exe);
        }
    }
    snprintf(cand[ncand++], sizeof cand[0], "%s", KW_POOL_INSTALLED_HELPER);
    for (int i = 0; i < ncand; i++) {
        if (access(cand[i], X_OK) == 0)
            return snprintf(path, cap, "%s", cand[i]) < (int)cap ? 0
                                                                 : KW_ENOSPC;
    }
    return -ENOENT;
}

/* ------------------------------------------------------------------------
 * Starting and ending workers.  These run on the slot's owner only. */

/* Waits up to grace_ms for pid to exit by itself.  Returns true with
 * *st set when it did (and was reaped). */
static bool reap_within(pid_t pid, unsigned grace_ms, int *st)
{
    uint64_t deadline = kw__pool_now_ms() + grace_ms;
    for (;;) {
        pid_t r = waitpid(pid, st, WNOHANG);
        if (r == pid)
            return true;
        if ((r < 0 && errno != EINTR) || kw__pool_now_ms() >= deadline)
            return false;
        struct timespec ts = {0, 1000000}; /* it is exiting: 1 ms steps */
        nanosleep(&ts, NULL);
    }
}

void kw__pool_slot_end(kw__pool *p, kw__pool_slot *s, unsigned grace_ms,
                       int *status)
{
    int st = 0;
    if (s->fd >= 0)
        close(s->fd);
    s->fd = -1;
    if (s->pid > 0) {
        if (grace_ms == 0 || !reap_within(s->pid, grace_ms, &st)) {
            kill(s->pid, SIGKILL);
            while (waitpid(s->pid, &st, 0) < 0 && errno == EINTR)
                ;
        }
        atomic_fetch_sub(&p->live, 1);
    }
    s->pid = -1;
    if (status != NULL)
        *status = st;
}

int kw__pool_slot_end_crashed(kw__pool *p, kw__pool_slot *s, bool eof,
                              char *msg, size_t cap)
{
    int st;
    /* After EOF the worker is exiting: let it, to learn its own status. */
    kw__pool_slot_end(p, s, eof ? 2000 : 0, &st);
    if (WIFEXITED(st) && WEXITSTATUS(st) == KW__POOL_EXIT_NOMEM) {
        kw__pool_mem_msg(p, msg, cap);
        return KW__POOL_EMEMLIMIT;
    }
    if (!eof)
        snprintf(msg, cap, "compile worker broke the pipe protocol");
    else if (WIFSIGNALED(st))
        snprintf(msg, cap, "compile worker crashed (signal %d)",
                 WTERMSIG(st));
    else
        snprintf(msg, cap, "compile worker exited with status %d",
                 WEXITSTATUS(st));
    return KW__POOL_ECRASH;
}

/* Sets up what the child gets: fd on its stdin and stdout, stderr kept,
 * every other fd closed, its own process group, no blocked signals and
 * the default action for those kwarmd may ignore or catch.  Returns fd,
 * possibly moved above 2 (dup2 onto 0 or 1 clears CLOEXEC only when fd is
 * not already 0 or 1, as when kwarmd starts with stdio closed). */
static int spawn_setup(posix_spawn_file_actions_t *fa, posix_spawnattr_t *at,
                       int fd)
{
    sigset_t none, dfl;
    sigemptyset(&none);
    sigemptyset(&dfl);
    sigaddset(&dfl, SIGPIPE);
    sigaddset(&dfl, SIGTERM);
    sigaddset(&dfl, SIGINT);
    sigaddset(&dfl, SIGHUP);
    if (fd < 3) {
        int hi = fcntl(fd, F_DUPFD_CLOEXEC, 3);
        if (hi >= 0) {
            close(fd);
            fd = hi;
        }
    }
    posix_spawn_file_actions_init(fa);
    posix_spawnattr_init(at);
    posix_spawn_file_actions_adddup2(fa, fd, 0);
    posix_spawn_file_actions_adddup2(fa, fd, 1);
    posix_spawn_file_actions_addclosefrom_np(fa, 3);
    posix_spawnattr_setflags(at, POSIX_SPAWN_SETPGROUP | POSIX_SPAWN_SETSIGMASK |
                                     POSIX_SPAWN_SETSIGDEF);
    posix_spawnattr_setpgroup(at, 0);
    posix_spawnattr_setsigmask(at, &none);
    posix_spawnattr_setsigdefault(at, &dfl);
    return fd;
}

/* The helper's environment: ours, with CUDA_CACHE_DISABLE=1 in place of
 * any setting of it.  NVRTC 13 keeps its own cache of compiles in the
 * driver's compute cache (~/.nv/ComputeCache) when it can start the
 * driver.  Under the helper's address-space limit cuInit fails and that
 * cache is off anyway; saying so keeps NVRTC from loading the driver in
 * every helper, and every compile a real one (the cache is kwarm's).
 * Measured on the H200 host: with that cache, 64 keys compiled again in
 * one process took 0.84 s instead of 6.5 s, which once made in-process
 * compiles look 8x faster than the helpers'.  NULL when out of memory. */
static char **helper_env(void)
{
    static char off[] = "CUDA_CACHE_DISABLE=1";
    size_t n = 0;
    while (environ[n] != NULL)
        n++;
    char **env = kw_malloc((n + 2) * sizeof *env);
    if (env == NULL)
        return NULL;
    size_t k = 0;
    for (size_t i = 0; i < n; i++)
        if (strncmp(environ[i], "CUDA_CACHE_DISABLE=", 19) != 0)
            env[k++] = environ[i];
    env[k++] = off;
    env[k] = NULL;
    return env;
}

/* Spawns one helper into s with its end of a new socketpair as stdin and
 * stdout, in its own process group, with default signal dispositions.
 * Returns 0 or -errno (msg says why). */
static int spawn(kw__pool *p, kw__pool_slot *s, char *msg, size_t cap)
{
    int sv[2], rc;
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, sv) < 0) {
        rc = -errno;
        snprintf(msg, cap, "compile helper: socketpair: %s", strerror(-rc));
        return rc;
    }
    char limit[24];
    snprintf(limit, sizeof limit, "%llu", (unsigned long long)p->mem_limit);
    char *argv[] = {p->helper, "--mem-limit", limit, NULL};
    posix_spawn_file_actions_t fa;
    posix_spawnattr_t at;
    sv[1] = spawn_setup(&fa, &at, sv[1]);
    pid_t pid;
    char **env = helper_env();
    rc = env ? -posix_spawn(&pid, p->helper, &fa, &at, argv, env) : -ENOMEM;
    free(env);
    posix_spawn_file_actions_destroy(&fa);
    posix_spawnattr_destroy(&at);
    close(sv[1]);
    if (rc < 0) {
        close(sv[0]);
        snprintf(msg, cap, "compile helper %s: %s", p->helper, strerror(-rc));
        return rc;
    }
    s->pid = pid;
    s->fd = sv[0];
    atomic_fetch_add(&p->live, 1);
    if (p->started)
        atomic_fetch_add(&p->replaced, 1);
    return 0;
}

int kw__pool_slot_spawn(kw__pool *p, kw__pool_slot *s, char *msg, size_t cap)
{
    return spawn(p, s, msg, cap);
}

int kw__pool_slot_hello(kw__pool *p, kw__pool_slot *s, char *msg, size_t cap)
{
    uint8_t hdr[KW__POOL_HDR_LEN], body[KW__POOL_HELLO_LEN];
    uint32_t len;
    unsigned limit = p->timeout_ms < KW__POOL_HELLO_TIMEOUT_MS
                         ? p->timeout_ms
                         : KW__POOL_HELLO_TIMEOUT_MS;
    uint64_t deadline = kw__pool_now_ms() + limit;
    int rc = kw__pool_recv_full(p, s->fd, hdr, sizeof hdr, deadline);
    if (rc == 0 && kw__pool_hdr_parse(hdr, KW__POOL_T_HELLO, &len) < 0)
        rc = KW_EPROTO;
    if (rc == 0)
        rc = kw__pool_recv_full(p, s->fd, body, sizeof body, deadline);
    if (rc == 0)
        return 0;
    if (rc == KW__POOL_ECANCELED || rc == KW__POOL_ETIMEOUT) {
        kw__pool_slot_end(p, s, 0, NULL);
        if (rc == KW__POOL_ETIMEOUT)
            snprintf(msg, cap, "compile helper %s did not start within %g s",
                     p->helper, limit / 1000.0);
        return rc;
    }
    char why[128];
    rc = kw__pool_slot_end_crashed(p, s, rc == -EPIPE, why, sizeof why);
    /* "compile worker exited with status 127" -> name the helper. */
    snprintf(msg, cap, "compile helper %s failed before it was ready: %s",
             p->helper, why + strlen("compile worker "));
    return rc;
}

int kw__pool_slot_start(kw__pool *p, kw__pool_slot *s, char *msg, size_t cap)
{
    int rc = spawn(p, s, msg, cap);
    return rc < 0 ? rc : kw__pool_slot_hello(p, s, msg, cap);
}

