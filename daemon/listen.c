/* listen.c: the listening socket, accepting peers on the main loop,
 * taking them on a serving loop (their credentials, the allowlist, the
 * connection cap), and the outbox that brings frames made on other
 * threads to a serving loop.
 *
 * _GNU_SOURCE: struct ucred and SO_PEERCRED (Linux) to learn each peer's
 * uid and gid at accept.
 */
#define _GNU_SOURCE
#include "internal.h"

#include <errno.h>
#include <fcntl.h>
#include <libgen.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <systemd/sd-daemon.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "log.h"

/* How often a refused peer may go on sending before it is dropped. */
#define REFUSE_DRAIN_MS 2000u

/* True when the peer's uid or gid is allowed.  Root is allowed unless
 * --deny-root; others by --allow-uid / --allow-gid, or, when neither is
 * given, when they are kwarmd's own uid. */
static bool peer_allowed(const kw__daemon *d, uid_t uid, gid_t gid)
{
    const kw_daemon_opts *o = d->opts;
    if (uid == 0)
        return !o->deny_root;
    if (o->nallow_uid == 0 && o->nallow_gid == 0)
        return uid == getuid();
    for (size_t i = 0; i < o->nallow_uid; i++)
        if (o->allow_uid[i] == uid)
            return true;
    for (size_t i = 0; i < o->nallow_gid; i++)
        if (o->allow_gid[i] == gid)
            return true;
    return false;
}

/* Reads SO_PEERCRED of the accepted pipe into c.  Returns 0, or a negative
 * code on any failure, which refuses the peer: nothing is assumed of a
 * peer whose credentials are unknown.  KWARMD_TEST_PEERCRED_FAIL (tests
 * only) makes every read fail. */
static int peer_creds(kw__conn *c)
{
    uv_os_fd_t fd;
    struct ucred cr;
    socklen_t len = sizeof cr;
    if (c->d->test_peercred_fail)
        return -EIO;
    int rc = uv_fileno((uv_handle_t *)&c->pipe, &fd);
    if (rc < 0)
        return rc;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cr, &len) < 0)
        return errno ? -errno : -EIO;
    if (len != sizeof cr)
        return -EIO;
    c->uid = cr.uid;
    c->gid = cr.gid;
    c->pid = cr.pid;
    return 0;
}

/* Takes the accepted socket fd on loop l: credentials, the allowlist and
 * the connection cap, then serving.  A refused peer reads why. */
void kw__loop_take(kw__loop *l, int fd)
{
    kw__daemon *d = l->d;
    kw__conn *c = l->stopping ? NULL : kw__conn_new(l);
    char msg[128];
    if (c == NULL) {
        close(fd);
        return;
    }
    if (uv_pipe_open(&c->pipe, fd) < 0) {
        close(fd);
        kw__conn_close(c);
        return;
    }
    int rc = peer_creds(c);
    if (rc < 0 || !peer_allowed(d, c->uid, c->gid)) {
        if (rc < 0)
            snprintf(msg, sizeof msg, "peer credentials unreadable (%s): "
                     "refused", strerror(-rc));
        else
            snprintf(msg, sizeof msg, "uid %u gid %u not allowed",
                     (unsigned)c->uid, (unsigned)c->gid);
        KW_LOG(KW_LOG_WARNING, "refused a client: %s", msg);
        d->refused++;
        kw__conn_refuse(c, -EACCES, msg);
        kw__conn_start(c, REFUSE_DRAIN_MS);
        return;
    }
    if (d->nconns > d->opts->max_connections) {
        snprintf(msg, sizeof msg, "too many connections (%u)",
                 d->opts->max_connections);
        if (!atomic_exchange(&d->warned_max_conn, true))
            KW_LOG(KW_LOG_WARNING, "refusing clients: %s", msg);
        d->refused_full++;
        kw__conn_refuse(c, -EMFILE, msg);
        kw__conn_start(c, REFUSE_DRAIN_MS);
        return;
    }
    d->warned_max_conn = false;
    kw__conn_start(c, d->opts->idle_timeout_ms);
}

