/* remote.c: the fleet tier's connections, commands and counters.
 *
 * A mutex-protected pool of hiredis contexts (hiredis is not thread-safe:
 * one context per caller at a time), a timeout on every call, and a
 * "down" state with exponential backoff so that a dead Redis costs callers
 * nothing but a clock read.  The lease logic lives in remote_fleet.c, the
 * value format in remote_entry.c.
 */
#include "kw_remote.h"
#include "remote_internal.h"

#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include <sodium.h>

#include "kw_err.h"

int64_t kw__remote_now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

int kw_remote_parse_url(const char *url, kw_remote_addr *out)
{
    static const char scheme[] = "redis://";
    if (url == NULL || strncmp(url, scheme, sizeof scheme - 1) != 0)
        return KW_EINVAL;
    const char *host = url + sizeof scheme - 1;
    const char *colon = strrchr(host, ':');
    if (colon == NULL || colon == host || strchr(host, '@') != NULL ||
        (size_t)(colon - host) >= sizeof out->host)
        return KW_EINVAL;
    char *end = NULL;
    errno = 0;
    unsigned long port = strtoul(colon + 1, &end, 10);
    if (errno != 0 || end == colon + 1 || port == 0 || port > 65535)
        return KW_EINVAL;
    unsigned long db = 0;
    if (*end == '/') {
        const char *d = end + 1;
        db = strtoul(d, &end, 10);
        if (end == d || db > 15)
            return KW_EINVAL;
    }
    if (*end != '\0')
        return KW_EINVAL;
    memset(out, 0, sizeof *out);
    memcpy(out->host, host, (size_t)(colon - host));
    out->port = (unsigned)port;
    out->db = (unsigned)db;
    return 0;
}

/* Takes the password line after the key bytes (one optional newline
 * first, ends at the next newline or the end). */
static int key_password(const char *p, size_t n, kw_remote_opts *o)
{
    if (n > 0 && p[0] == '\n') {
        p++;
        n--;
    }
    const char *nl = memchr(p, '\n', n);
    size_t len = nl ? (size_t)(nl - p) : n;
    if (len >= sizeof o->password || memchr(p, '\0', len) != NULL)
        return KW_EINVAL;
    if (len > 0) {
        memcpy(o->password, p, len);
        o->password[len] = '\0';
    }
    return 0;
}

int kw_remote_load_key(const char *path, kw_remote_opts *o, char *err,
                       size_t errlen)
{
    char buf[KW_REMOTE_KEY_LEN + KW_REMOTE_MAX_PASSWORD + 2];
    struct stat st;
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
    const char *why = NULL;
    if (fd < 0)
        why = strerror(errno);
    else if (fstat(fd, &st) < 0 || !S_ISREG(st.st_mode))
        why = "not a regular file";
    else if ((st.st_mode & 077) != 0)
        why = "readable or writable by group or others (chmod 600 it)";
    ssize_t n = 0;
    while (why == NULL && (size_t)n < sizeof buf) {
        ssize_t r = read(fd, buf + n, sizeof buf - (size_t)n);
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0)
            why = strerror(errno);
        if (r <= 0)
            break;
        n += r;
    }
    if (fd >= 0)
        close(fd);
    if (why == NULL && n < KW_REMOTE_KEY_LEN)
        why = "shorter than the 32 bytes of a fleet key";
    if (why == NULL && key_password(buf + KW_REMOTE_KEY_LEN,
                                    (size_t)n - KW_REMOTE_KEY_LEN, o) < 0)
        why = "the password line after the key is too long or has a NUL";
    if (why == NULL)
        memcpy(o->key, buf, KW_REMOTE_KEY_LEN);
    sodium_memzero(buf, sizeof buf);
    if (why != NULL) {
        snprintf(err, errlen, "--remote-key-file %s: %s", path, why);
        return KW_EINVAL;
    }
    return 0;
}

/* Runs one setup command (AUTH, SELECT) on a fresh context: 0 when it
 * answers +OK. */
static int setup_cmd(redisContext *ctx, const char *fmt, const char *arg)
{
    redisReply *rep = redisCommand(ctx, fmt, arg);
    int rc = rep != NULL && rep->type == REDIS_REPLY_STATUS ? 0 : KW_EREMOTE;
    if (rep != NULL)
        freeReplyObject(rep);
    return rc;
}

/* Opens one connection with the call timeout, authenticated and on the
 * right database.  NULL when any step fails. */
static redisContext *connect_one(const kw_remote *r)
{
    unsigned ms = r->o.timeout_ms;
    struct timeval tv = {ms / 1000, (ms % 1000) * 1000};
    redisContext *ctx =
        redisConnectWithTimeout(r->o.addr.host, (int)r->o.addr.port, tv);
    if (ctx == NULL)
        return NULL;
    char db[16];
    snprintf(db, sizeof db, "%u", r->o.addr.db);
    if (ctx->err != 0 || redisSetTimeout(ctx, tv) != REDIS_OK ||
        (r->o.password[0] && setup_cmd(ctx, "AUTH %s", r->o.password) < 0) ||
        (r->o.addr.db != 0 && setup_cmd(ctx, "SELECT %s", db) < 0)) {
        redisFree(ctx);
        return NULL;
    }
    return ctx;
}

