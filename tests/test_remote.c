/* test_remote.c: the fleet tier (cache/kw_remote.h) against a real
 * redis-server: URL and key file rules, signed round trips, refusal of
 * tampered, foreign and unsigned values, timeouts, backoff and reconnection,
 * and the compile lease.  Issue 6. */
#include "remote_util.h"

#include <pthread.h>

#include <sodium.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_remote.h"

TestSuite(remote, .fini = rds_cleanup, .timeout = 120);

static const uint8_t fleet_key[32] = "0123456789abcdef0123456789abcdef";

/* Opens a handle on s with the fleet key (timeout_ms, lease_ms; 0 for
 * the defaults). */
static kw_remote *open_on(const rds *s, unsigned timeout_ms, unsigned lease_ms)
{
    kw_remote_opts o = {.timeout_ms = timeout_ms, .lease_ms = lease_ms};
    char err[256] = "";
    memcpy(o.key, fleet_key, 32);
    cr_assert_eq(kw_remote_parse_url(s->url, &o.addr), 0, "%s", s->url);
    kw_remote *r = NULL;
    int rc = kw_remote_open(&r, &o, err, sizeof err);
    cr_assert_eq(rc, 0, "kw_remote_open: %s %s", kw_strerror(rc), err);
    return r;
}

static void digest_of(uint8_t d[32], int n)
{
    memset(d, 0, 32);
    d[0] = (uint8_t)n;
    d[31] = 0xa5;
}

static void info_of(kw_cache_info *i)
{
    memset(i, 0, sizeof *i);
    snprintf(i->family, sizeof i->family, "sparse_mla_decode");
    snprintf(i->arch, sizeof i->arch, "sm_90");
    snprintf(i->entry, sizeof i->entry, "kw_k_entry");
    snprintf(i->nvrtc, sizeof i->nvrtc, "13.0");
    i->nfields = 3;
    i->fields[0] = 576;
    i->fields[1] = -1;
    i->fields[2] = 1LL << 40;
    i->compile_seconds = 1.25;
}

static void entry_key(char *out, const uint8_t d[32])
{
    char hex[65];
    sodium_bin2hex(hex, sizeof hex, d, 32);
    sprintf(out, "kwarm:v1:%s", hex);
}

static const char blob[] = "\x7f" "ELF pretend cubin bytes, long enough to flip";

/* ---- url and key file -------------------------------------------------- */

Test(remote, parse_url_accepts_host_port_db_and_refuses_the_rest)
{
    kw_remote_addr a;
    cr_assert_eq(kw_remote_parse_url("redis://127.0.0.1:6379", &a), 0);
    cr_expect_str_eq(a.host, "127.0.0.1");
    cr_expect_eq(a.port, 6379);
    cr_expect_eq(a.db, 0);
    cr_assert_eq(kw_remote_parse_url("redis://cache.fleet:7000/3", &a), 0);
    cr_expect_str_eq(a.host, "cache.fleet");
    cr_expect_eq(a.db, 3);
    const char *bad[] = {"127.0.0.1:6379", "redis://host", "redis://:6379",
                         "redis://h:0", "redis://h:65536", "redis://h:1/16",
                         "redis://user:pw@h:6379", "redis://h:6379/x",
                         "redis://h:6379x", "http://h:6379"};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++)
        cr_expect_eq(kw_remote_parse_url(bad[i], &a), KW_EINVAL, "%s", bad[i]);
}

Test(remote, key_file_must_exist_hold_32_bytes_and_be_private)
{
    char dir[128], path[256], err[512];
    kw_remote_opts o;
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "rkey"), 0);
    memset(&o, 0, sizeof o);
    snprintf(path, sizeof path, "%s/missing", dir);
    cr_expect_eq(kw_remote_load_key(path, &o, err, sizeof err), KW_EINVAL);
    cr_expect(strstr(err, path) != NULL, "error names the file: %s", err);

    cr_assert_eq(kw_test_write_file(dir, "short", fleet_key, 31, path, sizeof path), 0);
    chmod(path, 0600);
    cr_expect_eq(kw_remote_load_key(path, &o, err, sizeof err), KW_EINVAL);
    cr_expect(strstr(err, "shorter") != NULL, "%s", err);

    rds_key_file(dir, "open", fleet_key, NULL, path, sizeof path);
    chmod(path, 0640);
    cr_expect_eq(kw_remote_load_key(path, &o, err, sizeof err), KW_EINVAL);
    cr_expect(strstr(err, "group") != NULL, "%s", err);
    chmod(path, 0604);
    cr_expect_eq(kw_remote_load_key(path, &o, err, sizeof err), KW_EINVAL);

    rds_key_file(dir, "good", fleet_key, "s3cret", path, sizeof path);
    cr_assert_eq(kw_remote_load_key(path, &o, err, sizeof err), 0, "%s", err);
    cr_expect_eq(memcmp(o.key, fleet_key, 32), 0);
    cr_expect_str_eq(o.password, "s3cret");
    kw_test_rmtree(dir);
}

