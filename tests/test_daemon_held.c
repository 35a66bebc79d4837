/* test_daemon_held.c: kwarmd writes a hit straight from the cache's map
 * (issue 14 point 2).  A reply the socket does not take at once holds its
 * read snapshot until written: at most --max-held-reads at once, none for
 * longer than --held-read-timeout.  Each cap is tested on both sides, and
 * the snapshot is seen in LMDB's own reader table.
 */
#include "daemon_util.h"

#include <lmdb.h>

#include "kw_cache.h"

/* Each test's daemons are killed and their directories removed. */
TestSuite(held, .fini = kwd_cleanup);

#define V32 "deepseek-v3.2-exp.json"
#define BIG 204800   /* the stand-in cubin: far over a socket's buffer */
#define GETS 20      /* pipelined per stuck client: 4 MB, under --max-output */

/* Stores key `index` of V32 as a BIG-byte cubin through a compiling get
 * (the worker's stand-in: KWARM_TEST_INSTANT_COMPILE=BIG) and returns its
 * bytes (*cubin, malloc'd) and digest. */
static void big_cubin(kwc *c, int index, char digest[65], uint8_t **cubin)
{
    kwr r = kwd_get_key(c, V32, 2, index);
    cr_assert_eq(r.payload_len, BIG, "a cubin of %zu bytes", r.payload_len);
    snprintf(digest, 65, "%s", kwr_str(&r, "digest"));
    *cubin = r.payload;
    r.payload = NULL;
    kwr_free(&r);
}

/* A kwarmd (jobs 1, extra flags) with one BIG cubin stored. */
static void held_up(kwd *d, const char *tag, const char *const *extra, kwc *c,
                    char digest[65], uint8_t **cubin)
{
    char big[16];
    snprintf(big, sizeof big, "%d", BIG);
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", big, 1), 0);
    kwd_up(d, tag, 1, extra, c);
    big_cubin(c, 0, digest, cubin);
}

/* A client that sends GETS gets of digest and reads nothing. */
static void send_gets(kwc *c, const char *digest)
{
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", digest);
    for (int i = 0; i < GETS; i++)
        cr_assert_eq(kwc_send(c, KW_PROTO_GET, g), 0, "get %d", i);
    cJSON_Delete(g);
}

/* Waits (bounded) until stats `name` reaches want; returns its value. */
static double wait_stat(kwc *c, const char *name, double want)
{
    int64_t deadline = kwd_now_ms() + 30000;
    double v;
    while ((v = kwc_stat(c, name)) < want && kwd_now_ms() < deadline)
        kwd_nap_ms(5); /* polling a counter with a deadline */
    return v;
}

/* Read transactions live in the cache's LMDB reader table now: readers
 * with a transaction id (a reset, pooled one shows "-"). */
static int mdb_reader_cb(const char *msg, void *ctx)
{
    unsigned long pid;
    char tid[32], txn[32];
    if (sscanf(msg, " %lu %31s %31s", &pid, tid, txn) == 3 &&
        strcmp(txn, "-") != 0)
        ++*(int *)ctx;
    return 0;
}

static int live_readers(const kwd *d)
{
    const char *dir = d->cache;
    MDB_env *env;
    int n = 0;
    cr_assert_eq(mdb_env_create(&env), 0);
    cr_assert_eq(mdb_env_set_maxreaders(env, 256), 0);
    cr_assert_eq(mdb_env_set_maxdbs(env, 16), 0);
    int rc = mdb_env_open(env, dir, MDB_RDONLY | MDB_NOTLS, 0600);
    cr_assert_eq(rc, 0, "mdb_env_open %s: %s", dir, mdb_strerror(rc));
    cr_assert_geq(mdb_reader_list(env, mdb_reader_cb, &n), 0);
    mdb_env_close(env);
    return n;
}

/* Waits (bounded) until no read transaction is live: other threads (the
 * warm pipeline, a stats request) hold one a moment now and then. */
static int wait_no_readers(const kwd *d)
{
    int64_t deadline = kwd_now_ms() + 10000;
    int live;
    while ((live = live_readers(d)) > 0 && kwd_now_ms() < deadline)
        kwd_nap_ms(5); /* polling the reader table with a deadline */
    return live;
}

