/* client.c: libkwarm, the blocking client of kwarmd (kw_client.h).
 *
 * One connection, one request at a time.  The socket is non-blocking and
 * every wait goes through poll(), so a timeout bounds each wait without
 * alarms or SO_RCVTIMEO.  Replies are read into one buffer that grows to
 * a frame's declared size only after kw_proto_parse_reply() (and then
 * kw_proto_peek()) accepted the fixed header, so the daemon can never make
 * the client allocate more than the protocol caps allow.
 */
#include "kw_client.h"

#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kw_err.h"
#include "kw_json.h"
#include "kw_proto.h"

#define RECV_MIN 4096u          /* smallest receive buffer */
#define KEEP_MAX (256u * 1024u) /* a bigger, emptied buffer is freed */
#define CONNECT_RETRY_MS 5      /* pause while the listen backlog is full */

struct kw_client {
    int fd;         /* -1 once closed after a failure */
    int timeout_ms; /* per wait; <= 0: none */
    uint8_t *buf;   /* received bytes [0, len) of cap */
    size_t len, cap;
    size_t used; /* bytes of the frame last handed out, dropped next read */
    char path[KW_CLIENT_PATH_MAX];
    char err[KW_CLIENT_ERRLEN];
};

/* ---- errors ------------------------------------------------------------ */

/* Formats the last-error text of c and returns rc. */
static __attribute__((format(printf, 3, 4))) int
fail(kw_client *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    return rc;
}

/* fail(), and closes the connection: after an I/O or protocol failure the
 * stream is at an unknown point, so no later request could be trusted. */
static __attribute__((format(printf, 3, 4))) int
broken(kw_client *c, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(c->err, sizeof c->err, fmt, ap);
    va_end(ap);
    if (c->fd >= 0)
        close(c->fd);
    c->fd = -1;
    free(c->buf);
    c->buf = NULL;
    c->len = c->cap = c->used = 0;
    return rc;
}

/* Maps the "code" name of an ERROR frame back to its value: a kw_err.h
 * name, "ESYS" (an errno of the daemon's, whose number is not sent) as
 * -EIO, anything else as KW_EPROTO. */
