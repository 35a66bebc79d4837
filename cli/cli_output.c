/* cli_output.c: where `kwarm get -o PATH` puts a cubin.
 *
 * A regular or absent file is replaced atomically (temporary file and
 * rename), so a reader never sees half a cubin.  A character device or a
 * FIFO is written in place: renaming over /dev/null as root would turn it
 * into a regular file, and `-o /dev/stdout` must reach the caller's pipe.
 * "-" is standard output.  A directory and anything else is refused.
 */
#define _XOPEN_SOURCE 700 /* realpath() */
#include "cli.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "kw_err.h"

/* Writes all of data to fd, retrying EINTR and short writes.  0 or
 * -errno. */
static int write_all(int fd, const void *data, size_t len)
{
    for (size_t off = 0; off < len;) {
        ssize_t w = write(fd, (const char *)data + off, len - off);
        if (w < 0 && errno != EINTR)
            return -errno;
        if (w > 0)
            off += (size_t)w;
    }
    return 0;
}

int kw__cli_write_atomic(const char *path, const void *data, size_t len)
{
    size_t n = strlen(path);
    char *tmp = malloc(n + sizeof ".tmp.XXXXXX");
    if (tmp == NULL)
        return -ENOMEM;
    memcpy(tmp, path, n);
    memcpy(tmp + n, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    int fd = mkstemp(tmp), rc = 0;
    if (fd < 0) {
        rc = -errno;
        free(tmp);
        return rc;
    }
    mode_t mask = umask(0); /* mkstemp makes 0600; give what open() would */
    umask(mask);
    if (fchmod(fd, 0644 & ~mask) < 0)
        rc = -errno;
    if (rc == 0)
        rc = write_all(fd, data, len);
    if (close(fd) < 0 && rc == 0)
        rc = -errno;
    if (rc == 0 && rename(tmp, path) < 0)
        rc = -errno;
    if (rc < 0)
        unlink(tmp);
    free(tmp);
    return rc;
}

/* How PATH is written, decided from what is there now. */
typedef enum out_kind {
    OUT_STDOUT,  /* "-" */
    OUT_ATOMIC,  /* regular or absent: temporary file and rename */
    OUT_INPLACE, /* character device or FIFO: open and write */
} out_kind;

/* True when the directory path would be created in exists. */
static bool parent_exists(const char *path)
{
    const char *slash = strrchr(path, '/');
    if (slash == NULL)
        return true; /* the working directory */
    char dir[4096];
    size_t n = slash == path ? 1 : (size_t)(slash - path);
    if (n >= sizeof dir)
        return false;
    memcpy(dir, path, n);
    dir[n] = '\0';
    struct stat st;
    return stat(dir, &st) == 0 && S_ISDIR(st.st_mode);
}

/* Classifies path; prints the refusal and returns an exit code, else -1
 * with *kind (and *st when the path exists, st->st_mode 0 otherwise). */
static int classify(const char *cmd, const char *path, out_kind *kind,
                    struct stat *st)
{
    memset(st, 0, sizeof *st);
    if (path[0] == '\0') {
        kw__cli_err(cmd, "-o: an empty path (name a file, or - for standard "
                    "output)");
        return KW_CLI_USAGE;
    }
    if (strcmp(path, "-") == 0) {
        if (isatty(STDOUT_FILENO)) {
            kw__cli_err(cmd, "-o -: standard output is a terminal; redirect "
                        "it to a file or a pipe, or name a file");
            return KW_CLI_USAGE;
        }
        *kind = OUT_STDOUT;
        return -1;
    }
    if (stat(path, st) < 0) {
        int e = errno;
        if (e == ENOENT && parent_exists(path)) {
            *kind = OUT_ATOMIC;
            return -1;
        }
        /* A path that cannot name a file is bad input, as a missing
         * --cache directory is (exit 2); EACCES and the like are not. */
        kw__cli_err(cmd, "-o %s: %s", path, e == ENOENT
                    ? "its directory does not exist" : strerror(e));
        return e == ENOENT || e == ENOTDIR || e == ENAMETOOLONG
                   ? KW_CLI_USAGE : KW_CLI_RUNTIME;
    }
    if (S_ISREG(st->st_mode))
        *kind = OUT_ATOMIC;
    else if (S_ISCHR(st->st_mode) || S_ISFIFO(st->st_mode))
        *kind = OUT_INPLACE;
    else {
        kw__cli_err(cmd, "-o %s: %s", path, S_ISDIR(st->st_mode)
                    ? "is a directory (name the file to write)"
                    : "not a regular file, character device or FIFO");
        return KW_CLI_USAGE;
    }
    return -1;
}

int kw__cli_output_check(const char *cmd, const char *path)
{
    out_kind kind;
    struct stat st;
    return classify(cmd, path, &kind, &st);
}

/* True when st is the file standard output is open on: the summary line
 * then goes to stderr, so it never lands inside the cubin. */
static bool is_stdout(const struct stat *st)
{
    struct stat so;
    return st->st_mode != 0 && fstat(STDOUT_FILENO, &so) == 0 &&
           so.st_dev == st->st_dev && so.st_ino == st->st_ino;
}

/* Writes a regular file atomically; through a symbolic link the target is
 * replaced, never the link (/dev/stdout redirected to a file). */
static int write_regular(const char *path, const void *data, size_t len)
{
    struct stat lst;
    if (lstat(path, &lst) < 0 || !S_ISLNK(lst.st_mode))
        return kw__cli_write_atomic(path, data, len);
    char *real = realpath(path, NULL);
    if (real == NULL)
        return -errno;
    int rc = kw__cli_write_atomic(real, data, len);
    free(real);
    return rc;
}

/* Opens a device or FIFO and writes to it in place. */
static int write_inplace(const char *path, const void *data, size_t len)
{
    int fd = open(path, O_WRONLY | O_NOCTTY | O_CLOEXEC);
    if (fd < 0)
        return -errno;
    int rc = write_all(fd, data, len);
    if (close(fd) < 0 && rc == 0 && errno != EINTR)
        rc = -errno;
    return rc;
}

int kw__cli_put_cubin(const char *cmd, const char *path, const void *data,
                      size_t len, const char *family, const char *arch,
                      const char *entry)
{
    out_kind kind;
    struct stat st;
    int rc = classify(cmd, path, &kind, &st);
    if (rc >= 0)
        return rc;
    bool to_stdout = kind == OUT_STDOUT || is_stdout(&st);
    if (kind == OUT_STDOUT)
        rc = write_all(STDOUT_FILENO, data, len);
    else if (kind == OUT_INPLACE)
        rc = write_inplace(path, data, len);
    else
        rc = write_regular(path, data, len);
    if (rc < 0) {
        kw__cli_err(cmd, "-o %s: %s", path, kw_strerror(rc));
        return KW_CLI_RUNTIME;
    }
    fprintf(to_stdout ? stderr : stdout, "%s: %zu bytes, %s %s, entry %s\n",
            kind == OUT_STDOUT ? "stdout" : path, len, family, arch, entry);
    return KW_CLI_OK;
}
