/* test_remote_daemon.c: kwarmd with the fleet tier (--remote), black box:
 * two daemons with separate caches sharing one real redis-server.  A warm
 * node makes a new node warm, a key is compiled once across the fleet, a
 * Redis that dies mid-warmup costs nothing but the sharing, and tampered
 * entries are refused, recompiled and counted.  Issue 6. */
#include "daemon_util.h"
#include "remote_util.h"

#include <sodium.h>

#include "kw_remote.h"

#define V32 "deepseek-v3.2-exp.json" /* default deployment */
#define V32_KEYS v32_keys()

/* V32's key count, as `kwarm keys` derives it. */
static int v32_keys(void)
{
    static int n;
    if (n == 0)
        n = kwd_count_keys(V32, 0);
    return n;
}

static const uint8_t fleet_key[32] = "fleet-key-of-the-test-suite-0001";

static void suite_cleanup(void);
static void suite_cleanup(void)
{
    kwd_cleanup();
    rds_cleanup();
}

TestSuite(remote_daemon, .fini = suite_cleanup, .timeout = 600);

/* A daemon with the fleet tier on s: its key file is written in its own
 * directory; timeout_ms per Redis call.  A test about an outage takes a
 * short timeout; the others a long one, since a Redis call that times out
 * on a loaded machine marks the tier down, and both nodes then compile
 * (issue 23, point 7: 28 compiles for 26 keys once, beside two builds). */
static void up_remote_timeout(kwd *d, kwc *c, const char *tag, const rds *s,
                              const char *timeout_ms)
{
    char key[300];
    kwd_init(d, tag);
    rds_key_file(d->dir, "fleet.key", fleet_key, NULL, key, sizeof key);
    const char *extra[] = {"--remote", s->url, "--remote-key-file", key,
                           "--remote-timeout", timeout_ms, NULL};
    kwd_start(d, 2, extra);
    kwc_must_open(c, d->sock);
}

static void up_remote(kwd *d, kwc *c, const char *tag, const rds *s)
{
    up_remote_timeout(d, c, tag, s, "10000");
}

/* Waits until c's kwarmd has done every fleet write-back and lease
 * release it queued (they run on a thread of their own, after the local
 * put, so a warmup's RESULT can come first): polls the gauge with a
 * deadline. */
static void settle_writebacks(kwc *c)
{
    int64_t deadline = kwd_now_ms() + 30000;
    while (kwc_stat(c, "remote_writebacks_queued") > 0 &&
           kwd_now_ms() < deadline)
        kwd_nap_ms(5); /* polling a gauge with a deadline */
    cr_assert_eq(kwc_stat(c, "remote_writebacks_queued"), 0,
                 "write-backs still queued after 30 s");
}

/* Reads a warmup's frames to its RESULT (sent already). */
/* Reads a warmup to its RESULT, to which the streamed results are added
 * as "manifest"; *nprogress (may be NULL) gets how many were streamed. */
static kwr finish_warmup(kwc *c, size_t *nprogress)
{
    size_t n = 0;
    cJSON *items = cJSON_CreateArray();
    for (;;) {
        kwr r = kwc_must_recv(c, KWD_REPLY_MS);
        if (r.type != KW_PROTO_PROGRESS) {
            kwr_expect_type(&r, KW_PROTO_RESULT, "warmup");
            if (cJSON_GetArraySize(items) == (int)kwr_num(&r, "keys"))
                kwc_sort_results(items); /* all of them: key order */
            cJSON_AddItemToObject(r.hdr, "manifest", items);
            if (nprogress)
                *nprogress = n;
            return r;
        }
        n += kwc_take_items(&r, items);
        kwr_free(&r);
    }
}

static kwr warm(kwc *c)
{
    cJSON *h = kwd_model_hdr(V32, 0);
    cr_assert_eq(kwc_send(c, KW_PROTO_WARMUP, h), 0);
    cJSON_Delete(h);
    return finish_warmup(c, NULL);
}

/* The i-th digest of a warmup's manifest. */
static const char *manifest_digest(const kwr *r, int i)
{
    const cJSON *m = cJSON_GetObjectItemCaseSensitive(r->hdr, "manifest");
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(cJSON_GetArrayItem(m, i), "digest");
    cr_assert(cJSON_IsString(d), "manifest entry %d", i);
    return d->valuestring;
}

