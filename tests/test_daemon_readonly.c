/* test_daemon_readonly.c: kwarmd on a cache it may not write (issue 12
 * point 4): --read-only, and on its own when the directory is not
 * writable (kwarmd as nobody on root's 0755 cache).  Hits are served, a
 * miss is "not cached (read-only cache)" and never compiled, stats says
 * read_only, and the cache is left as it was. */
#include "daemon_util.h"

#include <pthread.h>
#include <pwd.h>
#include <stdatomic.h>
#include <sys/mount.h>
#include <sys/socket.h>

#include <sodium.h>

#include "kw_cache.h"

/* Each test's daemons are killed and their directories removed. */
TestSuite(daemon_readonly, .fini = kwd_cleanup);

#define V32 KW_FIXTURES "/deepseek-v3.2-exp.json"

/* A cache of V32 prewarmed by us (root), readable by all. */
static void prewarm(const char *cache)
{
    const char *pw[] = {"prewarm", "--model", V32, "--cache", cache, "--quiet", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_kwarm(pw, &out, &err), 0, "%s", err);
    free(out);
    free(err);
    cr_assert_eq(chmod(cache, 0755), 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "chmod -R a+rX '%s'", cache);
    cr_assert_eq(system(cmd), 0);
}

/* What a read-only kwarmd must do, over c. */
static void expect_read_only(kwc *c, const char *cache)
{
    const char *ls[] = {"ls", "--cache", cache, "--json", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_kwarm(ls, &out, &err), 0, "%s", err);
    cJSON *doc = cJSON_Parse(out);
    const char *hex = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "entries"), 0),
        "digest"));
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", hex);
    kwr r = kwc_call(c, KW_PROTO_GET, g, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "a hit on a read-only cache");
    kwr_free(&r);
    /* A key nobody warmed, by family and fields: not compiled. */
    cJSON *m = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(m, "fields");
    cJSON_AddStringToObject(m, "family", "dcp_stable_topk");
    cJSON_AddNumberToObject(f, "topk", 2048);
    cJSON_AddNumberToObject(f, "num_candidates", 12288);
    cJSON_AddStringToObject(m, "arch", "sm_90");
    r = kwc_call(c, KW_PROTO_GET, m, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, "a miss on a read-only cache");
    cr_expect_str_eq(kwr_str(&r, "code"), "KW_EROFS");
    cr_expect(strstr(kwr_str(&r, "error"), "not cached (read-only cache)"), "%s",
              kwr_str(&r, "error"));
    kwr_free(&r);
    kwr st = kwc_call(c, KW_PROTO_STATS, NULL, NULL);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(st.hdr, "read_only")));
    cr_expect_eq(kwr_num(&st, "compiles_started"), 0, "nothing compiled");
    cr_expect_eq(kwr_num(&st, "entries"), cJSON_GetArraySize(
                     cJSON_GetObjectItemCaseSensitive(doc, "entries")));
    kwr_free(&st);
    cJSON_Delete(g);
    cJSON_Delete(m);
    cJSON_Delete(doc);
    free(out);
    free(err);
}

/* Connects to the started d, checks it is read-only, stops it, and finds
 * needle (why it is read-only) in its log. */
static void expect_read_only_daemon(kwd *d, const char *needle)
{
    kwc c;
    kwc_must_open(&c, d->sock);
    expect_read_only(&c, d->cache);
    kwd_down(d, &c);
    char *log = kwd_log(d->log);
    cr_expect(strstr(log, needle) != NULL, "%s", log);
    free(log);
}

Test(daemon_readonly, read_only_flag_serves_hits_and_compiles_nothing)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd d;
    kwd_init(&d, "kwro-flag");
    prewarm(d.cache);
    kwd_start(&d, 1, (const char *const[]){"--read-only", NULL});
    expect_read_only_daemon(&d, "is read-only (--read-only)");
}

/* Starts kwarmd as nobody on d's cache (root's, which nobody cannot
 * write) and waits for READY=1.  Root only. */
