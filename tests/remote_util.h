/* remote_util.h: a real redis-server for the fleet-tier suites
 * (test_remote.c, test_remote_daemon.c), and a plain hiredis client to look
 * at and tamper with what kwarm stores there.
 *
 * Each test starts its own redis-server on a free loopback port
 * (--port N --bind 127.0.0.1 --save '' --appendonly no --daemonize no),
 * forked and exec'd with PR_SET_PDEATHSIG, waits (bounded) until PING
 * answers, and stops it at the end; the suites' .fini (rds_cleanup) kills
 * anything left.  Suites call rds_require() first: it skips the test when
 * /usr/bin/redis-server is absent.
 */
#ifndef KW_TEST_REMOTE_UTIL_H
#define KW_TEST_REMOTE_UTIL_H

#ifndef _GNU_SOURCE
#define _GNU_SOURCE
#endif

#include <criterion/criterion.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/time.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include <hiredis.h>

#include "kw_test_util.h"

#define RDS_BIN "/usr/bin/redis-server"
#define RDS_READY_MS 10000
#define RDS_MAX 4

typedef struct rds {
    const char *password; /* --requirepass, or NULL */
    unsigned port;
    pid_t pid; /* 0 once reaped */
    char url[64];
} rds;

/* Every redis-server still running, for rds_cleanup(). */
static pid_t rds_pids[RDS_MAX];

static inline int64_t rds_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

static inline void rds_nap_ms(long ms)
{
    struct timespec ts = {ms / 1000, (ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Skips the test when there is no redis-server to run. */
static inline void rds_require(void)
{
    if (access(RDS_BIN, X_OK) != 0)
        cr_skip_test("no %s", RDS_BIN);
}

static inline void rds_track(pid_t pid, bool add)
{
    for (size_t i = 0; i < RDS_MAX; i++)
        if (add ? rds_pids[i] == 0 : rds_pids[i] == pid) {
            rds_pids[i] = add ? pid : 0;
            return;
        }
    cr_assert(!add, "too many redis-servers");
}

/* Kills every redis-server left (suite .fini). */
static inline void rds_cleanup(void)
{
    for (size_t i = 0; i < RDS_MAX; i++)
        if (rds_pids[i] > 0) {
            kill(rds_pids[i], SIGCONT);
            kill(rds_pids[i], SIGKILL);
            while (waitpid(rds_pids[i], NULL, 0) < 0 && errno == EINTR)
                ;
            rds_pids[i] = 0;
        }
}

/* A loopback port nobody listens on now (bound, read, released). */
static inline unsigned rds_free_port(void)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    cr_assert_eq(bind(fd, (struct sockaddr *)&sa, sizeof sa), 0, "bind: %s",
                 strerror(errno));
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&sa, &len), 0);
    close(fd);
    return ntohs(sa.sin_port);
}

/* A connection to s with a 1 s timeout (authenticated when s has a
 * password), or NULL. */
static inline redisContext *rds_connect(const rds *s)
{
    struct timeval tv = {1, 0};
    redisContext *c = redisConnectWithTimeout("127.0.0.1", (int)s->port, tv);
    if (c != NULL && c->err != 0) {
        redisFree(c);
        return NULL;
    }
    if (c != NULL)
        redisSetTimeout(c, tv);
    if (c != NULL && s->password != NULL) {
        redisReply *r = redisCommand(c, "AUTH %s", s->password);
        if (r != NULL)
            freeReplyObject(r);
    }
    return c;
}

/* True when s answers PING. */
static inline bool rds_ping(const rds *s)
{
    redisContext *c = rds_connect(s);
    redisReply *r = c ? redisCommand(c, "PING") : NULL;
    bool ok = r != NULL && r->type == REDIS_REPLY_STATUS;
    if (r)
        freeReplyObject(r);
    if (c)
        redisFree(c);
    return ok;
}

/* Starts redis-server on s->port (a free one when 0) and waits, bounded,
 * until it answers PING. */