/* Reads the GETS replies of c and checks each against cubin. */
static void read_gets(kwc *c, const uint8_t *cubin, const char *who)
{
    for (int i = 0; i < GETS; i++) {
        kwr r = kwc_must_recv(c, KWD_REPLY_MS);
        kwr_expect_type(&r, KW_PROTO_RESULT, who);
        cr_assert_eq(r.payload_len, BIG, "%s: reply %d of %zu bytes", who, i,
                     r.payload_len);
        cr_assert(memcmp(r.payload, cubin, BIG) == 0, "%s: reply %d differs",
                  who, i);
        kwr_free(&r);
    }
}

Test(held, a_client_that_never_reads_cannot_hold_a_snapshot_past_the_cap)
{
    kwd d;
    kwc c, stuck;
    char digest[65];
    uint8_t *cubin;
    const char *extra[] = {"--held-read-timeout", "1500", NULL};
    held_up(&d, "kwh-held", extra, &c, digest, &cubin);
    cr_expect_eq(wait_no_readers(&d), 0, "a snapshot held before any client");
    kwc_must_open(&stuck, d.sock);
    send_gets(&stuck, digest);
    cr_assert_eq(wait_stat(&c, "held_reads", 1), 1, "no reply held a snapshot");
    int held_at = (int)kwd_now_ms();
    cr_expect_geq(live_readers(&d), 1, "held, but LMDB lists no live reader");
    /* The writer does not wait on it: a compile is stored meanwhile. */
    char other[65];
    uint8_t *second;
    big_cubin(&c, 1, other, &second);
    free(second);
    cr_expect_eq(kwc_stat(&c, "held_reads"), 1, "the hold ended early");
    /* Past --held-read-timeout kwarmd closes the connection: the peer
     * sees the hang-up without reading a byte. */
    struct pollfd p = {stuck.fd, POLLRDHUP, 0};
    cr_assert_eq(poll(&p, 1, 20000), 1, "the stuck client was not dropped");
    cr_log_info("dropped %d ms after the hold was seen (cap 1500 ms)",
                (int)kwd_now_ms() - held_at);
    cr_expect_eq(wait_stat(&c, "held_read_timeouts", 1), 1);
    cr_expect_eq(kwc_stat(&c, "held_reads"), 0);
    int live = wait_no_readers(&d);
    cr_expect_eq(live, 0, "%d readers still live after the drop", live);
    char *log = kwd_log(d.log);
    cr_expect_not_null(strstr(log, "held a cache snapshot"), "%s", log);
    free(log);
    kwc_close(&stuck);
    kwc_expect_pong(&c, "after the drop");
    free(cubin);
    kwd_down(&d, &c);
}

Test(held, past_the_count_cap_replies_are_copied_and_all_arrive_whole)
{
    kwd d;
    kwc c, stuck[5];
    char digest[65];
    uint8_t *cubin;
    const char *extra[] = {"--max-held-reads", "2", NULL};
    held_up(&d, "kwh-cap", extra, &c, digest, &cubin);
    for (int i = 0; i < 5; i++) {
        kwc_must_open(&stuck[i], d.sock);
        send_gets(&stuck[i], digest);
    }
    /* Five connections each wait on a reply: two hold a snapshot, and the
     * other three had theirs copied out (the cap was full). */
    cr_assert_eq(wait_stat(&c, "held_reads_copied", 3), 3);
    cr_expect_eq(kwc_stat(&c, "held_reads"), 2);
    cr_expect_geq(live_readers(&d), 2, "LMDB's reader table lists fewer");
    /* Read within --held-read-timeout (5 s): every reply arrives whole,
     * held or copied, and no connection was dropped. */
    for (int i = 0; i < 5; i++) {
        read_gets(&stuck[i], cubin, "a stuck client reading at last");
        kwc_expect_pong(&stuck[i], "after its replies");
        kwc_close(&stuck[i]);
    }
    cr_expect_eq(kwc_stat(&c, "held_reads"), 0);
    cr_expect_eq(kwc_stat(&c, "held_read_timeouts"), 0);
    free(cubin);
    kwd_down(&d, &c);
}