static void start_as_nobody(kwd *d)
{
    struct passwd *pw = getpwnam("nobody");
    cr_assert_not_null(pw);
    /* nobody needs its socket's directory and the notify socket. */
    cr_assert_eq(chmod(d->dir, 0777), 0);
    cr_assert_eq(chmod(d->notify, 0777), 0);
    const char *args[] = {"--socket", d->sock, "--cache", d->cache, "--jobs",
                          "1", NULL};
    char uid[16];
    snprintf(uid, sizeof uid, "%u", (unsigned)pw->pw_uid);
    cr_assert_eq(setenv("KWD_TEST_AS_UID", uid, 1), 0);
    d->pid = kwd_spawn(d, args, d->log);
    cr_assert_eq(unsetenv("KWD_TEST_AS_UID"), 0);
    kwd_wait_ready(d);
}

Test(daemon_readonly, a_cache_it_cannot_write_makes_kwarmd_read_only)
{
    if (geteuid() != 0)
        cr_skip_test("not root: cannot run kwarmd as nobody");
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd d;
    kwd_init(&d, "kwro-nobody");
    prewarm(d.cache);
    start_as_nobody(&d);
    expect_read_only_daemon(&d, "is read-only (not writable here)");
}

/* ---- on a read-only bind mount (root only) -------------------------------- */

static char mnt[300];

static void umount_ro(void)
{
    if (mnt[0] != '\0')
        umount2(mnt, MNT_DETACH);
    mnt[0] = '\0';
    kwd_cleanup(); /* the directory, once nothing is mounted in it */
}

Test(daemon_readonly, a_read_only_mount_makes_kwarmd_read_only, .fini = umount_ro)
{
    if (geteuid() != 0)
        cr_skip_test("not root: cannot mount");
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd d;
    kwd_init(&d, "kwro-mount");
    char ro[200];
    snprintf(ro, sizeof ro, "%s/ro", d.dir);
    prewarm(d.cache);
    cr_assert_eq(mkdir(ro, 0755), 0);
    if (mount(d.cache, ro, NULL, MS_BIND, NULL) != 0)
        cr_skip_test("bind mount refused: %s", strerror(errno));
    snprintf(mnt, sizeof mnt, "%s", ro);
    cr_assert_eq(mount(NULL, ro, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL), 0,
                 "remount read-only: %s", strerror(errno));
    cr_assert_eq(access(ro, W_OK), -1, "the mount is writable");
    /* kwarmd --cache ro, no --read-only: it must notice on its own. */
    snprintf(d.cache, sizeof d.cache, "%s", ro);
    kwd_start(&d, 1, NULL);
    expect_read_only_daemon(&d, "is read-only (not writable here)");
}

/* ---- a lockless cache never serves from its map (issue 23) ------------ */

typedef struct churn {
    const char *dir;
    const uint8_t *digest; /* the entry the reader reads, and its bytes */
    const void *blob;
    size_t len;
    _Atomic bool stop;
    unsigned commits;
} churn;

/* A writer in this process: rewrites the reader's entry (same bytes, new
 * pages: its old pages are freed) and puts and removes other 200 KB
 * entries as fast as it can, so that freed pages are reused under a
 * lockless reader. */
static void *churn_main(void *arg)
{
    churn *ch = arg;
    kw_cache_opts o = {.dir = ch->dir};
    kw_cache *c = NULL;
    char err[256];
    if (kw_cache_open(&c, &o, err, sizeof err) < 0)
        return NULL;
    static uint8_t blob[204800];
    kw_cache_info info = {.size = sizeof blob};
    snprintf(info.family, sizeof info.family, "dcp_stable_topk");
    snprintf(info.arch, sizeof info.arch, "sm_90");
    snprintf(info.entry, sizeof info.entry, "x");
    for (unsigned i = 0; !atomic_load(&ch->stop); i++) {
        uint8_t dg[KW_CACHE_DIGEST_LEN] = {0xee, (uint8_t)i, (uint8_t)(i >> 8)};
        memset(blob, (int)i, sizeof blob);
        bool stored;
        kw_cache_info mine;
        void *tmp = NULL;
        size_t tl = 0;
        if (kw_cache_get(c, ch->digest, &tmp, &tl, &mine) == 0) {
            kw_cache_remove(c, ch->digest);
            kw_cache_put(c, ch->digest, &mine, ch->blob, ch->len, false, &stored);
        }
        free(tmp);
        if (kw_cache_put(c, dg, &info, blob, sizeof blob, false, &stored) == 0)
            ch->commits++;
        uint8_t old[KW_CACHE_DIGEST_LEN] = {0xee, (uint8_t)(i - 2),
                                            (uint8_t)((i - 2) >> 8)};
        kw_cache_remove(c, old);
    }
    kw_cache_close(c);
    return NULL;
}

