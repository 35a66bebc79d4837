/* test_cli_admin.c: `kwarm ls`, `evict`, `pins`, `unpin`, `resize` and
 * --digest prefixes with --cache (issue 12 points 5, 6 and 3), through the
 * real binary.  Entries are put through the library (made-up blobs with
 * real families and field counts), so nothing is compiled.
 */
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>

#include "cli_util.h"
#include "kw_cache.h"

static char cache[128];

static void setup(void)
{
    tmp_setup();
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
}

static void teardown(void)
{
    tmp_teardown();
}

static kw_cache *open_cache(void)
{
    kw_cache_opts o = {.dir = cache};
    kw_cache *c = NULL;
    char err[256];
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), 0, "%s", err);
    return c;
}

static void digest_of(const char *hex, uint8_t d[KW_CACHE_DIGEST_LEN])
{
    cr_assert_eq(strlen(hex), 64);
    for (size_t i = 0; i < KW_CACHE_DIGEST_LEN; i++)
        cr_assert_eq(sscanf(hex + 2 * i, "%2hhx", &d[i]), 1);
}

/* Puts a made-up entry of family under the digest hex, len bytes. */
static void put(kw_cache *c, const char *hex, const char *family, size_t len,
                bool pin)
{
    kw_k_family f;
    cr_assert_eq(kw_keys_family_from_name(family, &f), 0);
    kw_cache_info info = {.nfields = (uint32_t)kw_keys_nfields(f),
                          .arch = "sm_90", .entry = "kw_k_x", .nvrtc = "13.0"};
    snprintf(info.family, sizeof info.family, "%s", family);
    for (uint32_t i = 0; i < info.nfields; i++)
        info.fields[i] = kw_keys_field_is_bool(f, i) ? 1 : (int64_t)i + 2;
    uint8_t d[KW_CACHE_DIGEST_LEN];
    digest_of(hex, d);
    uint8_t *blob = malloc(len);
    cr_assert_not_null(blob);
    memset(blob, 0x5a, len);
    cr_assert_eq(kw_cache_put(c, d, &info, blob, len, pin, NULL), 0);
    free(blob);
}

#define A1 "aabbccdd11111111111111111111111111111111111111111111111111111111"
#define A2 "aabbccdd22222222222222222222222222222222222222222222222222222222"
#define B1 "bbbbbbbb33333333333333333333333333333333333333333333333333333333"
#define C1 "cccccccc44444444444444444444444444444444444444444444444444444444"

/* Four entries: A1, A2 (index_conversion), B1 (dcp_stable_topk, in pin
 * set "prod"), C1 (prefill_chunk_metadata, pinned by flag). */
static void fill(void)
{
    kw_cache *c = open_cache();
    put(c, A1, "index_conversion", 1000, false);
    put(c, A2, "index_conversion", 2000, false);
    put(c, B1, "dcp_stable_topk", 3000, false);
    put(c, C1, "prefill_chunk_metadata", 4000, true);
    uint8_t d[1][KW_CACHE_DIGEST_LEN];
    digest_of(B1, d[0]);
    cr_assert_eq(kw_cache_pin_set(c, "prod", (const uint8_t(*)[32])d, 1), 0);
    kw_cache_close(c);
}

static bool present(const char *hex)
{
    kw_cache *c = open_cache();
    uint8_t d[KW_CACHE_DIGEST_LEN];
    digest_of(hex, d);
    bool yes = kw_cache_contains(c, d);
    kw_cache_close(c);
    return yes;
}

/* Runs kwarm, expects exit want, returns stdout parsed as JSON. */
static cJSON *json_of(const char *const *args, int want)
{
    result r = kwarm(args);
    cr_assert_eq(r.status, want, "%s: exit %d, want %d: %s", args[0],
                 r.status, want, r.err);
    cJSON *doc = cJSON_Parse(r.out);
    cr_assert_not_null(doc, "not JSON: %s", r.out);
    result_free(&r);
    return doc;
}