/* True when Redis holds a value for hex that verifies under the fleet key. */
static bool remote_has_valid(const rds *s, const char *hex)
{
    char key[128];
    uint8_t digest[32];
    size_t n = 0;
    snprintf(key, sizeof key, "kwarm:v1:%s", hex);
    cr_assert_eq(sodium_hex2bin(digest, 32, hex, 64, NULL, NULL, NULL), 0);
    uint8_t *v = rds_get(s, key, &n);
    const void *b;
    size_t len;
    bool ok = v != NULL && kw_remote_decode(fleet_key, digest, v, n, &b, &len, NULL) == 0;
    free(v);
    return ok;
}

Test(remote_daemon, a_warm_node_makes_a_new_node_warm_without_compiling)
{
    rds_require();
    rds s = {0};
    kwd a, b;
    kwc ca, cb;
    rds_start(&s);
    up_remote(&a, &ca, "rkwd-a", &s);
    kwr ra = warm(&ca);
    cr_expect_eq(kwr_num(&ra, "compiled"), V32_KEYS);
    cr_expect_eq(kwr_num(&ra, "failed"), 0);
    settle_writebacks(&ca);
    cr_expect_eq(kwc_stat(&ca, "remote_writebacks_dropped"), 0);
    cr_expect_eq(kwc_stat(&ca, "remote_puts"), V32_KEYS);
    cr_expect_eq(kwc_stat(&ca, "remote_misses"), V32_KEYS);
    cr_expect_eq(rds_count(&s, "kwarm:v1:*"), V32_KEYS);
    cr_expect_eq(rds_count(&s, "kwarm:lease:*"), 0, "leases released");

    up_remote(&b, &cb, "rkwd-b", &s);
    kwr rb = warm(&cb);
    cr_expect_eq(kwr_num(&rb, "failed"), 0);
    cr_expect_eq(kwr_num(&rb, "keys"), V32_KEYS);
    cr_expect_eq(kwr_num(&rb, "compiled"), 0, "fleet entries are hits");
    cr_expect_eq(kwr_num(&rb, "remote_hits"), V32_KEYS);
    cr_expect_eq(kwc_stat(&cb, "compiles_started"), 0, "B compiles nothing");
    cr_expect_eq(kwc_stat(&cb, "compiles"), 0);
    cr_expect_eq(kwc_stat(&cb, "remote_hits"), V32_KEYS);
    cr_expect_eq(kwc_stat(&cb, "remote_refused"), 0);
    cr_expect_eq(kwc_stat(&cb, "entries"), V32_KEYS, "backfilled locally");

    /* B serves from its own LMDB now, Redis or not. */
    rds_kill(&s);
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", manifest_digest(&rb, 0));
    cJSON_AddFalseToObject(g, "compile");
    kwr r = kwc_call(&cb, KW_PROTO_GET, g, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "get from B's cache with Redis gone");
    cr_expect_gt(r.payload_len, 0);
    kwr_free(&r);
    cJSON_Delete(g);
    kwr_free(&ra);
    kwr_free(&rb);
    kwd_down(&a, &ca);
    kwd_down(&b, &cb);
}

Test(remote_daemon, two_nodes_warming_at_once_compile_each_key_once)
{
    rds_require();
    rds s = {0};
    kwd a, b;
    kwc ca, cb;
    rds_start(&s);
    up_remote(&a, &ca, "rkwd-a", &s);
    up_remote(&b, &cb, "rkwd-b", &s);
    cJSON *h = kwd_model_hdr(V32, 0);
    cr_assert_eq(kwc_send(&ca, KW_PROTO_WARMUP, h), 0);
    cr_assert_eq(kwc_send(&cb, KW_PROTO_WARMUP, h), 0);
    cJSON_Delete(h);
    kwr ra = finish_warmup(&ca, NULL), rb = finish_warmup(&cb, NULL);
    settle_writebacks(&ca);
    settle_writebacks(&cb);
    cr_expect_eq(kwr_num(&ra, "failed"), 0);
    cr_expect_eq(kwr_num(&rb, "failed"), 0);
    double sa = kwc_stat(&ca, "compiles_started"), sb = kwc_stat(&cb, "compiles_started");
    double ha = kwc_stat(&ca, "remote_hits"), hb = kwc_stat(&cb, "remote_hits");
    cr_expect_eq(sa + sb, V32_KEYS, "compiles: A %g + B %g", sa, sb);
    cr_expect_eq(ha + hb, V32_KEYS, "remote hits: A %g + B %g", ha, hb);
    cr_expect_eq(kwc_stat(&ca, "entries"), V32_KEYS);
    cr_expect_eq(kwc_stat(&cb, "entries"), V32_KEYS);
    cr_expect_eq(rds_count(&s, "kwarm:lease:*"), 0, "leases released");
    kwr_free(&ra);
    kwr_free(&rb);
    kwd_down(&a, &ca);
    kwd_down(&b, &cb);
    rds_kill(&s);
}