Test(remote, authenticates_with_the_password_and_refuses_a_wrong_one)
{
    rds_require();
    rds s = {.password = "fleet-pw"};
    rds_start(&s);
    kw_remote_opts o = {.timeout_ms = 500};
    char err[256] = "";
    kw_remote *r = NULL;
    memcpy(o.key, fleet_key, 32);
    cr_assert_eq(kw_remote_parse_url(s.url, &o.addr), 0);
    snprintf(o.password, sizeof o.password, "wrong");
    cr_expect_eq(kw_remote_open(&r, &o, err, sizeof err), KW_EREMOTE);
    cr_expect(strstr(err, "AUTH") != NULL, "%s", err);
    snprintf(o.password, sizeof o.password, "fleet-pw");
    cr_assert_eq(kw_remote_open(&r, &o, err, sizeof err), 0, "%s", err);
    uint8_t d[32];
    kw_cache_info in;
    digest_of(d, 11);
    info_of(&in);
    cr_expect_eq(kw_remote_put(r, d, &in, blob, sizeof blob), 0);
    void *b = NULL;
    size_t len = 0;
    cr_expect_eq(kw_remote_get(r, d, &b, &len, NULL), 0);
    free(b);
    kw_remote_close(r);
    rds_kill(&s);
}

/* ---- values ------------------------------------------------------------ */

Test(remote, put_then_get_round_trips_cubin_and_metadata)
{
    rds_require();
    rds s = {0};
    rds_start(&s);
    kw_remote *r = open_on(&s, 0, 0);
    uint8_t d[32], other[32];
    kw_cache_info in, out;
    digest_of(d, 1);
    digest_of(other, 2);
    info_of(&in);
    cr_assert_eq(kw_remote_put(r, d, &in, blob, sizeof blob), 0);
    void *b = NULL;
    size_t len = 0;
    cr_assert_eq(kw_remote_get(r, d, &b, &len, &out), 0);
    cr_expect_eq(len, sizeof blob);
    cr_expect_eq(memcmp(b, blob, len), 0);
    free(b);
    cr_expect_str_eq(out.family, in.family);
    cr_expect_str_eq(out.arch, in.arch);
    cr_expect_str_eq(out.entry, in.entry);
    cr_expect_str_eq(out.nvrtc, in.nvrtc);
    cr_expect_eq(out.nfields, 3);
    cr_expect_eq(out.fields[1], -1);
    cr_expect_eq(out.fields[2], 1LL << 40);
    cr_expect_eq(out.compile_seconds, 1.25);
    cr_expect_eq(kw_remote_get(r, other, &b, &len, NULL), KW_ENOTFOUND);
    cr_expect_null(b);
    kw_remote_stats st;
    kw_remote_stats_get(r, &st);
    cr_expect_eq(st.hits, 1);
    cr_expect_eq(st.misses, 1);
    cr_expect_eq(st.puts, 1);
    cr_expect_eq(st.errors + st.refused, 0);
    kw_remote_close(r);
    rds_kill(&s);
}

/* Stores v under d's key, asks for d: it must be refused and counted. */
static void expect_refused(const rds *s, kw_remote *r, const uint8_t d[32],
                           const void *v, size_t n, const char *what)
{
    char key[128];
    kw_remote_stats before, after;
    entry_key(key, d);
    rds_set(s, key, v, n);
    kw_remote_stats_get(r, &before);
    void *b = NULL;
    size_t len = 0;
    cr_expect_eq(kw_remote_get(r, d, &b, &len, NULL), KW_ECORRUPT, "%s", what);
    cr_expect_null(b, "%s: nothing handed out", what);
    kw_remote_stats_get(r, &after);
    cr_expect_eq(after.refused, before.refused + 1, "%s: counted", what);
    cr_expect_eq(after.hits, before.hits, "%s", what);
}

Test(remote, refuses_a_value_with_a_flipped_byte)
{
    rds_require();
    rds s = {0};
    rds_start(&s);
    kw_remote *r = open_on(&s, 0, 0);
    uint8_t d[32];
    char key[128];
    kw_cache_info in;
    digest_of(d, 3);
    info_of(&in);
    entry_key(key, d);
    cr_assert_eq(kw_remote_put(r, d, &in, blob, sizeof blob), 0);
    size_t n = 0;
    uint8_t *v = rds_get(&s, key, &n);
    cr_assert_not_null(v);
    /* A byte of the header, the metadata, the cubin, the checksum, the MAC. */
    size_t at[] = {5, 100, n - 60, n - 40, n - 1};
    for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
        v[at[i]] ^= 0x20;
        expect_refused(&s, r, d, v, n, "flipped byte");
        v[at[i]] ^= 0x20;
    }
    expect_refused(&s, r, d, v, n - 1, "truncated");
    free(v);
    kw_remote_close(r);
    rds_kill(&s);
}