/* The digests of a document's array member, in order, as one string. */
static void digests(const cJSON *doc, const char *member, char *buf, size_t cap)
{
    const cJSON *e;
    buf[0] = '\0';
    cJSON_ArrayForEach(e, cJSON_GetObjectItem(doc, member)) {
        size_t n = strlen(buf);
        snprintf(buf + n, cap - n, "%s%.8s", n ? "," : "",
                 cJSON_GetObjectItem(e, "digest")->valuestring);
    }
}

Test(cli_admin, ls_lists_every_field_and_filters, .init = setup, .fini = teardown)
{
    fill();
    cJSON *doc = json_of(ARGS("ls", "--cache", cache, "--json"), 0);
    char got[256];
    digests(doc, "entries", got, sizeof got);
    cr_expect_str_eq(got, "aabbccdd,aabbccdd,bbbbbbbb,cccccccc");
    cr_expect_eq(cJSON_GetObjectItem(doc, "count")->valueint, 4);
    cr_expect_eq(cJSON_GetObjectItem(doc, "bytes")->valueint, 10000);
    const cJSON *b = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "entries"), 2);
    cr_expect_str_eq(cJSON_GetObjectItem(b, "family")->valuestring, "dcp_stable_topk");
    cr_expect_str_eq(cJSON_GetObjectItem(b, "arch")->valuestring, "sm_90");
    cr_expect_eq(cJSON_GetObjectItem(b, "size")->valueint, 3000);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(b, "pinned")));
    cr_expect_str_eq(cJSON_GetArrayItem(cJSON_GetObjectItem(b, "pins"), 0)->valuestring,
                     "prod");
    const cJSON *fields = cJSON_GetObjectItem(b, "fields");
    cr_expect(cJSON_IsObject(fields) && cJSON_GetObjectItem(fields, "topk") != NULL,
              "fields are not named");
    for (const char *m = "created\0last_used\0hits\0"; *m; m += strlen(m) + 1)
        cr_expect(cJSON_IsNumber(cJSON_GetObjectItem(b, m)), "no %s", m);
    time_t now = time(NULL);
    cr_expect_leq(llabs((long long)now - cJSON_GetObjectItem(b, "created")->valueint), 60);
    cJSON_Delete(doc);

    doc = json_of(ARGS("ls", "--cache", cache, "--family", "index_conversion",
                       "--json"), 0);
    digests(doc, "entries", got, sizeof got);
    cr_expect_str_eq(got, "aabbccdd,aabbccdd");
    cJSON_Delete(doc);
    doc = json_of(ARGS("ls", "--cache", cache, "--pinned", "prod", "--json"), 0);
    digests(doc, "entries", got, sizeof got);
    cr_expect_str_eq(got, "bbbbbbbb");
    cJSON_Delete(doc);

    result r = kwarm(ARGS("ls", "--cache", cache));
    cr_expect_eq(r.status, 0);
    for (const char *w = "DIGEST\0FAMILY\0ARCH\0SIZE\0CREATED\0LAST USED\0HITS\0"
                         "PINS\0FIELDS\0bbbbbbbb33333333\0prod\0topk=\0"
                         "4 entries\0"; *w; w += strlen(w) + 1)
        cr_expect(strstr(r.out, w) != NULL, "ls lacks '%s':\n%s", w, r.out);
    result_free(&r);
    expect_bad_input("bad family", ARGS("ls", "--cache", cache, "--family", "x"),
                     NEEDLES("--family"));
}