/* Frees the pooled connections (a failure of one usually means all are
 * dead); down also marks the tier down and schedules the next connection
 * attempt after the current backoff, which then doubles. */
static void drop_pool(kw_remote *r, bool down)
{
    redisContext *dead[KW__REMOTE_POOL];
    pthread_mutex_lock(&r->lock);
    size_t n = r->npool;
    memcpy(dead, r->pool, n * sizeof *dead);
    r->npool = 0;
    if (down) {
        r->down = true;
        r->retry_at_ms = kw__remote_now_ms() + r->backoff_ms;
        r->backoff_ms = r->backoff_ms * 2 > KW_REMOTE_BACKOFF_MAX_MS
                            ? KW_REMOTE_BACKOFF_MAX_MS : r->backoff_ms * 2;
    }
    pthread_mutex_unlock(&r->lock);
    for (size_t i = 0; i < n; i++)
        redisFree(dead[i]);
}

static void mark_down(kw_remote *r)
{
    drop_pool(r, true);
}

static void drain(kw_remote *r)
{
    drop_pool(r, false);
}

/* A connection for one call: a pooled one, else a new one, unless the
 * tier is down and its retry is not due (KW_EREMOTE at once).  A due
 * retry is claimed by moving retry_at, so one caller probes at a time. */
static int take(kw_remote *r, redisContext **out, bool *pooled)
{
    pthread_mutex_lock(&r->lock);
    *pooled = r->npool > 0;
    if (r->npool > 0) {
        *out = r->pool[--r->npool];
        pthread_mutex_unlock(&r->lock);
        return 0;
    }
    int64_t now = kw__remote_now_ms();
    bool blocked = r->down && now < r->retry_at_ms;
    if (r->down && !blocked)
        r->retry_at_ms = now + r->backoff_ms;
    pthread_mutex_unlock(&r->lock);
    if (blocked)
        return KW_EREMOTE;
    redisContext *ctx = connect_one(r);
    if (ctx == NULL) {
        mark_down(r);
        return KW_EREMOTE;
    }
    pthread_mutex_lock(&r->lock);
    r->down = false;
    r->backoff_ms = KW_REMOTE_BACKOFF_MIN_MS;
    pthread_mutex_unlock(&r->lock);
    *out = ctx;
    return 0;
}

bool kw_remote_is_down(kw_remote *r)
{
    pthread_mutex_lock(&r->lock);
    bool down = r->down;
    pthread_mutex_unlock(&r->lock);
    return down;
}

/* Returns a healthy connection to the pool (or frees it when full). */
static void give(kw_remote *r, redisContext *ctx)
{
    pthread_mutex_lock(&r->lock);
    bool kept = r->npool < KW__REMOTE_POOL;
    if (kept)
        r->pool[r->npool++] = ctx;
    pthread_mutex_unlock(&r->lock);
    if (!kept)
        redisFree(ctx);
}

/* True when a failed call on a pooled connection says only that this
 * idle connection was closed (Redis restarted, or its `timeout` dropped
 * us): worth one try on a fresh connection.  Timeouts are not retried. */
static bool stale(const redisContext *ctx, int err)
{
    return ctx->err == REDIS_ERR_EOF ||
           (ctx->err == REDIS_ERR_IO && (err == ECONNRESET || err == EPIPE));
}

int kw__remote_cmd(kw_remote *r, redisReply **out, const char *fmt, ...)
{
    redisContext *ctx;
    redisReply *rep = NULL;
    bool pooled = false, retry = true;
    *out = NULL;
    while (rep == NULL) {
        if (take(r, &ctx, &pooled) < 0) {
            atomic_fetch_add(&r->errors, 1);
            return KW_EREMOTE;
        }
        va_list ap;
        va_start(ap, fmt);
        errno = 0;
        rep = redisvCommand(ctx, fmt, ap);
        int err = errno;
        va_end(ap);
        if (rep != NULL)
            break;
        /* I/O error or timeout: the context is unusable. */
        bool again = pooled && retry && stale(ctx, err);
        redisFree(ctx);
        if (!again) {
            mark_down(r);
            atomic_fetch_add(&r->errors, 1);
            return KW_EREMOTE;
        }
        drain(r); /* its pooled siblings are stale too */
        retry = false;
    }
    give(r, ctx);
    if (rep->type == REDIS_REPLY_ERROR) {
        freeReplyObject(rep);
        atomic_fetch_add(&r->errors, 1);
        return KW_EREMOTE;
    }
    *out = rep;
    return 0;
}