Test(held, with_no_held_reads_allowed_every_late_reply_is_copied)
{
    kwd d;
    kwc c, stuck;
    char digest[65];
    uint8_t *cubin;
    const char *extra[] = {"--max-held-reads", "0", NULL};
    held_up(&d, "kwh-zero", extra, &c, digest, &cubin);
    kwc_must_open(&stuck, d.sock);
    send_gets(&stuck, digest);
    cr_assert_eq(wait_stat(&c, "held_reads_copied", 1), 1);
    cr_expect_eq(kwc_stat(&c, "held_reads"), 0);
    read_gets(&stuck, cubin, "a client of a kwarmd that holds nothing");
    kwc_close(&stuck);
    free(cubin);
    kwd_down(&d, &c);
}

/* Hit headers are kept per loop (daemon/hits.c): a changed entry must get
 * a new one.  The entry is replaced behind kwarmd's back, through the
 * cache itself, with a cubin of another size. */
Test(held, a_hit_reply_follows_its_entry_when_the_entry_changes)
{
    kwd d;
    kwc c;
    char digest[65];
    uint8_t *cubin, raw[KW_CACHE_DIGEST_LEN];
    const char *extra[] = {"--loops", "1", NULL}; /* one table for all gets */
    held_up(&d, "kwh-memo", extra, &c, digest, &cubin);
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", digest);
    for (int i = 0; i < 3; i++) { /* the first builds the header, then kept */
        kwr r = kwc_call(&c, KW_PROTO_GET, g, NULL);
        kwr_expect_type(&r, KW_PROTO_RESULT, "a hit");
        cr_expect_eq(kwr_num(&r, "size"), BIG);
        kwr_free(&r);
    }
    for (int i = 0; i < KW_CACHE_DIGEST_LEN; i++)
        sscanf(digest + 2 * i, "%2hhx", &raw[i]);
    kw_cache_opts o = {.dir = d.cache};
    kw_cache *cache = NULL;
    char err[256];
    cr_assert_eq(kw_cache_open(&cache, &o, err, sizeof err), 0, "%s", err);
    kw_cache_info info;
    void *old = NULL;
    size_t old_len = 0;
    cr_assert_eq(kw_cache_get(cache, raw, &old, &old_len, &info), 0);
    cr_assert_eq(old_len, BIG);
    free(old);
    snprintf(info.entry, sizeof info.entry, "kw_replaced_entry");
    uint8_t small[4096];
    memset(small, 0x5a, sizeof small);
    bool stored = false;
    cr_assert_eq(kw_cache_remove(cache, raw), 0);
    cr_assert_eq(kw_cache_put(cache, raw, &info, small, sizeof small, false,
                              &stored), 0);
    cr_assert(stored);
    kw_cache_close(cache);
    kwr r = kwc_call(&c, KW_PROTO_GET, g, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "the hit after the change");
    cr_expect_eq(kwr_num(&r, "size"), sizeof small);
    cr_expect_str_eq(kwr_str(&r, "entry"), "kw_replaced_entry");
    cr_expect_eq(r.payload_len, sizeof small);
    cr_expect(r.payload_len == sizeof small &&
              memcmp(r.payload, small, sizeof small) == 0, "old bytes served");
    kwr_free(&r);
    cJSON_Delete(g);
    free(cubin);
    kwd_down(&d, &c);
}

/* The flags' bounds: each side of each. */
Test(held, the_flags_are_checked_at_start)
{
    static const struct {
        const char *flag, *value;
        bool ok;
    } cases[] = {{"--max-held-reads", "128", true},
                 {"--max-held-reads", "129", false},
                 {"--held-read-timeout", "10", true},
                 {"--held-read-timeout", "9", false}};
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        const char *argv[] = {KW_KWARMD_BIN, cases[i].flag, cases[i].value,
                              "--socket", "/nonexistent-dir/s.sock", NULL};
        char *out = NULL, *err = NULL;
        int st = kw_test_run(argv, &out, &err);
        /* accepted: it gets as far as the socket, which cannot exist (1) */
        cr_expect_eq(st, cases[i].ok ? 1 : 2, "%s %s: exit %d: %s",
                     cases[i].flag, cases[i].value, st, err);
        if (!cases[i].ok)
            cr_expect_not_null(strstr(err, cases[i].flag + 2), "%s", err);
        free(out);
        free(err);
    }
}