static int code_from_name(const char *name)
{
#define XX(n, v, m)                      \
    if (strcmp(name, "KW_" #n) == 0) \
        return (v);
    KW_ERR_MAP(XX)
#undef XX
    return strcmp(name, "ESYS") == 0 ? -EIO : KW_EPROTO;
}

/* Keeps the daemon's ERROR text in c->err; returns the mapped code. */
static int daemon_error(kw_client *c, const kw_msg *m)
{
    const cJSON *e = cJSON_GetObjectItemCaseSensitive(m->header, "error");
    const cJSON *code = cJSON_GetObjectItemCaseSensitive(m->header, "code");
    int rc = cJSON_IsString(code) ? code_from_name(code->valuestring)
                                  : KW_EPROTO;
    return fail(c, rc, "kwarmd: %s", cJSON_IsString(e) ? e->valuestring
                                                        : kw_strerror(rc));
}

/* ---- waiting, sending, receiving --------------------------------------- */

static int64_t now_ms(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

/* Waits until c->fd is ready for events, at most c->timeout_ms (EINTR
 * retried against the same deadline).  Readiness includes errors and
 * hang-ups: the following send/recv reports them.  0, -ETIMEDOUT, -errno. */
static int wait_fd(kw_client *c, short events)
{
    int64_t deadline = c->timeout_ms > 0 ? now_ms() + c->timeout_ms : -1;
    for (;;) {
        int left = -1;
        if (deadline >= 0) {
            int64_t d = deadline - now_ms();
            left = d > 0 ? (int)d : 0;
        }
        struct pollfd p = {.fd = c->fd, .events = events};
        int n = poll(&p, 1, left);
        if (n > 0)
            return 0;
        if (n == 0)
            return -ETIMEDOUT;
        if (errno != EINTR)
            return -errno;
    }
}

/* Sends n bytes, without SIGPIPE.  0, or a code with c broken. */
static int send_all(kw_client *c, const uint8_t *p, size_t n)
{
    while (n > 0) {
        ssize_t w = send(c->fd, p, n, MSG_NOSIGNAL);
        if (w > 0) {
            p += w;
            n -= (size_t)w;
            continue;
        }
        int e = w < 0 ? errno : EIO;
        if (e == EINTR)
            continue;
        if (e != EAGAIN && e != EWOULDBLOCK)
            return broken(c, -e, "send to kwarmd: %s", strerror(e));
        int rc = wait_fd(c, POLLOUT);
        if (rc < 0)
            return broken(c, rc, "send to kwarmd: %s", strerror(-rc));
    }
    return 0;
}

/* Makes room for need bytes (a size the caps already bounded) and reads
 * what arrives.  0, or a code with c broken. */
static int read_more(kw_client *c, size_t need)
{
    if (need > c->cap) {
        size_t cap = need < RECV_MIN ? RECV_MIN : need;
        uint8_t *b = realloc(c->buf, cap);
        if (b == NULL)
            return broken(c, KW_ENOMEM, "reply of %zu bytes: %s", need,
                          kw_strerror(KW_ENOMEM));
        c->buf = b;
        c->cap = cap;
    }
    for (;;) {
        ssize_t r = recv(c->fd, c->buf + c->len, c->cap - c->len, 0);
        if (r > 0) {
            c->len += (size_t)r;
            return 0;
        }
        if (r == 0)
            return broken(c, -ECONNRESET, "kwarmd closed the connection");
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EWOULDBLOCK)
            return broken(c, -errno, "recv from kwarmd: %s", strerror(errno));
        int rc = wait_fd(c, POLLIN);
        if (rc < 0)
            return broken(c, rc, "waiting for kwarmd: %s", strerror(-rc));
    }
}

/* Drops the frame handed out last; frees a large buffer once empty so one
 * big cubin does not pin its memory for the connection's life. */
static void drop_used(kw_client *c)
{
    if (c->used > 0) {
        memmove(c->buf, c->buf + c->used, c->len - c->used);
        c->len -= c->used;
        c->used = 0;
    }
    if (c->len == 0 && c->cap > KEEP_MAX) {
        free(c->buf);
        c->buf = NULL;
        c->cap = 0;
    }
}

/* Reads the next reply frame into *m (kw_msg_destroy() it).  m->payload
 * points into c->buf: valid until the next read on c.  0, or a code with
 * c broken. */
static int recv_frame(kw_client *c, kw_msg *m)
{
    drop_used(c);
    for (;;) {
        size_t used;
        int rc = kw_proto_parse_reply(c->buf, c->len, m, &used);
        if (rc == KW_PROTO_OK) {
            c->used = used;
            return 0;
        }
        if (rc == KW_EVERSION)
            return broken(c, rc, "kwarmd speaks protocol version %u, this "
                          "client version %u: upgrade the older one",
                          kw_proto_frame_version(c->buf, c->len),
                          KW_PROTO_VERSION);
        if (rc < 0) {
            char esc[KW_PROTO_ESCAPE_CAP];
            kw_proto_escape(c->buf, c->len, esc, sizeof esc);
            return broken(c, rc, "bad reply from kwarmd (%s): \"%s\"",
                          kw_strerror(rc), esc);
        }
        /* MORE: the head is valid so far, so its lengths are within caps. */
        size_t need = KW_PROTO_HEAD_LEN;
        uint32_t hl, pl;
        if (kw_proto_peek(c->buf, c->len, NULL, &hl, &pl) == KW_PROTO_OK)
            need += (size_t)hl + pl;
        if ((rc = read_more(c, need)) < 0)
            return rc;
    }
}

/* What a streamed reply (keys, warmup) gathers from its PROGRESS frames:
 * the items of each frame's array `member`, in order. */
typedef struct stream {
    const char *member;        /* "keys" or "results" */
    cJSON *items;              /* an array, owned */
    kw_client_progress_fn cb;  /* warmup: each frame's header as text */
    void *arg;
} stream;

/* Takes one PROGRESS frame: its array's items move to s->items, then cb
 * sees the frame.  0, KW_EPROTO (no such array) or KW_ENOMEM. */
static int take_progress(kw_msg *m, stream *s)
{
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(m->header, s->member);
    if (!cJSON_IsArray(arr))
        return KW_EPROTO;
    if (s->cb != NULL) {
        char *text = cJSON_PrintUnformatted(m->header);
        if (text == NULL)
            return KW_ENOMEM;
        s->cb(text, s->arg);
        free(text);
    }
    while (arr->child != NULL)
        cJSON_AddItemToArray(s->items, cJSON_DetachItemViaPointer(arr, arr->child));
    return 0;
}

/* Sends a request of type with header hdr (NULL: {}) and reads up to its
 * final reply, which must be of type want; PROGRESS frames (keys and
 * warmup only: st not NULL) are gathered into st.  Returns 0 with *reply set (kw_msg_destroy() it), the
 * daemon's ERROR as a code, or a failure. */
static int request(kw_client *c, uint16_t type, const cJSON *hdr,
                   uint16_t want, stream *st, kw_msg *reply)
{
    const char *name = kw_proto_type_name(type);
    if (c->fd < 0)
        return fail(c, -ENOTCONN, "%s: not connected (an earlier failure "
                    "closed the connection)", name);
    uint8_t *frame;
    size_t n;
    int rc = kw_proto_encode(type, hdr, NULL, 0, &frame, &n);
    if (rc < 0)
        return fail(c, rc, "%s request: %s", name,
                    rc == KW_E2BIG ? "JSON header over 64 KiB" : kw_strerror(rc));
    drop_used(c);
    if (c->len > 0)
        rc = broken(c, KW_EPROTO, "kwarmd sent %zu bytes nobody asked for",
                    c->len);
    if (rc == 0)
        rc = send_all(c, frame, n);
    free(frame);
    while (rc == 0 && (rc = recv_frame(c, reply)) == 0) {
        if (reply->type == KW_PROTO_ERROR) {
            rc = daemon_error(c, reply);
        } else if (reply->type == KW_PROTO_PROGRESS && st != NULL) {
            if ((rc = take_progress(reply, st)) < 0)
                rc = broken(c, rc, "%s: progress frame: %s", name,
                            kw_strerror(rc));
        } else if (reply->type != want) {
            rc = broken(c, KW_EPROTO, "kwarmd answered %s to %s",
                        kw_proto_type_name(reply->type), name);
        } else {
            return 0;
        }
        kw_msg_destroy(reply);
    }
    return rc;
}

/* ---- connecting -------------------------------------------------------- */

const char *kw_client_default_socket(char *buf, size_t cap)
{
    const char *env = getenv("KWARM_SOCKET");
    const char *run = getenv("XDG_RUNTIME_DIR");
    int n;
    if (env != NULL && env[0] != '\0')
        n = snprintf(buf, cap, "%s", env);
    else if (getuid() != 0 && run != NULL && run[0] != '\0')
        n = snprintf(buf, cap, "%s/kwarm.sock", run);
    else
        n = snprintf(buf, cap, "/run/kwarm/kwarm.sock");
    return n >= 0 && (size_t)n < cap ? buf : NULL;
}

/* Connects c->fd (non-blocking) to addr, retrying while the listen backlog
 * is full (EAGAIN on Linux) until c->timeout_ms passes.  0 or -errno. */
static int connect_wait(kw_client *c, const struct sockaddr_un *addr)
{
    int64_t deadline = c->timeout_ms > 0 ? now_ms() + c->timeout_ms : -1;
    for (;;) {
        if (connect(c->fd, (const struct sockaddr *)addr, sizeof *addr) == 0)
            return 0;
        int e = errno;
        if (e == EISCONN)
            return 0; /* an interrupted connect that completed */
        if (e == EINPROGRESS) {
            int rc = wait_fd(c, POLLOUT), soerr = 0;
            socklen_t len = sizeof soerr;
            if (rc == 0 && getsockopt(c->fd, SOL_SOCKET, SO_ERROR, &soerr,
                                      &len) < 0)
                rc = -errno;
            return rc < 0 ? rc : -soerr;
        }
        if (e == EAGAIN || e == EWOULDBLOCK) {
            if (deadline >= 0 && now_ms() >= deadline)
                return -ETIMEDOUT;
            poll(NULL, 0, CONNECT_RETRY_MS);
        } else if (e != EINTR) {
            return -e;
        }
    }
}

/* Opens c's socket and connects it to c->path.  0 or -errno. */
static int open_socket(kw_client *c)
{
    struct sockaddr_un addr = {.sun_family = AF_UNIX};
    memcpy(addr.sun_path, c->path, strlen(c->path) + 1);
    c->fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (c->fd < 0)
        return -errno;
    int fl = fcntl(c->fd, F_GETFL);
    if (fl < 0 || fcntl(c->fd, F_SETFL, fl | O_NONBLOCK) < 0)
        return -errno;
    return connect_wait(c, &addr);
}

int kw_client_connect(kw_client **out, const char *path, int timeout_ms,
                      char *err, size_t errlen)
{
    char def[KW_CLIENT_PATH_MAX];
    char dummy[1];
    if (err == NULL || errlen == 0) {
        err = dummy;
        errlen = sizeof dummy;
    }
    err[0] = '\0';
    if (out == NULL || (path != NULL && path[0] == '\0')) {
        snprintf(err, errlen, "kwarm client: no socket path or output");
        return KW_EINVAL;
    }
    if (path == NULL &&
        (path = kw_client_default_socket(def, sizeof def)) == NULL) {
        snprintf(err, errlen, "default socket path ($KWARM_SOCKET or "
                 "$XDG_RUNTIME_DIR/kwarm.sock) over %d bytes",
                 KW_CLIENT_PATH_MAX - 1);
        return -ENAMETOOLONG;
    }
    if (strlen(path) >= KW_CLIENT_PATH_MAX ||
        strlen(path) >= sizeof ((struct sockaddr_un *)0)->sun_path) {
        snprintf(err, errlen, "%.64s...: socket path over %d bytes", path,
                 KW_CLIENT_PATH_MAX - 1);
        return -ENAMETOOLONG;
    }
    kw_client *c = calloc(1, sizeof *c);
    if (c == NULL) {
        snprintf(err, errlen, "%s", kw_strerror(KW_ENOMEM));
        return KW_ENOMEM;
    }
    c->fd = -1;
    c->timeout_ms = timeout_ms;
    memcpy(c->path, path, strlen(path) + 1);
    int rc = open_socket(c);
    if (rc < 0) {
        snprintf(err, errlen, "connect(%s): %s", path, strerror(-rc));
        kw_client_close(c);
        return rc;
    }
    *out = c;
    return 0;
}

void kw_client_close(kw_client *c)
{
    if (c == NULL)
        return;
    if (c->fd >= 0)
        close(c->fd);
    free(c->buf);
    free(c);
}

void kw_client_set_timeout(kw_client *c, int timeout_ms)
{
    if (c != NULL)
        c->timeout_ms = timeout_ms;
}

const char *kw_client_path(const kw_client *c)
{
    return c != NULL ? c->path : "";
}

const char *kw_client_last_error(const kw_client *c)
{
    return c != NULL ? c->err : "";
}

/* ---- requests ---------------------------------------------------------- */

/* Parses the caller's JSON text (what: its name in messages) into *out by
 * the strict rules of kw_json.h, as kwarm keys and kwarmd read a config:
 * cJSON_Parse() would skip control bytes and read 1e400 as infinity, which
 * it then prints as null.  The object sits one level down in the request
 * header.  0, KW_EJSON, KW_EINVAL (not an object) or KW_ENOMEM. */
static int parse_object(kw_client *c, const char *what, const char *text,
                        cJSON **out)
{
    if (text == NULL)
        return fail(c, KW_EINVAL, "%s: NULL", what);
    char why[KW_JSON_ERRLEN];
    int rc = kw_json_parse(text, strlen(text), KW_PROTO_MAX_DEPTH - 1, out,
                           why, sizeof why);
    if (rc == KW_EJSON)
        return fail(c, rc, "%s: %s", what, why);
    if (rc < 0)
        return fail(c, rc, "%s", kw_strerror(rc));
    if (!cJSON_IsObject(*out)) {
        cJSON_Delete(*out);
        *out = NULL;
        return fail(c, KW_EINVAL, "%s: not a JSON object", what);
    }
    return 0;
}

/* Prints the header of a RESULT into a new string for the caller. */
static int take_json(kw_client *c, const kw_msg *m, char **out)
{
    char *s = cJSON_PrintUnformatted(m->header);
    if (s == NULL)
        return fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    *out = s;
    return 0;
}

int kw_client_ping(kw_client *c, char *version, size_t cap)
{
    if (c == NULL)
        return KW_EINVAL;
    kw_msg m = {0};
    int rc = request(c, KW_PROTO_PING, NULL, KW_PROTO_PONG, NULL, &m);
    if (rc < 0)
        return rc;
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(m.header, "version");
    const char *s = cJSON_IsString(v) ? v->valuestring : "";
    if (version != NULL && strlen(s) >= cap)
        rc = fail(c, KW_ENOSPC, "ping: version '%.32s' over %zu bytes", s, cap);
    else if (version != NULL)
        memcpy(version, s, strlen(s) + 1);
    kw_msg_destroy(&m);
    return rc;
}

/* Builds the header of a keys or warmup request. */
static int model_header(kw_client *c, const char *config_json,
                        const char *deployment_json, const char *name,
                        cJSON **out)
{
    cJSON *cfg = NULL, *dep = NULL;
    int rc = parse_object(c, "config", config_json, &cfg);
    if (rc == 0 && deployment_json != NULL)
        rc = parse_object(c, "deployment", deployment_json, &dep);
    if (rc < 0) {
        cJSON_Delete(cfg);
        return rc;
    }
    /* An item belongs to h once added; what was not added is freed here. */
    cJSON *h = cJSON_CreateObject();
    bool ok = h != NULL && cJSON_AddItemToObject(h, "config", cfg);
    if (ok)
        cfg = NULL;
    ok = ok && (dep == NULL || cJSON_AddItemToObject(h, "deployment", dep));
    if (ok)
        dep = NULL;
    ok = ok && (name == NULL || cJSON_AddStringToObject(h, "name", name));
    cJSON_Delete(cfg);
    cJSON_Delete(dep);
    if (!ok) {
        cJSON_Delete(h);
        return fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    }
    *out = h;
    return 0;
}

/* Puts warmup results (which arrive as keys settle) back in key order by
 * their "index": each must be a distinct integer below their count.
 * 0, or -1 when one is not. */
static int sort_by_index(cJSON *items)
{
    int n = cJSON_GetArraySize(items);
    cJSON **slot = calloc((size_t)n + 1, sizeof *slot);
    if (slot == NULL)
        return -1;
    int rc = 0;
    while (rc == 0 && items->child != NULL) {
        cJSON *it = cJSON_DetachItemViaPointer(items, items->child);
        const cJSON *ix = cJSON_GetObjectItemCaseSensitive(it, "index");
        double v = cJSON_IsNumber(ix) ? ix->valuedouble : -1;
        if (v < 0 || v >= n || v != (double)(int)v || slot[(int)v] != NULL) {
            cJSON_Delete(it);
            rc = -1;
        } else {
            slot[(int)v] = it;
        }
    }
    for (int i = 0; i < n; i++)
        if (slot[i] != NULL)
            cJSON_AddItemToArray(items, slot[i]);
    free(slot);
    return rc;
}

/* Puts the streamed items back into the RESULT: keys as "keys" (after
 * checking "count"), warmup results as "manifest".  0 or a code. */
static int assemble(kw_client *c, uint16_t type, kw_msg *m, stream *st)
{
    if (type == KW_PROTO_KEYS) {
        const cJSON *n = cJSON_GetObjectItemCaseSensitive(m->header, "count");
        if (!cJSON_IsNumber(n) ||
            n->valuedouble != (double)cJSON_GetArraySize(st->items))
            return broken(c, KW_EPROTO, "keys: kwarmd streamed %d keys but "
                          "counted another number", cJSON_GetArraySize(st->items));
        cJSON_DeleteItemFromObjectCaseSensitive(m->header, "count");
    }
    if (type == KW_PROTO_WARMUP && sort_by_index(st->items) < 0)
        return broken(c, KW_EPROTO, "warmup: kwarmd streamed results without "
                      "a valid \"index\"");
    if (!cJSON_AddItemToObject(m->header, type == KW_PROTO_KEYS ? "keys" : "manifest",
                               st->items))
        return fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    st->items = NULL;
    return 0;
}

/* keys and warmup: one request with a model header (plus "pin" when pin is
 * not NULL); the streamed items and the RESULT become one document. */
static int model_request(kw_client *c, uint16_t type, const char *config_json,
                         const char *deployment_json, const char *name,
                         const char *pin, stream *st, char **out)
{
    if (c == NULL || out == NULL)
        return c ? fail(c, KW_EINVAL, "NULL reply pointer") : KW_EINVAL;
    cJSON *h = NULL;
    kw_msg m = {0};
    st->items = cJSON_CreateArray();
    int rc = st->items ? model_header(c, config_json, deployment_json, name, &h)
                       : fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    if (rc == 0 && pin != NULL && cJSON_AddStringToObject(h, "pin", pin) == NULL)
        rc = fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    if (rc == 0)
        rc = request(c, type, h, KW_PROTO_RESULT, st, &m);
    cJSON_Delete(h);
    if (rc == 0)
        rc = assemble(c, type, &m, st);
    if (rc == 0)
        rc = take_json(c, &m, out);
    cJSON_Delete(st->items);
    kw_msg_destroy(&m);
    return rc;
}

int kw_client_keys(kw_client *c, const char *config_json,
                   const char *deployment_json, const char *name,
                   char **reply_json)
{
    stream st = {"keys", NULL, NULL, NULL};
    return model_request(c, KW_PROTO_KEYS, config_json, deployment_json, name,
                         NULL, &st, reply_json);
}

int kw_client_warmup(kw_client *c, const char *config_json,
                     const char *deployment_json, const char *name,
                     kw_client_progress_fn cb, void *arg, char **result_json)
{
    stream st = {"results", NULL, cb, arg};
    return model_request(c, KW_PROTO_WARMUP, config_json, deployment_json,
                         name, NULL, &st, result_json);
}

int kw_client_warmup_pin(kw_client *c, const char *config_json,
                         const char *deployment_json, const char *name,
                         const char *pin, kw_client_progress_fn cb, void *arg,
                         char **result_json)
{
    stream st = {"results", NULL, cb, arg};
    if (pin == NULL)
        return c ? fail(c, KW_EINVAL, "warmup: NULL pin name") : KW_EINVAL;
    return model_request(c, KW_PROTO_WARMUP, config_json, deployment_json,
                         name, pin, &st, result_json);
}

int kw_client_admin(kw_client *c, const char *what, const char *header_json,
                    char **reply_json)
{
    static const struct {
        const char *name;
        uint16_t type;
    } types[] = {{"ls", KW_PROTO_LS}, {"evict", KW_PROTO_EVICT},
                 {"pins", KW_PROTO_PINS}, {"unpin", KW_PROTO_UNPIN},
                 {"resize", KW_PROTO_RESIZE}};
    uint16_t type = 0;
    for (size_t i = 0; what != NULL && i < sizeof types / sizeof *types; i++)
        if (strcmp(what, types[i].name) == 0)
            type = types[i].type;
    if (c == NULL || reply_json == NULL || type == 0)
        return c ? fail(c, KW_EINVAL, "admin: unknown request '%.16s'",
                        what ? what : "(null)") : KW_EINVAL;
    cJSON *h = NULL;
    int rc = parse_object(c, "admin request", header_json, &h);
    stream st = {"entries", cJSON_CreateArray(), NULL, NULL};
    kw_msg m = {0};
    if (rc == 0 && st.items == NULL)
        rc = fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    if (rc == 0)
        rc = request(c, type, h, KW_PROTO_RESULT, &st, &m);
    /* ls streams its entries, evict by criteria the removed ones. */
    const char *member = type == KW_PROTO_LS ? "entries" : "removed";
    bool streamed = type == KW_PROTO_LS ||
                    (type == KW_PROTO_EVICT && strstr(header_json, "\"match\""));
    if (rc == 0 && streamed && !cJSON_AddItemToObject(m.header, member, st.items))
        rc = fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    else if (rc == 0 && streamed)
        st.items = NULL;
    if (rc == 0)
        rc = take_json(c, &m, reply_json);
    cJSON_Delete(h);
    cJSON_Delete(st.items);
    kw_msg_destroy(&m);
    return rc;
}

int kw_client_misses(kw_client *c, uint64_t since_s, char **result_json)
{
    if (c == NULL || result_json == NULL)
        return c ? fail(c, KW_EINVAL, "NULL reply pointer") : KW_EINVAL;
    stream st = {"misses", cJSON_CreateArray(), NULL, NULL};
    cJSON *h = cJSON_CreateObject();
    kw_msg m = {0};
    int rc = st.items && h && cJSON_AddNumberToObject(h, "since", (double)since_s)
                 ? 0 : fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    if (rc == 0)
        rc = request(c, KW_PROTO_MISSES, h, KW_PROTO_RESULT, &st, &m);
    cJSON_Delete(h);
    if (rc == 0 && !cJSON_AddItemToObject(m.header, "misses", st.items))
        rc = fail(c, KW_ENOMEM, "%s", kw_strerror(KW_ENOMEM));
    else if (rc == 0)
        st.items = NULL;
    if (rc == 0)
        rc = take_json(c, &m, result_json);
    cJSON_Delete(st.items);
    kw_msg_destroy(&m);
    return rc;
}

/* True when s is 64 hex digits. */
static bool is_digest(const char *s)
{
    return s != NULL && strlen(s) == 64 &&
           strspn(s, "0123456789abcdefABCDEF") == 64;
}

/* 64 hex digits, or a prefix of 8 or more that kwarmd resolves. */
static bool is_digest_or_prefix(const char *s)
{
    size_t n = s ? strlen(s) : 0;
    return n >= 8 && n <= 64 && strspn(s, "0123456789abcdefABCDEF") == n;
}

/* Copies the string member name of h into dst (cap bytes); false when it
 * is missing, not a string or does not fit. */
static bool copy_member(const cJSON *h, const char *name, char *dst,
                        size_t cap)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(h, name);
    if (!cJSON_IsString(v) || strlen(v->valuestring) >= cap)
        return false;
    memcpy(dst, v->valuestring, strlen(v->valuestring) + 1);
    return true;
}

/* Fills *out from a get's RESULT: the header's strings and a copy of the
 * payload, which must be a non-empty cubin of the declared "size". */
static int fill_kernel(kw_client *c, const kw_msg *m, kw_client_kernel *out)
{
    const cJSON *size = cJSON_GetObjectItemCaseSensitive(m->header, "size");
    const cJSON *comp = cJSON_GetObjectItemCaseSensitive(m->header, "compiled");
    if (!copy_member(m->header, "entry", out->entry, sizeof out->entry) ||
        !copy_member(m->header, "family", out->family, sizeof out->family) ||
        !copy_member(m->header, "arch", out->arch, sizeof out->arch) ||
        !copy_member(m->header, "digest", out->digest, sizeof out->digest) ||
        !cJSON_IsNumber(size) || size->valuedouble != (double)m->payload_len ||
        m->payload_len == 0)
        return broken(c, KW_EPROTO, "get: kwarmd's reply lacks entry, family, "
                      "arch, digest or a cubin of its \"size\"");
    out->cubin = malloc(m->payload_len);
    if (out->cubin == NULL)
        return fail(c, KW_ENOMEM, "get: %s", kw_strerror(KW_ENOMEM));
    memcpy(out->cubin, m->payload, m->payload_len);
    out->len = m->payload_len;
    out->compiled = cJSON_IsTrue(comp);
    return 0;
}

/* Sends a get with header h and fills *out (zeroed on error). */
static int get_request(kw_client *c, const cJSON *h, kw_client_kernel *out)
{
    kw_msg m = {0};
    int rc = request(c, KW_PROTO_GET, h, KW_PROTO_RESULT, NULL, &m);
    if (rc == 0)
        rc = fill_kernel(c, &m, out);
    kw_msg_destroy(&m);
    if (rc < 0)
        kw_client_kernel_destroy(out);
    return rc;
}

int kw_client_get(kw_client *c, const char *digest_hex, bool compile,
                  kw_client_kernel *out)
{
    if (c == NULL || out == NULL)
        return c ? fail(c, KW_EINVAL, "get: NULL kernel") : KW_EINVAL;
    memset(out, 0, sizeof *out);
    if (!is_digest_or_prefix(digest_hex))
        return fail(c, KW_EINVAL, "get: digest is not 64 hex digits nor a "
                    "prefix of at least 8");
    cJSON *h = cJSON_CreateObject();
    int rc = KW_ENOMEM;
    if (h != NULL && cJSON_AddStringToObject(h, "digest", digest_hex) &&
        cJSON_AddBoolToObject(h, "compile", compile))
        rc = get_request(c, h, out);
    else
        fail(c, rc, "get: %s", kw_strerror(rc));
    cJSON_Delete(h);
    return rc;
}

/* Builds the header of a get by family, fields (taken) and arch; NULL on
 * OOM, with fields freed. */
static cJSON *key_header(const char *family, cJSON *fields, const char *arch,
                         bool compile)
{
    cJSON *h = cJSON_CreateObject();
    if (h == NULL || !cJSON_AddItemToObject(h, "fields", fields)) {
        cJSON_Delete(fields);
        cJSON_Delete(h);
        return NULL;
    }
    if (!cJSON_AddStringToObject(h, "family", family) ||
        !cJSON_AddStringToObject(h, "arch", arch) ||
        !cJSON_AddBoolToObject(h, "compile", compile)) {
        cJSON_Delete(h);
        return NULL;
    }
    return h;
}

int kw_client_get_key(kw_client *c, const char *family,
                      const char *fields_json, const char *arch, bool compile,
                      kw_client_kernel *out)
{
    if (c == NULL || out == NULL)
        return c ? fail(c, KW_EINVAL, "get: NULL kernel") : KW_EINVAL;
    memset(out, 0, sizeof *out);
    if (family == NULL || arch == NULL)
        return fail(c, KW_EINVAL, "get: NULL family or arch");
    cJSON *fields = NULL;
    int rc = parse_object(c, "fields", fields_json, &fields);
    if (rc < 0)
        return rc;
    cJSON *h = key_header(family, fields, arch, compile);
    if (h == NULL)
        return fail(c, KW_ENOMEM, "get: %s", kw_strerror(KW_ENOMEM));
    rc = get_request(c, h, out);
    cJSON_Delete(h);
    return rc;
}

void kw_client_kernel_destroy(kw_client_kernel *k)
{
    if (k == NULL)
        return;
    free(k->cubin);
    memset(k, 0, sizeof *k);
}

int kw_client_stats(kw_client *c, char **reply_json)
{
    if (c == NULL || reply_json == NULL)
        return c ? fail(c, KW_EINVAL, "stats: NULL reply pointer") : KW_EINVAL;
    kw_msg m = {0};
    int rc = request(c, KW_PROTO_STATS, NULL, KW_PROTO_RESULT, NULL, &m);
    if (rc == 0)
        rc = take_json(c, &m, reply_json);
    kw_msg_destroy(&m);
    return rc;
}

int kw_client_evict(kw_client *c, const char *digest_hex, bool *evicted)
{
    if (c == NULL)
        return KW_EINVAL;
    if (!is_digest(digest_hex))
        return fail(c, KW_EINVAL, "evict: digest is not 64 hex digits");
    cJSON *h = cJSON_CreateObject();
    if (h == NULL || cJSON_AddStringToObject(h, "digest", digest_hex) == NULL) {
        cJSON_Delete(h);
        return fail(c, KW_ENOMEM, "evict: %s", kw_strerror(KW_ENOMEM));
    }
    kw_msg m = {0};
    int rc = request(c, KW_PROTO_EVICT, h, KW_PROTO_RESULT, NULL, &m);
    cJSON_Delete(h);
    if (rc == 0 && evicted != NULL)
        *evicted = cJSON_IsTrue(
            cJSON_GetObjectItemCaseSensitive(m.header, "evicted"));
    kw_msg_destroy(&m);
    return rc;
}

int kw_client_load(kw_client *c, kw_cuda *cuda, const char *digest_hex,
                   kw_cuda_fn **fn)
{
    if (c == NULL || cuda == NULL || fn == NULL)
        return c ? fail(c, KW_EINVAL, "load: NULL cuda or fn") : KW_EINVAL;
    kw_client_kernel k = {0};
    int rc = kw_client_get(c, digest_hex, false, &k);
    if (rc < 0)
        return rc;
    rc = kw_cuda_load(cuda, k.cubin, k.len, k.entry, fn);
    if (rc < 0)
        fail(c, rc, "load %.16s (%s): %s", k.digest, k.entry,
             rc == KW_ENOMEM ? kw_strerror(rc) : kw_cuda_last_error(cuda));
    kw_client_kernel_destroy(&k);
    return rc;
}