Test(cli_admin, evict_by_prefix_family_age_and_unpinned, .init = setup,
     .fini = teardown)
{
    fill();
    /* Ambiguous: exit 2 naming both candidates; nothing removed. */
    result r = kwarm(ARGS("evict", "--cache", cache, "--digest", "aabbccdd"));
    cr_expect_eq(r.status, 2);
    cr_expect(strstr(r.err, "ambiguous") && strstr(r.err, A1) && strstr(r.err, A2),
              "%s", r.err);
    result_free(&r);
    cr_expect(present(A1) && present(A2));
    expect_bad_input("short prefix", ARGS("evict", "--cache", cache, "--digest",
                                          "aabbccd"), NEEDLES("--digest"));
    r = kwarm(ARGS("evict", "--cache", cache, "--digest", "dddddddd"));
    cr_expect_eq(r.status, 1, "%s", r.err);
    result_free(&r);

    cJSON *doc = json_of(ARGS("evict", "--cache", cache, "--digest",
                              "aabbccdd2222", "--json"), 0);
    char got[256];
    digests(doc, "removed", got, sizeof got);
    cr_expect_str_eq(got, "aabbccdd");
    cr_expect_eq(cJSON_GetObjectItem(doc, "bytes")->valueint, 2000);
    cJSON_Delete(doc);
    cr_expect(present(A1) && !present(A2));

    /* Nothing is older than a week; everything is older than 0 s. */
    doc = json_of(ARGS("evict", "--cache", cache, "--older-than", "7d", "--json"), 0);
    cr_expect_eq(cJSON_GetObjectItem(doc, "count")->valueint, 0);
    cJSON_Delete(doc);
    r = kwarm(ARGS("evict", "--cache", cache, "--unpinned", "--older-than", "0s"));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.out, "removed aabbccdd11111111 index_conversion sm_90") &&
              strstr(r.out, "evicted 1 entries, 1000 bytes"), "%s", r.out);
    result_free(&r);
    cr_expect(!present(A1) && present(B1) && present(C1));
    expect_bad_input("bad age", ARGS("evict", "--cache", cache, "--older-than", "7x"),
                     NEEDLES("--older-than"));
    expect_bad_input("no criterion", ARGS("evict", "--cache", cache),
                     NEEDLES("--digest"));
}

Test(cli_admin, evict_refuses_pinned_entries_unless_forced, .init = setup,
     .fini = teardown)
{
    fill();
    const char *const *cases[] = {
        ARGS("evict", "--cache", cache, "--family", "dcp_stable_topk"),
        ARGS("evict", "--cache", cache, "--digest", "cccccccc"),
        ARGS("evict", "--cache", cache, "--older-than", "0s")};
    for (size_t i = 0; i < N(cases); i++) {
        result r = kwarm(cases[i]);
        cr_expect_eq(r.status, 1, "case %zu: exit %d", i, r.status);
        cr_expect(strstr(r.err, "pinned") && strstr(r.err, "--force"), "%s", r.err);
        result_free(&r);
    }
    cr_expect(present(A1) && present(A2) && present(B1) && present(C1),
              "a refused evict removed something");
    result r = kwarm(ARGS("evict", "--cache", cache, "--family",
                          "dcp_stable_topk", "--force"));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.out, "removed bbbbbbbb33333333") != NULL, "%s", r.out);
    result_free(&r);
    cr_expect(!present(B1) && present(C1));
}

Test(cli_admin, pins_lists_sets_and_unpin_releases_them, .init = setup,
     .fini = teardown)
{
    fill();
    cJSON *doc = json_of(ARGS("pins", "--cache", cache, "--json"), 0);
    const cJSON *p = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "pins"), 0);
    cr_assert_not_null(p);
    cr_expect_str_eq(cJSON_GetObjectItem(p, "name")->valuestring, "prod");
    cr_expect_eq(cJSON_GetObjectItem(p, "entries")->valueint, 1);
    cr_expect_eq(cJSON_GetObjectItem(p, "bytes")->valueint, 3000);
    cJSON_Delete(doc);
    result r = kwarm(ARGS("pins", "--cache", cache));
    cr_expect(r.status == 0 && strstr(r.out, "prod") && strstr(r.out, "NAME"),
              "%s", r.out);
    result_free(&r);

    r = kwarm(ARGS("unpin", "--cache", cache, "prod"));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.out, "unpinned prod: 1 entries") != NULL, "%s", r.out);
    result_free(&r);
    doc = json_of(ARGS("pins", "--cache", cache, "--json"), 0);
    cr_expect_eq(cJSON_GetArraySize(cJSON_GetObjectItem(doc, "pins")), 0);
    cJSON_Delete(doc);
    /* B1 is evictable now; C1 keeps its own pin. */
    r = kwarm(ARGS("evict", "--cache", cache, "--family", "dcp_stable_topk"));
    cr_expect_eq(r.status, 0, "%s", r.err);
    result_free(&r);
    cr_expect(!present(B1));
    r = kwarm(ARGS("unpin", "--cache", cache, "prod"));
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "no such pin set") != NULL, "%s", r.err);
    result_free(&r);
    expect_bad_input("no name", ARGS("unpin", "--cache", cache), NEEDLES("NAME"));
}