/* Evicts key i of the V32 keys locally and gets it back with a compile;
 * returns its digest (static buffer). */
static const char *recompile(kwc *c, const cJSON *keys, int i)
{
    static char hex[65];
    const cJSON *k = cJSON_GetArrayItem(keys, i);
    snprintf(hex, sizeof hex, "%s",
             cJSON_GetObjectItemCaseSensitive(k, "digest")->valuestring);
    cJSON *e = cJSON_CreateObject();
    cJSON_AddStringToObject(e, "digest", hex);
    kwr r = kwc_call(c, KW_PROTO_EVICT, e, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "evict");
    kwr_free(&r);
    cJSON_Delete(e);
    cJSON *g = cJSON_CreateObject();
    const char *names[] = {"family", "fields", "arch"};
    for (size_t j = 0; j < 3; j++)
        cJSON_AddItemToObject(g, names[j],
                              cJSON_Duplicate(cJSON_GetObjectItemCaseSensitive(k, names[j]), true));
    r = kwc_call(c, KW_PROTO_GET, g, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "get with compile");
    kwr_free(&r);
    cJSON_Delete(g);
    return hex;
}

Test(remote_daemon, redis_dying_mid_warmup_costs_no_request_and_write_back_resumes)
{
    rds_require();
    rds s = {0};
    kwd a;
    kwc ca;
    rds_start(&s);
    up_remote_timeout(&a, &ca, "rkwd-down", &s, "300");
    cJSON *h = kwd_model_hdr(V32, 0);
    cr_assert_eq(kwc_send(&ca, KW_PROTO_WARMUP, h), 0);
    cJSON_Delete(h);
    size_t seen = 0;
    cJSON *early = cJSON_CreateArray();
    while (seen < (size_t)V32_KEYS / 2) { /* half-way: Redis dies */
        kwr p = kwc_must_recv(&ca, KWD_REPLY_MS);
        kwr_expect_type(&p, KW_PROTO_PROGRESS, "warmup progress");
        seen += kwc_take_items(&p, early);
        kwr_free(&p);
    }
    cJSON_Delete(early);
    rds_kill(&s);
    size_t rest = 0;
    kwr r = finish_warmup(&ca, &rest);
    cr_expect_eq(seen + rest, (size_t)V32_KEYS);
    cr_expect_eq(kwr_num(&r, "failed"), 0, "no request fails");
    cr_expect_eq(kwr_num(&r, "compiled") + kwr_num(&r, "hits") +
                 kwr_num(&r, "remote_hits"), V32_KEYS);
    cr_expect_eq(kwc_stat(&ca, "entries"), V32_KEYS);
    kwr_free(&r);
    kwc_expect_pong(&ca, "with Redis gone");

    /* Redis back on the same port (empty: --save ''): a later compile is
     * written back once the backoff lets kwarmd reconnect (<= 5 s). */
    rds_start(&s);
    cJSON *doc = kwd_kwarm_keys(V32, 0);
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(doc, "keys");
    int64_t deadline = kwd_now_ms() + 20000;
    bool back = false;
    for (int i = 0; !back && kwd_now_ms() < deadline; i = (i + 1) % V32_KEYS) {
        const char *hex = recompile(&ca, keys, i);
        back = remote_has_valid(&s, hex);
        if (!back)
            kwd_nap_ms(100);
    }
    cr_expect(back, "write-back resumed after Redis came back");
    cr_expect_gt(kwc_stat(&ca, "remote_errors"), 0, "the outage was counted");
    /* One log line as the tier went down and one as it came back (seen
     * on kwarmd's 2 s timer tick). */
    deadline = kwd_now_ms() + 10000;
    char *log = NULL;
    for (;;) {
        free(log);
        log = kwd_log(a.log);
        char *down = strstr(log, " is down: Redis calls fail");
        if ((down != NULL && strstr(down, " is back") != NULL) ||
            kwd_now_ms() > deadline)
            break;
        kwd_nap_ms(200); /* polling the log with a deadline */
    }
    char *down = strstr(log, " is down: Redis calls fail");
    cr_expect(down != NULL && strstr(down, " is back") != NULL,
              "no down and back lines: %s", log);
    free(log);
    cJSON_Delete(doc);
    kwd_down(&a, &ca);
    rds_kill(&s);
}

