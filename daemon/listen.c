/* listen.c: the listening socket, and accepting peers on the main loop:
 * each accepted socket goes to a serving loop (kw__loops_hand), which
 * takes it (peer.c).
 */
#include "loops.h"

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