/* Reads one frame slowly: 4 KiB at a time, a pause between reads. */
static kwr slow_recv(kwc *c)
{
    for (;;) {
        kwr r;
        uint8_t tmp[4096];
        size_t used = 0;
        kw_msg m;
        if (c->len > 0 && kw_proto_parse_reply(c->buf, c->len, &m, &used) ==
                              KW_PROTO_OK) {
            kw_msg_destroy(&m);
            cr_assert_eq(kwc_recv(c, &r, 1000), 0);
            return r;
        }
        ssize_t n = recv(c->fd, tmp, sizeof tmp, 0);
        cr_assert(n > 0, "recv: %zd", n);
        if (c->cap - c->len < sizeof tmp) {
            c->cap = c->cap ? 2 * c->cap : 1 << 20;
            c->buf = realloc(c->buf, c->cap);
            cr_assert_not_null(c->buf);
        }
        memcpy(c->buf + c->len, tmp, (size_t)n);
        c->len += (size_t)n;
        kwd_nap_ms(1); /* a slow reader's pace, not a synchronisation */
    }
}

/* kwarmd as nobody on root's cache opens it MDB_NOLOCK (it cannot write
 * the lock file); a writer (root, here) commits all the while a slow
 * client drains 200 KB hits: every byte received is the entry's. */
Test(daemon_readonly, a_lockless_cache_serves_only_checked_bytes_to_a_slow_reader)
{
    if (geteuid() != 0)
        cr_skip_test("not root: cannot run kwarmd as nobody");
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "204800", 1), 0);
    kwd d;
    kwd_init(&d, "kwro-nolock");
    prewarm(d.cache);
    /* the entry's bytes, as root reads them */
    kw_cache_opts ro = {.dir = d.cache, .read_only = true};
    kw_cache *rc = NULL;
    char err[256];
    cr_assert_eq(kw_cache_open(&rc, &ro, err, sizeof err), 0, "%s", err);
    uint8_t digest[KW_CACHE_DIGEST_LEN];
    const char *ls[] = {"ls", "--cache", d.cache, "--json", NULL};
    char *out = NULL, *errs = NULL;
    cr_assert_eq(kw_test_kwarm(ls, &out, &errs), 0, "%s", errs);
    cJSON *doc = cJSON_Parse(out);
    const char *hex = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "entries"), 0),
        "digest"));
    cr_assert_not_null(hex);
    size_t n = 0;
    cr_assert_eq(sodium_hex2bin(digest, sizeof digest, hex, 64, NULL, &n, NULL), 0);
    void *want = NULL;
    size_t want_len = 0;
    cr_assert_eq(kw_cache_get(rc, digest, &want, &want_len, NULL), 0);
    kw_cache_close(rc);
    cr_assert_eq(want_len, 204800);
    start_as_nobody(&d);
    churn ch = {.dir = d.cache, .digest = digest, .blob = want, .len = want_len};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, churn_main, &ch), 0);
    kwc c;
    kwc_must_open(&c, d.sock);
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", hex);
    /* Three gets at a time: the socket's buffer takes the first reply
     * whole, so the second's rest waits in kwarmd, where it would be
     * written from the map while the reader dawdles. */
    for (int i = 0; i < 12; i++) {
        if (i % 3 == 0)
            for (int k = 0; k < 3; k++)
                cr_assert_eq(kwc_send(&c, KW_PROTO_GET, g), 0);
        kwr r = slow_recv(&c);
        if (r.type == KW_PROTO_RESULT) {
            cr_assert_eq(r.payload_len, want_len);
            cr_assert(memcmp(r.payload, want, want_len) == 0,
                      "reply %d: bytes that are not the entry's", i);
        } else { /* a copy that failed its check is an error, never bytes */
            kwr_expect_type(&r, KW_PROTO_ERROR, "a lockless hit");
        }
        kwr_free(&r);
    }
    atomic_store(&ch.stop, true);
    pthread_join(th, NULL);
    cr_log_info("%u commits while 12 slow replies were read", ch.commits);
    cr_expect(ch.commits > 10, "the writer barely ran");
    cJSON_Delete(g);
    cJSON_Delete(doc);
    free(out);
    free(errs);
    free(want);
    kwd_down(&d, &c);
}