Test(cli_admin, resize_stores_the_limit_and_trims_unpinned_lru, .init = setup,
     .fini = teardown)
{
    /* 3 unpinned entries of 400 KiB and one pinned, at a 2M limit. */
    kw_cache *c = open_cache();
    cr_assert_eq(kw_cache_resize(c, 2u << 20), 0);
    put(c, A1, "index_conversion", 400u << 10, false);
    put(c, A2, "index_conversion", 400u << 10, false);
    put(c, B1, "dcp_stable_topk", 400u << 10, false);
    put(c, C1, "prefill_chunk_metadata", 600u << 10, true);
    kw_cache_close(c);
    cJSON *doc = json_of(ARGS("resize", "--cache", cache, "1M", "--json"), 0);
    cr_expect_eq(cJSON_GetObjectItem(doc, "max_size")->valuedouble, 1 << 20);
    cr_expect_eq(cJSON_GetObjectItem(doc, "previous")->valuedouble, 2 << 20);
    cr_expect_geq(cJSON_GetObjectItem(doc, "evicted")->valueint, 2);
    cr_expect_leq(cJSON_GetObjectItem(doc, "bytes")->valuedouble, 1 << 20);
    cJSON_Delete(doc);
    cr_expect(present(C1), "the pinned entry was evicted");
    /* Stored: another opener sees it. */
    doc = json_of(ARGS("stats", "--cache", cache, "--json"), 0);
    cr_expect_eq(cJSON_GetObjectItem(doc, "max_size")->valuedouble, 1 << 20);
    cr_expect_eq(cJSON_GetObjectItem(doc, "pinned_entries")->valueint, 1);
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItem(doc, "read_only")),
              "a writable cache reported read-only");
    cJSON_Delete(doc);
    expect_bad_input("bad size", ARGS("resize", "--cache", cache, "12Q"),
                     NEEDLES("SIZE"));
    expect_bad_input("too small", ARGS("resize", "--cache", cache, "1000"),
                     NEEDLES("SIZE"));
}

/* Without --cache the commands ask kwarmd (test_cli_socket.c serves
 * them); with nothing at the socket they fail as a runtime error naming
 * the socket. */
Test(cli_admin, socket_forms_name_an_unreachable_kwarmd)
{
    const char *const *cases[] = {
        ARGS("ls", "--socket", "/nonexistent/k.sock"),
        ARGS("evict", "--unpinned", "--socket", "/nonexistent/k.sock"),
        ARGS("pins", "--socket", "/nonexistent/k.sock"),
        ARGS("unpin", "prod", "--socket", "/nonexistent/k.sock"),
        ARGS("resize", "4G", "--socket", "/nonexistent/k.sock")};
    for (size_t i = 0; i < N(cases); i++) {
        result r = kwarm(cases[i]);
        cr_expect_eq(r.status, 1, "%s: exit %d", cases[i][0], r.status);
        cr_expect(strstr(r.err, "cannot reach kwarmd") &&
                  strstr(r.err, "/nonexistent/k.sock"), "%s: %s", cases[i][0], r.err);
        result_free(&r);
    }
}