int kw_remote_open(kw_remote **out, const kw_remote_opts *o, char *err,
                   size_t errlen)
{
    if (o->addr.host[0] == '\0' || o->addr.port == 0 || o->addr.port > 65535)
        return KW_EINVAL;
    if (sodium_init() < 0)
        return KW_ENOMEM;
    kw_remote *r = calloc(1, sizeof *r);
    if (r == NULL)
        return KW_ENOMEM;
    r->o = *o;
    if (r->o.timeout_ms == 0)
        r->o.timeout_ms = KW_REMOTE_DEFAULT_TIMEOUT_MS;
    if (r->o.lease_ms == 0)
        r->o.lease_ms = KW_REMOTE_DEFAULT_LEASE_MS;
    r->backoff_ms = KW_REMOTE_BACKOFF_MIN_MS;
    if (pthread_mutex_init(&r->lock, NULL) != 0) {
        free(r);
        return KW_ENOMEM;
    }
    /* One probe: a refused password is a configuration error worth
     * refusing to start for; an unreachable Redis is not (it may come up
     * later), so the tier just starts down. */
    redisContext *ctx = connect_one(r);
    if (ctx != NULL) {
        give(r, ctx);
    } else if (r->o.password[0] != '\0') {
        ctx = redisConnectWithTimeout(r->o.addr.host, (int)r->o.addr.port,
                                      (struct timeval){1, 0});
        bool reachable = ctx != NULL && ctx->err == 0;
        redisFree(ctx);
        if (reachable) {
            snprintf(err, errlen, "remote redis://%s:%u: AUTH or SELECT "
                     "refused", r->o.addr.host, r->o.addr.port);
            kw_remote_close(r);
            return KW_EREMOTE;
        }
        mark_down(r);
    } else {
        mark_down(r);
    }
    *out = r;
    return 0;
}

void kw_remote_close(kw_remote *r)
{
    if (r == NULL)
        return;
    for (size_t i = 0; i < r->npool; i++)
        redisFree(r->pool[i]);
    pthread_mutex_destroy(&r->lock);
    sodium_memzero(&r->o, sizeof r->o);
    free(r);
}

void kw__remote_key(char *out, const char *prefix,
                    const uint8_t digest[KW_CACHE_DIGEST_LEN])
{
    size_t n = strlen(prefix);
    memcpy(out, prefix, n);
    sodium_bin2hex(out + n, 2 * KW_CACHE_DIGEST_LEN + 1, digest,
                   KW_CACHE_DIGEST_LEN);
}

int kw__remote_fetch(kw_remote *r, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                     void **blob, size_t *len, kw_cache_info *info)
{
    char key[KW__REMOTE_KEYLEN];
    redisReply *rep;
    *blob = NULL;
    kw__remote_key(key, KW__REMOTE_ENTRY, digest);
    int rc = kw__remote_cmd(r, &rep, "GET %s", key);
    if (rc < 0)
        return rc;
    const void *b = NULL;
    if (rep->type == REDIS_REPLY_NIL)
        rc = KW_ENOTFOUND;
    else if (rep->type != REDIS_REPLY_STRING)
        rc = KW_ECORRUPT;
    else
        rc = kw_remote_decode(r->o.key, digest, (const uint8_t *)rep->str,
                              rep->len, &b, len, info);
    if (rc == KW_ECORRUPT)
        atomic_fetch_add(&r->refused, 1);
    if (rc == 0 && (*blob = malloc(*len)) == NULL)
        rc = KW_ENOMEM;
    if (rc == 0) {
        memcpy(*blob, b, *len);
        atomic_fetch_add(&r->hits, 1);
    }
    freeReplyObject(rep);
    return rc;
}

int kw_remote_get(kw_remote *r, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                  void **blob, size_t *len, kw_cache_info *info)
{
    int rc = kw__remote_fetch(r, digest, blob, len, info);
    if (rc == KW_ENOTFOUND)
        atomic_fetch_add(&r->misses, 1);
    return rc;
}

int kw_remote_put(kw_remote *r, const uint8_t digest[KW_CACHE_DIGEST_LEN],
                  const kw_cache_info *info, const void *blob, size_t len)
{
    uint8_t *v = NULL;
    size_t n = 0;
    char key[KW__REMOTE_KEYLEN];
    int rc = kw_remote_encode(r->o.key, digest, info, blob, len, &v, &n);
    if (rc < 0)
        return rc;
    kw__remote_key(key, KW__REMOTE_ENTRY, digest);
    redisReply *rep;
    rc = kw__remote_cmd(r, &rep, "SET %s %b", key, v, n);
    free(v);
    if (rc == 0) {
        freeReplyObject(rep);
        atomic_fetch_add(&r->puts, 1);
    }
    return rc;
}

void kw_remote_stats_get(const kw_remote *r, kw_remote_stats *out)
{
    kw_remote *m = (kw_remote *)r; /* atomics: loads do not modify */
    out->hits = atomic_load(&m->hits);
    out->misses = atomic_load(&m->misses);
    out->errors = atomic_load(&m->errors);
    out->refused = atomic_load(&m->refused);
    out->puts = atomic_load(&m->puts);
}