Test(remote_daemon, tampered_entries_are_refused_recompiled_and_counted)
{
    rds_require();
    rds s = {0};
    kwd a, b;
    kwc ca, cb;
    rds_start(&s);
    up_remote(&a, &ca, "rkwd-a", &s);
    kwr ra = warm(&ca);
    cr_assert_eq(kwr_num(&ra, "compiled"), V32_KEYS);
    settle_writebacks(&ca);
    char key[128];
    size_t n = 0;
    /* Key 0: a flipped byte.  Key 1: signed with another key.  Key 2: the
     * format without a signature. */
    snprintf(key, sizeof key, "kwarm:v1:%s", manifest_digest(&ra, 0));
    uint8_t *v = rds_get(&s, key, &n);
    cr_assert_not_null(v);
    v[n / 2] ^= 1;
    rds_set(&s, key, v, n);
    free(v);
    uint8_t other[32], digest[32];
    memcpy(other, fleet_key, 32);
    other[5] ^= 0x40;
    snprintf(key, sizeof key, "kwarm:v1:%s", manifest_digest(&ra, 1));
    v = rds_get(&s, key, &n);
    cr_assert_eq(sodium_hex2bin(digest, 32, manifest_digest(&ra, 1), 64, NULL,
                                NULL, NULL), 0);
    const void *blob;
    size_t blen;
    kw_cache_info info;
    cr_assert_eq(kw_remote_decode(fleet_key, digest, v, n, &blob, &blen, &info), 0);
    uint8_t *forged = NULL;
    size_t flen = 0;
    cr_assert_eq(kw_remote_encode(other, digest, &info, blob, blen, &forged, &flen), 0);
    rds_set(&s, key, forged, flen);
    free(forged);
    free(v);
    snprintf(key, sizeof key, "kwarm:v1:%s", manifest_digest(&ra, 2));
    v = rds_get(&s, key, &n);
    memset(v + n - 32, 0, 32);
    rds_set(&s, key, v, n);
    free(v);

    up_remote(&b, &cb, "rkwd-b", &s);
    kwr rb = warm(&cb);
    cr_expect_eq(kwr_num(&rb, "failed"), 0);
    cr_expect_eq(kwc_stat(&cb, "remote_refused"), 3);
    cr_expect_eq(kwc_stat(&cb, "compiles_started"), 3, "the refused are recompiled");
    cr_expect_eq(kwc_stat(&cb, "remote_hits"), V32_KEYS - 3);
    cr_expect_eq(kwc_stat(&cb, "entries"), V32_KEYS);
    for (int i = 0; i < 3; i++)
        cr_expect(remote_has_valid(&s, manifest_digest(&ra, i)),
                  "key %d written back, signed, after its recompile", i);
    kwr_free(&ra);
    kwr_free(&rb);
    kwd_down(&a, &ca);
    kwd_down(&b, &cb);
    rds_kill(&s);
}

/* The password comes from $KWARM_REMOTE_PASSWORD when the key file has
 * none; write-back then works against a Redis that requires it. */
Test(remote_daemon, takes_the_redis_password_from_the_environment)
{
    rds_require();
    rds s = {.password = "env-secret"};
    kwd a;
    kwc ca;
    rds_start(&s);
    cr_assert_eq(setenv("KWARM_REMOTE_PASSWORD", "env-secret", 1), 0);
    up_remote(&a, &ca, "rkwd-pw", &s);
    kwr ra = warm(&ca);
    cr_expect_eq(kwr_num(&ra, "failed"), 0);
    settle_writebacks(&ca);
    cr_expect_eq(kwc_stat(&ca, "remote_puts"), V32_KEYS);
    cr_expect_eq(kwc_stat(&ca, "remote_errors"), 0);
    cr_expect(remote_has_valid(&s, manifest_digest(&ra, 0)));
    kwr_free(&ra);
    kwd_down(&a, &ca);
    rds_kill(&s);
}

