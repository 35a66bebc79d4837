/* soak_hostile.h: the extra traffic of `bench_soak --hostile` (issue 11):
 * big warmups with evicts, and hostile clients, each a thread looping
 * until the soak's deadline.  Included by bench_soak.c after `shared`. */
#ifndef KW_SOAK_HOSTILE_H
#define KW_SOAK_HOSTILE_H

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>

#include "kw_proto.h"

static int soak_connect(const char *sock, bool nb)
{
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (nb ? SOCK_NONBLOCK : 0), 0);
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    snprintf(sa.sun_path, sizeof sa.sun_path, "%s", sock);
    if (fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) < 0 &&
        errno != EINPROGRESS) {
        close(fd);
        return -1;
    }
    return fd;
}

/* Writes all of buf to a non-blocking fd, waiting at most ms for room;
 * returns the bytes written. */
static size_t soak_push(int fd, const void *buf, size_t len, int ms)
{
    size_t off = 0;
    while (off < len) {
        ssize_t w = send(fd, (const char *)buf + off, len - off, MSG_NOSIGNAL);
        if (w > 0) {
            off += (size_t)w;
            continue;
        }
        struct pollfd p = {fd, POLLOUT, 0};
        if ((w < 0 && errno != EAGAIN) || poll(&p, 1, ms) <= 0)
            break;
    }
    return off;
}

/* The first digest of manifest that the well-behaved clients never ask
 * for (deployments share keys: V4-Flash at DCP world 401 derives the very
 * first key of V3.2 at world 2), or NULL. */
static const char *soak_evictable(const shared *s, const cJSON *manifest)
{
    const cJSON *e;
    cJSON_ArrayForEach(e, manifest) {
        const cJSON *dg = cJSON_GetObjectItem(e, "digest");
        bool theirs = false;
        for (size_t i = 0; cJSON_IsString(dg) && i < s->ndigests && !theirs; i++)
            theirs = strcmp(s->digests[i], dg->valuestring) == 0;
        if (cJSON_IsString(dg) && !theirs)
            return dg->valuestring;
    }
    return NULL;
}

/* Every minute a warmup of a deployment not warmed before (about 5,000
 * keys: V4-Flash over a new DCP world, two archs), then an evict of one of
 * its keys that the clients' gets do not name (evicting one they name
 * makes their gets by digest miss, as it should).  Failures count. */
static void *soak_big_warmups(void *arg)
{
    shared *s = arg;
    char *v4 = bench_slurp("tests/fixtures/deepseek-v4-flash.json");
    kw_client *c = NULL;
    if (v4 == NULL || kw_client_connect(&c, s->sock, 30000, NULL, 0) < 0) {
        atomic_fetch_add(&s->failed, 1);
        free(v4);
        return NULL;
    }
    kw_client_set_timeout(c, 0);
    for (int world = s->world; bench_now_ns() < s->deadline; world = ++s->world) {
        double next = bench_now_ns() + 60e9;
        char dep[96], *res = NULL;
        snprintf(dep, sizeof dep, "{\"dcp_world\": %d, \"arch\": \"sm_90,sm_100\"}", world);
        int rc = kw_client_warmup(c, v4, dep, "v4.json", NULL, NULL, &res);
        cJSON *doc = rc == 0 ? cJSON_Parse(res) : NULL;
        const char *dg = soak_evictable(s, cJSON_GetObjectItem(doc, "manifest"));
        bool evicted = false;
        if (rc == 0 && dg != NULL)
            rc = kw_client_evict(c, dg, &evicted);
        atomic_fetch_add(&s->big_warmups, 1);
        atomic_fetch_add(&s->evicts, 1);
        if (rc < 0 || !evicted) {
            atomic_fetch_add(&s->failed, 1);
            fprintf(stderr, "soak: big warmup or evict failed (rc %d, evicted %d): "
                    "%s\n", rc, evicted, kw_client_last_error(c));
        }
        cJSON_Delete(doc);
        free(res);
        while (bench_now_ns() < next && bench_now_ns() < s->deadline)
            nanosleep(&(struct timespec){0, 200 * 1000 * 1000}, NULL);
    }
    kw_client_close(c);
    free(v4);
    return NULL;
}

/* The hostile mix, round after round: a pipeliner that never reads (it
 * holds its connection 2 s, then drops it), a slow reader of 50 stats,
 * 64 KiB of random bytes, 100 idle connections held 1 s, and 1,000
 * connects and disconnects. */
static void *soak_hostile(void *arg)
{
    shared *s = arg;
    unsigned seed = 99;
    uint8_t *get = NULL, *stats = NULL, junk[65536];
    size_t glen = 0, slen = 0;
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", s->digests[0]);
    if (kw_proto_encode(KW_PROTO_GET, g, NULL, 0, &get, &glen) < 0 ||
        kw_proto_encode(KW_PROTO_STATS, NULL, NULL, 0, &stats, &slen) < 0)
        return NULL;
    while (bench_now_ns() < s->deadline) {
        int fd = soak_connect(s->sock, true);
        for (int i = 0; fd >= 0 && i < 20000 && soak_push(fd, get, glen, 200) == glen; i++)
            ;
        int slow = soak_connect(s->sock, false);
        for (int i = 0; slow >= 0 && i < 50; i++) {
            char buf[4096];
            if (send(slow, stats, slen, MSG_NOSIGNAL) < 0 || read(slow, buf, 64) <= 0)
                break; /* partial reads: the rest waits in the socket */
        }
        int noise = soak_connect(s->sock, true);
        for (size_t i = 0; i < sizeof junk; i++)
            junk[i] = (uint8_t)rand_r(&seed);
        if (noise >= 0)
            soak_push(noise, junk, sizeof junk, 200);
        int idle[100];
        for (int i = 0; i < 100; i++)
            idle[i] = soak_connect(s->sock, false);
        nanosleep(&(struct timespec){1, 0}, NULL);
        for (int i = 0; i < 100; i++)
            if (idle[i] >= 0)
                close(idle[i]);
        for (int i = 0; i < 1000; i++) {
            int x = soak_connect(s->sock, false);
            if (x >= 0)
                close(x);
        }
        nanosleep(&(struct timespec){1, 0}, NULL);
        int fds[] = {fd, slow, noise};
        for (int i = 0; i < 3; i++)
            if (fds[i] >= 0)
                close(fds[i]);
        atomic_fetch_add(&s->hostile_conns, 1104);
    }
    free(get);
    free(stats);
    cJSON_Delete(g);
    return NULL;
}

#endif /* KW_SOAK_HOSTILE_H */