static inline void rds_start(rds *s)
{
    if (s->port == 0)
        s->port = rds_free_port();
    snprintf(s->url, sizeof s->url, "redis://127.0.0.1:%u", s->port);
    char port[16];
    snprintf(port, sizeof port, "%u", s->port);
    const char *argv[] = {RDS_BIN, "--port", port, "--bind", "127.0.0.1",
                          "--save", "", "--appendonly", "no",
                          "--daemonize", "no", "--loglevel", "warning",
                          s->password ? "--requirepass" : NULL, s->password,
                          NULL};
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent)
            _exit(127);
        int nullfd = open("/dev/null", O_RDWR);
        if (nullfd < 0 || dup2(nullfd, 0) < 0 || dup2(nullfd, 1) < 0)
            _exit(127);
        for (int fd = 3; fd < 1024; fd++)
            close(fd);
        execv(RDS_BIN, (char *const *)argv);
        _exit(127);
    }
    s->pid = pid;
    rds_track(pid, true);
    int64_t deadline = rds_now_ms() + RDS_READY_MS;
    while (!rds_ping(s)) {
        int st;
        cr_assert(waitpid(pid, &st, WNOHANG) == 0,
                  "redis-server on port %u exited (status 0x%x)", s->port, st);
        cr_assert(rds_now_ms() < deadline, "redis-server on port %u: no PONG "
                  "within %d ms", s->port, RDS_READY_MS);
        rds_nap_ms(10);
    }
}

/* Kills s (SIGKILL: a crash, as far as clients can tell) and reaps it. */
static inline void rds_kill(rds *s)
{
    cr_assert(s->pid > 0);
    kill(s->pid, SIGCONT);
    kill(s->pid, SIGKILL);
    while (waitpid(s->pid, NULL, 0) < 0 && errno == EINTR)
        ;
    rds_track(s->pid, false);
    s->pid = 0;
}

/* Runs a command on a fresh connection to s; the reply (freeReplyObject
 * it) or a failed test. */
static inline redisReply *rds_cmd(const rds *s, const char *fmt, ...)
{
    redisContext *c = rds_connect(s);
    cr_assert_not_null(c, "connect to redis on port %u", s->port);
    va_list ap;
    va_start(ap, fmt);
    redisReply *r = redisvCommand(c, fmt, ap);
    va_end(ap);
    cr_assert_not_null(r, "redis command %s: %s", fmt, c->errstr);
    redisFree(c);
    return r;
}

/* The value at key as a new buffer (free() it), *len its size; NULL when
 * the key is absent. */
static inline uint8_t *rds_get(const rds *s, const char *key, size_t *len)
{
    redisReply *r = rds_cmd(s, "GET %s", key);
    uint8_t *v = NULL;
    if (r->type == REDIS_REPLY_STRING) {
        v = malloc(r->len + 1);
        cr_assert_not_null(v);
        memcpy(v, r->str, r->len);
        *len = r->len;
    }
    freeReplyObject(r);
    return v;
}

static inline void rds_set(const rds *s, const char *key, const void *v,
                           size_t len)
{
    redisReply *r = rds_cmd(s, "SET %s %b", key, v, len);
    cr_assert_eq(r->type, REDIS_REPLY_STATUS, "SET %s", key);
    freeReplyObject(r);
}

/* The number of keys matching pattern (KEYS: fine on a test server). */
static inline size_t rds_count(const rds *s, const char *pattern)
{
    redisReply *r = rds_cmd(s, "KEYS %s", pattern);
    cr_assert_eq(r->type, REDIS_REPLY_ARRAY);
    size_t n = r->elements;
    freeReplyObject(r);
    return n;
}

/* Writes a fleet key file dir/name (mode 0600): 32 bytes of key, then
 * "\n" password when password is not NULL.  Its path goes to path. */
static inline void rds_key_file(const char *dir, const char *name,
                                const uint8_t key[32], const char *password,
                                char *path, size_t cap)
{
    uint8_t buf[32 + 258];
    size_t n = 32;
    memcpy(buf, key, 32);
    if (password != NULL) {
        buf[n++] = '\n';
        memcpy(buf + n, password, strlen(password));
        n += strlen(password);
    }
    cr_assert_eq(kw_test_write_file(dir, name, buf, n, path, cap), 0,
                 "write %s/%s: %s", dir, name, strerror(errno));
    cr_assert_eq(chmod(path, 0600), 0);
}

#endif /* KW_TEST_REMOTE_UTIL_H */