Test(remote, refuses_a_value_signed_with_another_key_or_for_another_digest)
{
    rds_require();
    rds s = {0};
    rds_start(&s);
    kw_remote *r = open_on(&s, 0, 0);
    uint8_t d[32], other[32], wrong[32];
    kw_cache_info in;
    digest_of(d, 4);
    digest_of(other, 5);
    info_of(&in);
    memcpy(wrong, fleet_key, 32);
    wrong[0] ^= 1;
    uint8_t *v = NULL;
    size_t n = 0;
    cr_assert_eq(kw_remote_encode(wrong, d, &in, blob, sizeof blob, &v, &n), 0);
    expect_refused(&s, r, d, v, n, "wrong key");
    free(v);
    cr_assert_eq(kw_remote_encode(fleet_key, other, &in, blob, sizeof blob, &v, &n), 0);
    expect_refused(&s, r, d, v, n, "signed for another digest");
    free(v);
    kw_remote_close(r);
    rds_kill(&s);
}

Test(remote, refuses_a_value_written_without_the_key)
{
    rds_require();
    rds s = {0};
    rds_start(&s);
    kw_remote *r = open_on(&s, 0, 0);
    uint8_t d[32];
    kw_cache_info in;
    digest_of(d, 6);
    info_of(&in);
    uint8_t *v = NULL;
    size_t n = 0;
    cr_assert_eq(kw_remote_encode(fleet_key, d, &in, blob, sizeof blob, &v, &n), 0);
    memset(v + n - 32, 0, 32); /* the format, but no signature */
    expect_refused(&s, r, d, v, n, "zero MAC");
    expect_refused(&s, r, d, v, n - 32, "no MAC at all");
    expect_refused(&s, r, d, blob, sizeof blob, "a bare cubin");
    free(v);
    kw_remote_close(r);
    rds_kill(&s);
}

/* ---- failures ---------------------------------------------------------- */

Test(remote, a_stopped_server_times_out_then_fails_fast_then_recovers)
{
    rds_require();
    rds s = {0};
    rds_start(&s);
    kw_remote *r = open_on(&s, 200, 0);
    uint8_t d[32];
    kw_cache_info in;
    digest_of(d, 7);
    info_of(&in);
    cr_assert_eq(kw_remote_put(r, d, &in, blob, sizeof blob), 0);
    cr_assert_eq(kill(s.pid, SIGSTOP), 0);
    void *b = NULL;
    size_t len = 0;
    int64_t t0 = rds_now_ms();
    cr_expect_eq(kw_remote_get(r, d, &b, &len, NULL), KW_EREMOTE);
    int64_t took = rds_now_ms() - t0;
    cr_expect(took >= 150 && took < 1000, "timed out after %lld ms (200 set)",
              (long long)took);
    t0 = rds_now_ms();
    cr_expect_eq(kw_remote_get(r, d, &b, &len, NULL), KW_EREMOTE);
    cr_expect_lt(rds_now_ms() - t0, 50, "marked down: no wait");
    kw_remote_stats st;
    kw_remote_stats_get(r, &st);
    cr_expect_eq(st.errors, 2);
    cr_assert_eq(kill(s.pid, SIGCONT), 0);
    /* Backoff: 100 ms, then 200 ms...; bounded by the 5 s cap. */
    int64_t deadline = rds_now_ms() + 8000;
    int rc;
    while ((rc = kw_remote_get(r, d, &b, &len, NULL)) == KW_EREMOTE &&
           rds_now_ms() < deadline)
        rds_nap_ms(20);
    cr_expect_eq(rc, 0, "reconnected after SIGCONT: %s", kw_strerror(rc));
    free(b);
    kw_remote_close(r);
    rds_kill(&s);
}

Test(remote, opens_while_redis_is_down_and_connects_once_it_is_up)
{
    rds_require();
    rds s = {.port = rds_free_port()};
    snprintf(s.url, sizeof s.url, "redis://127.0.0.1:%u", s.port);
    kw_remote *r = open_on(&s, 200, 0);
    uint8_t d[32];
    kw_cache_info in;
    digest_of(d, 8);
    info_of(&in);
    int64_t t0 = rds_now_ms();
    cr_expect_eq(kw_remote_put(r, d, &in, blob, sizeof blob), KW_EREMOTE);
    cr_expect_lt(rds_now_ms() - t0, 500);
    rds_start(&s);
    int64_t deadline = rds_now_ms() + 8000;
    int rc;
    while ((rc = kw_remote_put(r, d, &in, blob, sizeof blob)) == KW_EREMOTE &&
           rds_now_ms() < deadline)
        rds_nap_ms(20);
    cr_expect_eq(rc, 0, "%s", kw_strerror(rc));
    kw_remote_close(r);
    rds_kill(&s);
}