static void free_handle(uv_handle_t *h)
{
    free(h);
}

/* Accepts the pending connection on the main loop and hands a duplicate
 * of its socket to a serving loop (libuv lets a handle live on one loop
 * only); the main loop's handle is closed. */
static void on_connection(uv_stream_t *server, int status)
{
    kw__daemon *d = server->data;
    if (status < 0 || d->stopping)
        return;
    /* libuv hands over one accepted socket per callback (uv_accept may be
     * called once), so the per-event work is bounded already. */
    uv_pipe_t *p = kw_malloc(sizeof *p);
    uv_os_fd_t fd = -1;
    if (p == NULL)
        return;
    uv_pipe_init(&d->loop, p, 0);
    if (uv_accept(server, (uv_stream_t *)p) == 0 &&
        uv_fileno((uv_handle_t *)p, &fd) == 0)
        fd = fcntl(fd, F_DUPFD_CLOEXEC, 0);
    uv_close((uv_handle_t *)p, free_handle);
    if (fd >= 0)
        kw__loops_hand(d, fd);
}

/* ---- the outbox: frames from job and warm threads -------------------- */

void kw__daemon_post(kw__out *o)
{
    kw__loop *l = kw__req_conn(o->req)->l;
    atomic_fetch_add(&o->req->hb_pending, 1);
    pthread_mutex_lock(&l->out_mu);
    kw_queue_push(&l->outq, &o->node);
    pthread_mutex_unlock(&l->out_mu);
    uv_async_send(&l->outbox);
}

/* Sends or drops one posted item, then ends its request when done.  While
 * stopping, the connection closes after a request's last frame.  A
 * charged frame is uncharged from the request's stream once written or
 * dropped; the final item is the stream's own envelope (not freed). */
static void deliver(kw__loop *l, kw__out *o)
{
    kw__req *r = o->req;
    kw__conn *c = kw__req_conn(r);
    bool done = o->done, close_after = done && l->stopping;
    if (o->on_loop != NULL)
        o->on_loop(r);
    if (o->frame != NULL && !c->closing)
        kw__conn_send_charged(c, o->frame, o->len, close_after,
                              o->charged ? r->s : NULL);
    else if (o->frame != NULL) {
        free(o->frame);
        if (o->charged)
            kw__stream_uncharge(r->s, o->len);
    }
    if (close_after && o->frame == NULL)
        kw__conn_close(c);
    kw__heartbeat_delivered(r);
    if (!done)
        free(o);
    else
        kw__daemon_request_end(r); /* o is r's stream's: freed with it */
}

/* The outbox's async callback: drains the whole queue (sends coalesce). */
static void on_outbox(uv_async_t *h)
{
    kw__loop *l = h->data;
    pthread_mutex_lock(&l->out_mu);
    kw_queue_node *n = kw_queue_take(&l->outq, 0, NULL);
    pthread_mutex_unlock(&l->out_mu);
    while (n != NULL) {
        kw_queue_node *next = n->next; /* deliver frees the item */
        deliver(l, KW_QUEUE_ENTRY(n, kw__out, node));
        n = next;
    }
}

int kw__loop_outbox_init(kw__loop *l)
{
    int rc = -pthread_mutex_init(&l->out_mu, NULL);
    if (rc == 0 && (rc = uv_async_init(&l->loop, &l->outbox, on_outbox)) < 0)
        pthread_mutex_destroy(&l->out_mu);
    l->outbox.data = l;
    return rc;
}

/* Refuses a socket path that does not fit sun_path (never truncates). */
static int check_path(const char *path, char *err, size_t errlen)
{
    struct sockaddr_un sa;
    if (strlen(path) >= sizeof sa.sun_path) {
        snprintf(err, errlen, "--socket: %s: longer than %zu bytes", path,
                 sizeof sa.sun_path - 1);
        return KW_EINVAL;
    }
    return 0;
}

