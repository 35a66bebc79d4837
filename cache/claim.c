/* claim.c: claims on digests across processes (kw_cache.h, internal.h).
 *
 * Two writers of one cache (two `kwarm prewarm`, or one beside kwarmd)
 * each single-flight their own keys; a claim makes one key's compile one
 * across them.  A claim is an open-file-description write lock
 * (F_OFD_SETLK) on one byte of DIR/claims, at an offset taken from the
 * digest.  Such a lock belongs to the open file description, not to the
 * process or thread: each claim opens the file itself (O_CLOEXEC, so no
 * compile worker inherits it), so two claims of one digest exclude each
 * other in one process too, and the kernel drops the lock when the
 * holder closes the file or dies, SIGKILL included: a dead holder never
 * leaves a key claimed.
 *
 * A digest is BLAKE2b output, so its first 62 bits are uniform: two keys
 * share an offset with odds of 2^-62, and then only wait for each other.
 * The file stays empty (a lock may lie past the end of a file).
 *
 * A wait polls (1 ms, doubling to 50 ms): F_OFD_SETLKW blocks in the
 * kernel, and only a signal could end it when the pipeline stops.  The
 * holder compiles for seconds, so the poll's cost and delay are noise.
 *
 * When DIR/claims cannot be created (an unwritable directory whose LMDB
 * files are writable, a read-only mount), a writable handle still works
 * without claims: kw_cache_claims_note() says why.  A read-only handle
 * compiles nothing and takes no claims.
 */
#define _GNU_SOURCE /* F_OFD_SETLK */
#include "kw_cache.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "internal.h"
#include "kw_err.h"

#define NAP_FIRST_MS 1
#define NAP_MAX_MS 50

struct kw_cache_claim {
    int fd; /* holds the lock; closing it releases */
};

void kw__cache_claims_init(kw_cache *c, const char *dir)
{
    c->claims_path = NULL;
    c->claims_note[0] = '\0';
    if (c->read_only)
        return;
    size_t n = strlen(dir) + sizeof "/claims";
    char *path = malloc(n);
    if (path == NULL) {
        snprintf(c->claims_note, sizeof c->claims_note,
                 "%s/claims: out of memory", dir);
        return;
    }
    snprintf(path, n, "%s/claims", dir);
    /* 0640, as the LMDB files (open.c): the group of the cache reads it */
    int fd = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0640);
    if (fd < 0) {
        snprintf(c->claims_note, sizeof c->claims_note,
                 "%s: %s: two writers of this cache may compile one key "
                 "twice", path, strerror(errno));
        free(path);
        return;
    }
    close(fd);
    c->claims_path = path;
}

void kw__cache_claims_destroy(kw_cache *c)
{
    free(c->claims_path);
    c->claims_path = NULL;
}

const char *kw_cache_claims_note(const kw_cache *c)
{
    return c && c->claims_note[0] ? c->claims_note : NULL;
}

/* The byte of the claims file that stands for digest. */
static off_t offset_of(const uint8_t *digest)
{
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v = v << 8 | digest[i];
    return (off_t)(v >> 2); /* below 2^62: a valid, positive off_t */
}

static void nap_ms(unsigned ms)
{
    struct timespec ts = {ms / 1000, (long)(ms % 1000) * 1000000L};
    while (nanosleep(&ts, &ts) < 0 && errno == EINTR)
        ;
}

/* Takes the lock on fd at off: 0; -EAGAIN when another holds it and
 * wait is false; -ECANCELED when stop said so while waiting; another
 * -errno when the lock cannot be taken at all. */
static int lock_byte(int fd, off_t off, bool wait, kw_cache_stop_fn stop,
                     void *arg)
{
    struct flock fl = {.l_type = F_WRLCK, .l_whence = SEEK_SET,
                       .l_start = off, .l_len = 1};
    unsigned nap = NAP_FIRST_MS;
    for (;;) {
        if (fcntl(fd, F_OFD_SETLK, &fl) == 0)
            return 0;
        if (errno == EINTR)
            continue;
        if (errno != EAGAIN && errno != EACCES)
            return -errno;
        if (!wait)
            return -EAGAIN;
        if (stop != NULL && stop(arg))
            return -ECANCELED;
        nap_ms(nap);
        nap = nap * 2 > NAP_MAX_MS ? NAP_MAX_MS : nap * 2;
    }
}

int kw_cache_claim_take(kw_cache *c,
                        const uint8_t digest[KW_CACHE_DIGEST_LEN], bool wait,
                        kw_cache_stop_fn stop, void *arg,
                        kw_cache_claim **out)
{
    if (out == NULL)
        return KW_EINVAL;
    *out = NULL;
    if (c == NULL || digest == NULL)
        return KW_EINVAL;
    if (c->claims_path == NULL) /* claims off: the caller goes on alone */
        return 0;
    kw_cache_claim *cl = malloc(sizeof *cl);
    if (cl == NULL)
        return KW_ENOMEM;
    cl->fd = open(c->claims_path, O_RDWR | O_CLOEXEC);
    int rc = cl->fd < 0 ? -errno : lock_byte(cl->fd, offset_of(digest), wait,
                                             stop, arg);
    if (rc == 0) {
        *out = cl;
        return 0;
    }
    if (cl->fd >= 0)
        close(cl->fd);
    free(cl);
    /* A file that cannot be opened or locked now (EMFILE, ENOLCK) costs
     * single flight for this key only: the caller goes on unclaimed. */
    return rc == -EAGAIN || rc == -ECANCELED ? rc : 0;
}

void kw_cache_claim_drop(kw_cache_claim *cl)
{
    if (cl == NULL)
        return;
    close(cl->fd);
    free(cl);
}