/* A pooled connection closed by a Redis restart is replaced at once: the
 * call succeeds and nothing counts as an error. */
Test(remote, a_restarted_server_costs_no_error)
{
    rds_require();
    rds s = {0};
    rds_start(&s);
    kw_remote *r = open_on(&s, 500, 0);
    uint8_t d[32];
    kw_cache_info in;
    digest_of(d, 12);
    info_of(&in);
    cr_assert_eq(kw_remote_put(r, d, &in, blob, sizeof blob), 0);
    rds_kill(&s);
    rds_start(&s); /* same port, empty */
    void *b = NULL;
    size_t len = 0;
    cr_expect_eq(kw_remote_get(r, d, &b, &len, NULL), KW_ENOTFOUND);
    kw_remote_stats st;
    kw_remote_stats_get(r, &st);
    cr_expect_eq(st.errors, 0);
    kw_remote_close(r);
    rds_kill(&s);
}

/* ---- lease ------------------------------------------------------------- */

typedef struct waiter_run {
    kw_remote *r;
    kw_cache *cache;
    const uint8_t *digest;
    kw_remote_lease lease;
    int rc;
    int64_t ms;
} waiter_run;

static void *waiter_main(void *arg)
{
    waiter_run *w = arg;
    int64_t t0 = rds_now_ms();
    w->rc = kw_remote_begin(w->r, w->cache, w->digest, NULL, NULL, &w->lease);
    w->ms = rds_now_ms() - t0;
    return NULL;
}

static kw_cache *cache_in(const char *dir)
{
    kw_cache *c = NULL;
    char err[256];
    kw_cache_opts o = {.dir = dir};
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), 0, "%s", err);
    return c;
}

Test(remote, a_second_node_waits_on_the_lease_and_takes_the_entry)
{
    rds_require();
    rds s = {0};
    rds_start(&s);
    char dir[128], d1[200], d2[200];
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "rlease"), 0);
    snprintf(d1, sizeof d1, "%s/a", dir);
    snprintf(d2, sizeof d2, "%s/b", dir);
    kw_cache *ca = cache_in(d1), *cb = cache_in(d2);
    kw_remote *ra = open_on(&s, 0, 10000), *rb = open_on(&s, 0, 10000);
    uint8_t d[32];
    kw_cache_info in;
    digest_of(d, 9);
    info_of(&in);
    kw_remote_lease la;
    cr_assert_eq(kw_remote_begin(ra, ca, d, NULL, NULL, &la), KW_ENOTFOUND);
    cr_assert(la.held, "the first node takes the lease");
    waiter_run w = {.r = rb, .cache = cb, .digest = d};
    pthread_t th;
    cr_assert_eq(pthread_create(&th, NULL, waiter_main, &w), 0);
    rds_nap_ms(200); /* the waiter is polling by now */
    cr_assert_eq(kw_cache_put(ca, d, &in, blob, sizeof blob, false, NULL), 0);
    kw_remote_end(ra, &la, &in, blob, sizeof blob);
    pthread_join(th, NULL);
    cr_expect_eq(w.rc, 0, "the waiter got the entry: %s", kw_strerror(w.rc));
    cr_expect(!w.lease.held);
    cr_expect_lt(w.ms, 5000, "no wait past the holder's put");
    cr_expect(kw_cache_contains(cb, d), "backfilled into the local cache");
    cr_expect_eq(rds_count(&s, "kwarm:lease:*"), 0, "lease released");

    /* A holder that dies: its lease expires and the waiter compiles. */
    kw_remote *rc1 = open_on(&s, 0, 300), *rc2 = open_on(&s, 0, 300);
    uint8_t e[32];
    digest_of(e, 10);
    kw_remote_lease l1, l2;
    cr_assert_eq(kw_remote_begin(rc1, ca, e, NULL, NULL, &l1), KW_ENOTFOUND);
    cr_assert(l1.held);
    int64_t t0 = rds_now_ms();
    cr_expect_eq(kw_remote_begin(rc2, cb, e, NULL, NULL, &l2), KW_ENOTFOUND);
    cr_expect_lt(rds_now_ms() - t0, 3000, "bounded wait");
    kw_remote_end(rc2, &l2, NULL, NULL, 0);
    kw_remote_end(rc1, &l1, NULL, NULL, 0);
    kw_remote_close(rc1);
    kw_remote_close(rc2);
    kw_remote_close(ra);
    kw_remote_close(rb);
    kw_cache_close(ca);
    kw_cache_close(cb);
    kw_test_rmtree(dir);
    rds_kill(&s);
}