/* Says why binding path failed, naming its directory when that is the
 * cause: missing, or not writable by us. */
static void bind_error(const char *path, int rc, char *err, size_t errlen)
{
    char copy[sizeof ((struct sockaddr_un *)0)->sun_path];
    snprintf(copy, sizeof copy, "%s", path);
    const char *dir = dirname(copy);
    struct stat st;
    if (stat(dir, &st) < 0 && errno == ENOENT)
        snprintf(err, errlen, "--socket: %s: no such directory %s (create it, "
                 "or choose a path in a directory that exists)", path, dir);
    else if (rc == UV_EACCES || rc == UV_EPERM)
        snprintf(err, errlen, "--socket: %s: permission denied: kwarmd cannot "
                 "create a socket in %s", path, dir);
    else if (rc == UV_ENOTDIR)
        snprintf(err, errlen, "--socket: %s: %s is not a directory", path, dir);
    else
        snprintf(err, errlen, "--socket: %s: %s", path, uv_strerror(rc));
}

/* A socket file left at path: another kwarmd answering on it is an
 * error; a dead one (ECONNREFUSED) is removed so we can bind. */
static int clear_stale(const char *path, char *err, size_t errlen)
{
    struct stat st;
    if (lstat(path, &st) < 0) {
        int e = errno;
        if (e == ENOENT)
            return 0;
        bind_error(path, -e, err, errlen);
        return -e;
    }
    if (!S_ISSOCK(st.st_mode)) {
        snprintf(err, errlen, "--socket: %s exists and is not a socket", path);
        return -EEXIST;
    }
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    memcpy(sa.sun_path, path, strlen(path) + 1);
    int rc = fd < 0 ? -errno : connect(fd, (struct sockaddr *)&sa, sizeof sa);
    int e = errno;
    if (fd >= 0)
        close(fd);
    if (rc == 0) {
        snprintf(err, errlen, "--socket: %s: another kwarmd is serving it", path);
        return -EADDRINUSE;
    }
    if (e != ECONNREFUSED) {
        snprintf(err, errlen, "--socket: %s: %s", path, strerror(e));
        return -e;
    }
    return unlink(path) < 0 ? -errno : 0;
}

/* Binds a new socket at path, created with its final mode: the umask is
 * set around bind, so there is no window of wrong permissions. */
static int bind_socket(kw__daemon *d, char *err, size_t errlen)
{
    const char *path = d->opts->socket_path;
    int rc = check_path(path, err, errlen);
    if (rc == 0)
        rc = clear_stale(path, err, errlen);
    if (rc < 0)
        return rc;
    mode_t old = umask(~d->opts->socket_mode & 0777);
    rc = uv_pipe_bind(&d->listener, path);
    umask(old);
    if (rc < 0)
        bind_error(path, rc, err, errlen);
    return rc;
}

int kw__daemon_listen(kw__daemon *d, char *err, size_t errlen)
{
    int rc = uv_pipe_init(&d->loop, &d->listener, 0);
    if (rc < 0)
        return rc;
    d->listener.data = d;
    if (sd_listen_fds(1) >= 1) {
        rc = uv_pipe_open(&d->listener, SD_LISTEN_FDS_START);
        KW_LOG(KW_LOG_INFO, "listening on the socket systemd passed");
    } else if ((rc = bind_socket(d, err, errlen)) == 0) {
        d->bound = true;
        KW_LOG(KW_LOG_INFO, "listening on %s", d->opts->socket_path);
    }
    if (rc == 0 && (rc = uv_listen((uv_stream_t *)&d->listener, 128,
                                   on_connection)) < 0)
        snprintf(err, errlen, "listen: %s", uv_strerror(rc));
    d->listening = rc == 0;
    return rc;
}
