/* peer.c: taking an accepted peer on a serving loop: its credentials,
 * the allowlist and the connection cap, then serving (conn.h).
 *
 * _GNU_SOURCE: struct ucred and SO_PEERCRED (Linux) to learn each peer's
 * uid and gid at accept.
 */
#define _GNU_SOURCE
#include "conn.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

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