/* kwarmd refuses a fleet key file that others may read, and --remote
 * without a key file. */
Test(remote_daemon, refuses_to_start_with_a_bad_key_file)
{
    rds_require();
    kwd d;
    char key[300];
    kwd_init(&d, "rkwd-key");
    rds_key_file(d.dir, "fleet.key", fleet_key, NULL, key, sizeof key);
    chmod(key, 0644);
    const char *args[] = {"--socket", d.sock, "--cache", d.cache, "--remote",
                          "redis://127.0.0.1:1", "--remote-key-file", key, NULL};
    pid_t pid = kwd_spawn(&d, args, d.log);
    int st = 0;
    cr_assert(kwd_wait_exit(pid, KWD_STOP_MS, &st), "kwarmd should exit");
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 1, "status 0x%x", st);
    char *log = kwd_log(d.log);
    cr_expect(strstr(log, "group or others") != NULL, "%s", log);
    free(log);
    const char *nokey[] = {"--socket", d.sock, "--cache", d.cache, "--remote",
                           "redis://127.0.0.1:1", NULL};
    pid = kwd_spawn(&d, nokey, d.log);
    cr_assert(kwd_wait_exit(pid, KWD_STOP_MS, &st), "kwarmd should exit");
    cr_expect(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status 0x%x", st);
}

/* kwarm prewarm --remote (issue 10): a prewarm on one build host writes
 * back what it compiles; a prewarm of another cache then compiles
 * nothing, and a running kwarmd finds the same entries in the fleet. */
Test(remote_daemon, prewarm_with_remote_shares_through_the_fleet)
{
    rds_require();
    rds s = {0};
    rds_start(&s);
    char dir[128], key[300], ca[200], cb[200], model[512];
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "rpw"), 0);
    rds_key_file(dir, "fleet.key", fleet_key, NULL, key, sizeof key);
    snprintf(ca, sizeof ca, "%s/a", dir);
    snprintf(cb, sizeof cb, "%s/b", dir);
    snprintf(model, sizeof model, "%s/%s", KW_FIXTURES, V32);
    const char *argv_a[] = {KW_KWARM_BIN, "prewarm", "--model", model, "--cache",
                            ca, "--jobs", "2", "--json", "--remote", s.url,
                            "--remote-key-file", key, NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_run(argv_a, &out, &err), 0, "%s", err);
    cJSON *a = cJSON_Parse(out);
    cr_assert_not_null(a, "%s", out);
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(a, "compiled")->valuedouble,
                 V32_KEYS);
    cr_expect_eq(rds_count(&s, "kwarm:v1:*"), V32_KEYS, "written back");
    cJSON_Delete(a);
    free(out);
    free(err);
    const char *argv_b[] = {KW_KWARM_BIN, "prewarm", "--model", model, "--cache",
                            cb, "--jobs", "2", "--json", "--remote", s.url,
                            "--remote-key-file", key, NULL};
    cr_assert_eq(kw_test_run(argv_b, &out, &err), 0, "%s", err);
    cJSON *b = cJSON_Parse(out);
    cr_assert_not_null(b, "%s", out);
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(b, "compiled")->valuedouble, 0);
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(b, "remote_hits")->valuedouble,
                 V32_KEYS);
    cJSON_Delete(b);
    free(out);
    free(err);
    /* A second prewarm of b: local hits now, nothing asked of the fleet. */
    rds_kill(&s);
    cr_assert_eq(kw_test_run(argv_b, &out, &err), 0, "%s", err);
    b = cJSON_Parse(out);
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(b, "hits")->valuedouble, V32_KEYS);
    cJSON_Delete(b);
    free(out);
    free(err);
    /* Flags that cannot work are refused up front, exit 2. */
    const char *bad[] = {KW_KWARM_BIN, "prewarm", "--model", model, "--cache",
                         cb, "--remote", "redis://127.0.0.1:1", NULL};
    cr_expect_eq(kw_test_run(bad, &out, &err), 2, "%s", err);
    cr_expect(strstr(err, "--remote-key-file") != NULL, "%s", err);
    free(out);
    free(err);
    kw_test_rmtree(dir);
}
