/* test_daemon.c: a real kwarmd serving well-formed requests: warmup,
 * get, keys, ping, stats, evict; 32 clients at once; peer credentials.
 *
 * Each test starts its own kwarmd in a temporary directory (see
 * daemon_util.h) and speaks the protocol of client/kw_proto.h by hand.
 * Compiles are real NVRTC runs (no GPU needed). */
#include "daemon_util.h"

#include <pthread.h>
#include <pwd.h>

#include "kw_cache.h"

TestSuite(daemon, .fini = kwd_cleanup, .timeout = 300);

#define V32 "deepseek-v3.2-exp.json" /* default deployment */
#define V32_MAX_KEYS 64

/* The keys of V32's default deployment, as `kwarm keys` counts them. */
static int v32_keys(void)
{
    static int n;
    if (n == 0) {
        cJSON *doc = kwd_kwarm_keys(V32, 0);
        n = cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(doc, "keys"));
        cJSON_Delete(doc);
        cr_assert(n > 0 && n <= V32_MAX_KEYS, "V32 has %d keys", n);
    }
    return n;
}
#define V32_KEYS v32_keys()
#define EM_CUDA_MACHINE 190

/* ---- helpers ------------------------------------------------------------ */

/* A finished warmup: its RESULT and the digests of its PROGRESS frames. */
typedef struct warm {
    kwr result;
    cJSON *progress; /* array of digest strings, in arrival order */
} warm;

static void warm_free(warm *w)
{
    kwr_free(&w->result);
    cJSON_Delete(w->progress);
}

/* Sends a WARMUP and reads every PROGRESS frame, then the RESULT, to which
 * the streamed results are added as "manifest"; w.progress gets their
 * digests in arrival order. */
static warm warmup(kwc *c, const cJSON *hdr)
{
    warm w = {.progress = cJSON_CreateArray()};
    cJSON *results = cJSON_CreateArray();
    cr_assert_eq(kwc_send(c, KW_PROTO_WARMUP, hdr), 0);
    for (;;) {
        kwr r = kwc_must_recv(c, KWD_REPLY_MS);
        if (r.type != KW_PROTO_PROGRESS) {
            kwr_expect_type(&r, KW_PROTO_RESULT, "warmup");
            const cJSON *e;
            cJSON_ArrayForEach(e, results) {
                const cJSON *dg = cJSON_GetObjectItemCaseSensitive(e, "digest");
                cJSON_AddItemToArray(w.progress, cJSON_CreateString(
                                                     cJSON_GetStringValue(dg)));
            }
            cJSON_AddItemToObject(r.hdr, "manifest", results);
            w.result = r;
            return w;
        }
        cr_expect(kwr_num(&r, "total") > 0, "progress without a total");
        cr_expect(kwr_num(&r, "done") <= kwr_num(&r, "total"), "done > total");
        kwc_take_items(&r, results);
        kwr_free(&r);
    }
}

/* Every manifest entry has status want. */
static void expect_statuses(const kwr *result, const char *want)
{
    const cJSON *man = cJSON_GetObjectItemCaseSensitive(result->hdr, "manifest");
    const cJSON *e;
    cJSON_ArrayForEach(e, man) {
        const cJSON *s = cJSON_GetObjectItemCaseSensitive(e, "status");
        cr_expect(cJSON_IsString(s) && strcmp(s->valuestring, want) == 0,
                  "manifest entry status %s, want %s",
                  cJSON_IsString(s) ? s->valuestring : "?", want);
    }
}

/* The expected ERROR reply: code is kw_err_name()'s spelling. */
static void expect_error(const kwr *r, const char *code, const char *what)
{
    kwr_expect_type(r, KW_PROTO_ERROR, what);
    cr_expect_str_eq(kwr_str(r, "code"), code, "%s: code %s (\"%s\"), want %s",
                     what, kwr_str(r, "code"), kwr_str(r, "error"), code);
    cr_expect(kwr_str(r, "error")[0] != '\0', "%s: no error text", what);
}

/* A GET header for key (an element of kwarm keys --json's "keys"):
 * {"family", "fields", "arch"}, plus "compile": false unless compile. */
static cJSON *get_by_fields(const cJSON *key, bool compile)
{
    cJSON *h = cJSON_CreateObject();
    const char *names[] = {"family", "fields", "arch"};
    for (size_t i = 0; i < 3; i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(key, names[i]);
        cr_assert_not_null(v, "key lacks %s", names[i]);
        cJSON_AddItemToObject(h, names[i], cJSON_Duplicate(v, true));
    }
    if (!compile)
        cJSON_AddFalseToObject(h, "compile");
    return h;
}

static cJSON *get_by_digest(const char *hex, bool compile)
{
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "digest", hex);
    if (!compile)
        cJSON_AddFalseToObject(h, "compile");
    return h;
}

static const char *key_digest(const cJSON *key)
{
    const cJSON *d = cJSON_GetObjectItemCaseSensitive(key, "digest");
    cr_assert(cJSON_IsString(d));
    return d->valuestring;
}

/* A RESULT of a get for digest hex: header fields and a CUDA ELF payload. */
static void expect_cubin(const kwr *r, const char *hex, bool compiled)
{
    kwr_expect_type(r, KW_PROTO_RESULT, "get");
    cr_expect_str_eq(kwr_str(r, "digest"), hex);
    cr_expect_eq(kwr_num(r, "size"), (double)r->payload_len);
    cr_expect(kwr_str(r, "entry")[0] != '\0', "get: empty entry name");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(r->hdr, "compiled");
    cr_expect(cJSON_IsBool(c) && cJSON_IsTrue(c) == compiled,
              "get: \"compiled\" should be %s", compiled ? "true" : "false");
    cr_assert_gt(r->payload_len, 0);
    cr_expect_eq(kw_test_elf_machine(r->payload, r->payload_len), EM_CUDA_MACHINE);
}

/* ---- warmup ------------------------------------------------------------- */

Test(daemon, warmup_manifest_matches_kwarm_keys_then_all_hits)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-warm", 2, NULL, &c);
    cJSON *hdr = kwd_model_hdr("composite-text-config.json", 2);
    cJSON *keys = kwd_kwarm_keys("composite-text-config.json", 2);
    cJSON *want = kwd_digests(cJSON_GetObjectItemCaseSensitive(keys, "keys"));
    int n = cJSON_GetArraySize(want);
    cr_assert_gt(n, 0);

    warm w = warmup(&c, hdr);
    cJSON *man = kwd_digests(cJSON_GetObjectItemCaseSensitive(w.result.hdr, "manifest"));
    cr_expect(kwd_same_set(man, want), "manifest digests differ from kwarm keys");
    cr_expect_eq(kwr_num(&w.result, "keys"), n);
    cr_expect_eq(kwr_num(&w.result, "compiled"), n);
    cr_expect_eq(kwr_num(&w.result, "hits"), 0);
    cr_expect_eq(kwr_num(&w.result, "failed"), 0);
    cr_expect_geq(kwr_num(&w.result, "seconds"), 0);
    cr_expect_eq(cJSON_GetArraySize(w.progress), n, "one PROGRESS per key");
    cr_expect(kwd_same_set(w.progress, want), "PROGRESS digests differ");
    expect_statuses(&w.result, "compiled");
    cJSON_Delete(man);
    warm_free(&w);

    w = warmup(&c, hdr); /* everything is cached now */
    cr_expect_eq(kwr_num(&w.result, "keys"), n);
    cr_expect_eq(kwr_num(&w.result, "hits"), n);
    cr_expect_eq(kwr_num(&w.result, "compiled"), 0);
    cr_expect_eq(kwr_num(&w.result, "failed"), 0);
    cr_expect_eq(cJSON_GetArraySize(w.progress), n, "one PROGRESS per hit");
    expect_statuses(&w.result, "hit");
    cr_expect_eq(kwc_stat(&c, "compiles_started"), n);
    warm_free(&w);

    cJSON_Delete(want);
    cJSON_Delete(keys);
    cJSON_Delete(hdr);
    kwd_down(&d, &c);
}

/* ---- get ---------------------------------------------------------------- */

Test(daemon, get_returns_the_bytes_the_cache_holds)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-get", 2, NULL, &c);
    cJSON *hdr = kwd_model_hdr(V32, 0);
    warm w = warmup(&c, hdr);
    cJSON *man = kwd_digests(cJSON_GetObjectItemCaseSensitive(w.result.hdr, "manifest"));
    int n = cJSON_GetArraySize(man);
    cr_assert_eq(n, V32_KEYS);
    kwr got[V32_MAX_KEYS];
    for (int i = 0; i < n; i++) {
        const char *hex = cJSON_GetArrayItem(man, i)->valuestring;
        cJSON *g = get_by_digest(hex, true);
        got[i] = kwc_call(&c, KW_PROTO_GET, g, NULL);
        cJSON_Delete(g);
        expect_cubin(&got[i], hex, false);
    }
    kwd_down(&d, &c);

    /* The daemon is gone: read the same entries from its cache directly. */
    kw_cache *cache = NULL;
    kw_cache_opts co = {.dir = d.cache, .read_only = true};
    char err[256] = "";
    cr_assert_eq(kw_cache_open(&cache, &co, err, sizeof err), 0, "%s", err);
    for (int i = 0; i < n; i++) {
        const char *hex = cJSON_GetArrayItem(man, i)->valuestring;
        uint8_t digest[KW_CACHE_DIGEST_LEN];
        for (size_t b = 0; b < sizeof digest; b++) {
            unsigned v;
            cr_assert_eq(sscanf(hex + 2 * b, "%2x", &v), 1);
            digest[b] = (uint8_t)v;
        }
        void *blob = NULL;
        size_t len = 0;
        kw_cache_info info;
        cr_assert_eq(kw_cache_get(cache, digest, &blob, &len, &info), 0,
                     "kw_cache_get %s", hex);
        cr_expect_eq(len, got[i].payload_len, "%s: size differs", hex);
        cr_expect(len == got[i].payload_len &&
                  memcmp(blob, got[i].payload, len) == 0,
                  "%s: daemon bytes differ from the cache's", hex);
        cr_expect_str_eq(kwr_str(&got[i], "family"), info.family);
        cr_expect_str_eq(kwr_str(&got[i], "arch"), info.arch);
        cr_expect_str_eq(kwr_str(&got[i], "entry"), info.entry);
        cr_expect_eq(kw_test_elf_machine(blob, len), EM_CUDA_MACHINE);
        free(blob);
        kwr_free(&got[i]);
    }
    kw_cache_close(cache);
    cJSON_Delete(man);
    warm_free(&w);
    cJSON_Delete(hdr);
}

Test(daemon, get_by_fields_compiles_a_miss_unless_told_not_to)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-getf", 2, NULL, &c);
    cJSON *doc = kwd_kwarm_keys(V32, 0);
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(doc, "keys");
    cr_assert_geq(cJSON_GetArraySize(keys), 3);
    const cJSON *k0 = cJSON_GetArrayItem(keys, 0), *k1 = cJSON_GetArrayItem(keys, 1),
                *k2 = cJSON_GetArrayItem(keys, 2);

    cJSON *g = get_by_fields(k0, true);
    kwr r = kwc_call(&c, KW_PROTO_GET, g, NULL);
    expect_cubin(&r, key_digest(k0), true);
    cr_expect_str_eq(kwr_str(&r, "family"),
                     cJSON_GetObjectItemCaseSensitive(k0, "family")->valuestring);
    kwr_free(&r);
    r = kwc_call(&c, KW_PROTO_GET, g, NULL); /* now a hit */
    expect_cubin(&r, key_digest(k0), false);
    kwr_free(&r);
    cJSON_Delete(g);

    g = get_by_fields(k1, false);
    r = kwc_call(&c, KW_PROTO_GET, g, NULL);
    expect_error(&r, "KW_ENOTFOUND", "get compile:false of a missing key");
    kwr_free(&r);
    cJSON_Delete(g);

    g = get_by_digest(key_digest(k2), true); /* a digest cannot compile */
    r = kwc_call(&c, KW_PROTO_GET, g, NULL);
    expect_error(&r, "KW_ENOTFOUND", "get of a missing digest");
    kwr_free(&r);
    cJSON_Delete(g);

    g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", "not-hex");
    r = kwc_call(&c, KW_PROTO_GET, g, NULL);
    expect_error(&r, "KW_EINVAL", "get of a malformed digest");
    kwr_free(&r);
    cJSON_Delete(g);

    cr_expect_eq(kwc_stat(&c, "compiles_started"), 1);
    cr_expect_eq(kwc_stat(&c, "entries"), 1);
    kwc_expect_pong(&c, "after request errors");
    cJSON_Delete(doc);
    kwd_down(&d, &c);
}

/* Fields are integers (or booleans): a fraction or a number no int64_t
 * holds must be refused, not truncated (or converted with undefined
 * behaviour) into some other key. */
Test(daemon, get_refuses_a_field_that_is_not_an_integer)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-getint", 2, NULL, &c);
    cJSON *doc = kwd_kwarm_keys(V32, 0);
    const cJSON *k0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "keys"), 0);
    const double bad[] = {2.5, 1e300, -1e300, 9223372036854775808.0};
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        cJSON *g = get_by_fields(k0, false);
        cJSON *fields = cJSON_GetObjectItemCaseSensitive(g, "fields");
        const cJSON *first = fields->child;
        while (first != NULL && !cJSON_IsNumber(first))
            first = first->next;
        cr_assert_not_null(first, "key without a numeric field");
        char name[64];
        snprintf(name, sizeof name, "%s", first->string);
        cJSON_ReplaceItemInObjectCaseSensitive(fields, name, cJSON_CreateNumber(bad[i]));
        kwr r = kwc_call(&c, KW_PROTO_GET, g, NULL);
        char what[128];
        snprintf(what, sizeof what, "get with /fields/%s = %g", name, bad[i]);
        expect_error(&r, "KW_EINVAL", what);
        kwr_free(&r);
        cJSON_Delete(g);
    }
    cr_expect_eq(kwc_stat(&c, "compiles_started"), 0);
    cJSON_Delete(doc);
    kwd_down(&d, &c);
}

/* A compile that fails (its worker crashes) is an ERROR; the connection
 * lives.  (A get naming an arch NVRTC cannot build is refused before any
 * compile: test_daemon_holes.) */
Test(daemon, get_of_a_failing_compile_is_an_error)
{
    cJSON *doc = kwd_kwarm_keys(V32, 0);
    const cJSON *k0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "keys"), 0);
    const char *fam = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(k0, "family"));
    cr_assert_not_null(fam);
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    cr_assert_eq(setenv("KWARM_TEST_CRASH_FAMILY", fam, 1), 0);
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-getbad", 2, NULL, &c);
    cJSON *g = get_by_fields(k0, true);
    kwr r = kwc_call(&c, KW_PROTO_GET, g, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, "get whose compile crashes");
    cr_expect(kwr_str(&r, "code")[0] != '\0' && kwr_str(&r, "error")[0] != '\0',
              "an ERROR with a code and a reason");
    cr_log_info("get whose compile crashes: %s: %s", kwr_str(&r, "code"),
                kwr_str(&r, "error"));
    kwr_free(&r);
    kwc_expect_pong(&c, "after a failed compile");
    cr_expect_eq(kwc_stat(&c, "compile_failures"), 1);
    cr_expect_eq(kwc_stat(&c, "entries"), 0);
    cJSON_Delete(g);
    cJSON_Delete(doc);
    kwd_down(&d, &c);
}

/* A PING written right behind a GET that compiles waits for it: replies
 * come one request at a time, in order. */
Test(daemon, serves_requests_behind_a_compile_in_order)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-order", 2, NULL, &c);
    cJSON *doc = kwd_kwarm_keys(V32, 0);
    const cJSON *k0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "keys"), 0);
    cJSON *g = get_by_fields(k0, true);
    uint8_t *get = NULL, *ping = NULL;
    size_t glen = 0, plen = 0;
    cr_assert_eq(kw_proto_encode(KW_PROTO_GET, g, NULL, 0, &get, &glen), 0);
    cr_assert_eq(kw_proto_encode(KW_PROTO_PING, NULL, NULL, 0, &ping, &plen), 0);
    uint8_t *both = malloc(glen + plen);
    cr_assert_not_null(both);
    memcpy(both, get, glen);
    memcpy(both + glen, ping, plen);
    cr_assert_eq(kwc_send_raw(&c, both, glen + plen), 0);
    kwr r = kwc_must_recv(&c, KWD_REPLY_MS);
    expect_cubin(&r, key_digest(k0), true);
    kwr_free(&r);
    r = kwc_must_recv(&c, 5000);
    kwr_expect_type(&r, KW_PROTO_PONG, "the PING behind the GET");
    kwr_free(&r);
    free(both);
    free(ping);
    free(get);
    cJSON_Delete(g);
    cJSON_Delete(doc);
    kwd_down(&d, &c);
}

/* ---- keys, ping, evict, stats ------------------------------------------ */

Test(daemon, keys_request_returns_the_kwarm_keys_document)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-keys", 2, NULL, &c);
    const char *models[] = {V32, "composite-text-config.json", "deepseek-v4-flash.json"};
    for (size_t i = 0; i < 3; i++) {
        for (int dcp = 0; dcp <= 2; dcp += 2) {
            cJSON *hdr = kwd_model_hdr(models[i], dcp);
            cJSON *want = kwd_kwarm_keys(models[i], dcp);
            kwr r = kwc_call(&c, KW_PROTO_KEYS, hdr, NULL);
            kwr_expect_type(&r, KW_PROTO_RESULT, "keys");
            cJSON *a = kwd_digests(cJSON_GetObjectItemCaseSensitive(r.hdr, "keys"));
            cJSON *b = kwd_digests(cJSON_GetObjectItemCaseSensitive(want, "keys"));
            cr_expect(cJSON_Compare(a, b, true), "%s dcp %d: key digests differ",
                      models[i], dcp);
            /* "name" was the path given to kwarm: the whole document matches. */
            char *got = kwr_text(&r), *exp = cJSON_PrintUnformatted(want);
            cr_expect(cJSON_Compare(r.hdr, want, true),
                      "%s dcp %d: documents differ:\n%s\n%s", models[i], dcp, got, exp);
            free(got);
            free(exp);
            cJSON_Delete(a);
            cJSON_Delete(b);
            kwr_free(&r);
            cJSON_Delete(want);
            cJSON_Delete(hdr);
        }
    }
    cr_expect_eq(kwc_stat(&c, "compiles_started"), 0, "keys compiles nothing");
    kwd_down(&d, &c);
}

Test(daemon, ping_returns_the_version)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-ping", 2, NULL, &c);
    const char *argv[] = {KW_KWARMD_BIN, "--version", NULL};
    char *out = NULL;
    cr_assert_eq(kw_test_run(argv, &out, NULL), 0);
    kwr r = kwc_call(&c, KW_PROTO_PING, NULL, NULL);
    kwr_expect_type(&r, KW_PROTO_PONG, "ping");
    char want[128];
    snprintf(want, sizeof want, "kwarmd %s\n", kwr_str(&r, "version"));
    cr_expect(kwr_str(&r, "version")[0] != '\0', "PONG without a version");
    cr_expect(strncmp(out, want, strlen(want)) == 0, "kwarmd --version (%s) and "
              "PONG (%s) disagree", out, want);
    free(out);
    kwr_free(&r);
    cr_expect_eq(kwc_stat(&c, "requests"), 2); /* the ping and this stats */
    cr_expect_eq(kwc_stat(&c, "connections"), 1);
    kwd_down(&d, &c);
}

Test(daemon, evict_removes_an_entry)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-evict", 2, NULL, &c);
    cJSON *doc = kwd_kwarm_keys(V32, 0);
    const cJSON *k0 = cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "keys"), 0);
    cJSON *g = get_by_fields(k0, true);
    kwr r = kwc_call(&c, KW_PROTO_GET, g, NULL);
    expect_cubin(&r, key_digest(k0), true);
    kwr_free(&r);
    cr_expect_eq(kwc_stat(&c, "entries"), 1);

    cJSON *e = get_by_digest(key_digest(k0), true);
    r = kwc_call(&c, KW_PROTO_EVICT, e, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "evict");
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r.hdr, "evicted")));
    kwr_free(&r);
    cr_expect_eq(kwc_stat(&c, "entries"), 0);

    cJSON *miss = get_by_digest(key_digest(k0), false);
    r = kwc_call(&c, KW_PROTO_GET, miss, NULL);
    expect_error(&r, "KW_ENOTFOUND", "get after evict");
    kwr_free(&r);

    r = kwc_call(&c, KW_PROTO_EVICT, e, NULL); /* already gone */
    kwr_expect_type(&r, KW_PROTO_RESULT, "evict again");
    cr_expect(cJSON_IsFalse(cJSON_GetObjectItemCaseSensitive(r.hdr, "evicted")));
    kwr_free(&r);

    r = kwc_call(&c, KW_PROTO_GET, g, NULL); /* compiles again */
    expect_cubin(&r, key_digest(k0), true);
    kwr_free(&r);
    cJSON_Delete(miss);
    cJSON_Delete(e);
    cJSON_Delete(g);
    cJSON_Delete(doc);
    kwd_down(&d, &c);
}

Test(daemon, request_error_keeps_the_connection_open)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-reqerr", 2, NULL, &c);
    cJSON *hdr = kwd_model_hdr(V32, 0);
    cJSON *dep = cJSON_AddObjectToObject(hdr, "deployment");
    cJSON_AddNumberToObject(dep, "dcp_world", 0); /* must be >= 1 */
    kwr r = kwc_call(&c, KW_PROTO_WARMUP, hdr, NULL);
    expect_error(&r, "KW_EDEPLOY", "warmup with dcp_world 0");
    kwr_free(&r);
    cJSON *nocfg = cJSON_CreateObject();
    r = kwc_call(&c, KW_PROTO_KEYS, nocfg, NULL);
    expect_error(&r, "KW_EINVAL", "keys without a config");
    kwr_free(&r);
    kwc_expect_pong(&c, "after two request errors");
    cr_expect_eq(kwc_stat(&c, "protocol_errors"), 0);
    cr_expect_eq(kwc_stat(&c, "compiles_started"), 0);
    cJSON_Delete(nocfg);
    cJSON_Delete(hdr);
    kwd_down(&d, &c);
}

/* Requests written back to back in one write are all answered, in order. */
Test(daemon, answers_every_pipelined_request)
{
    kwd d;
    kwc c;
    kwd_up(&d, "kwd-pipe", 2, NULL, &c);
    enum { NPINGS = 40 };
    uint8_t *ping = NULL, all[NPINGS * 16];
    size_t len = 0;
    cr_assert_eq(kw_proto_encode(KW_PROTO_PING, NULL, NULL, 0, &ping, &len), 0);
    cr_assert_eq(len, 16);
    for (size_t i = 0; i < NPINGS; i++)
        memcpy(all + 16 * i, ping, 16);
    free(ping);
    cr_assert_eq(kwc_send_raw(&c, all, sizeof all), 0);
    size_t pongs = 0;
    for (; pongs < NPINGS; pongs++) {
        kwr r;
        if (kwc_recv(&c, &r, 5000) != 0)
            break;
        bool pong = r.type == KW_PROTO_PONG;
        kwr_free(&r);
        if (!pong)
            break;
    }
    cr_expect_eq(pongs, NPINGS, "%zu PINGs in one write got %zu PONGs within 5 s",
                 (size_t)NPINGS, pongs);
    kwd_down(&d, &c);
}

/* ---- 32 clients at once ------------------------------------------------- */

#define NCLIENTS 32

typedef struct client_run {
    const char *sock;
    const cJSON *hdr;
    pthread_barrier_t *start;
    /* Results, checked by the main thread (no asserts off it): */
    int rc; /* 0, or where it failed */
    size_t progress;
    double keys, compiled, hits, failed;
    int manifest;
} client_run;

/* One client: connect, wait for all, warm up, read to the RESULT. */
static void *client_main(void *arg)
{
    client_run *cr = arg;
    kwc c;
    int rc = kwc_open(&c, cr->sock);
    pthread_barrier_wait(cr->start);
    if (rc == 0)
        rc = kwc_send(&c, KW_PROTO_WARMUP, cr->hdr);
    while (rc == 0) {
        kwr r;
        if ((rc = kwc_recv(&c, &r, KWD_REPLY_MS)) != 0)
            break;
        if (r.type == KW_PROTO_PROGRESS) {
            const cJSON *res = cJSON_GetObjectItemCaseSensitive(r.hdr, "results");
            cr->progress += (size_t)cJSON_GetArraySize(res);
            kwr_free(&r);
            continue;
        }
        if (r.type != KW_PROTO_RESULT)
            rc = -1000000 - r.type;
        cr->keys = kwr_num(&r, "keys");
        cr->compiled = kwr_num(&r, "compiled");
        cr->hits = kwr_num(&r, "hits");
        cr->failed = kwr_num(&r, "failed");
        cr->manifest = (int)cr->progress; /* streamed: the manifest */
        kwr_free(&r);
        break;
    }
    cr->rc = rc;
    if (c.fd >= 0)
        kwc_close(&c);
    return NULL;
}

Test(daemon, concurrent_warmups_compile_each_key_once)
{
    kwd d;
    kwd_init(&d, "kwd-conc");
    kwd_start(&d, 2, NULL);
    cJSON *hdr = kwd_model_hdr(V32, 0);
    pthread_barrier_t start;
    pthread_t th[NCLIENTS];
    client_run runs[NCLIENTS];
    cr_assert_eq(pthread_barrier_init(&start, NULL, NCLIENTS), 0);
    for (size_t i = 0; i < NCLIENTS; i++) {
        runs[i] = (client_run){.sock = d.sock, .hdr = hdr, .start = &start};
        cr_assert_eq(pthread_create(&th[i], NULL, client_main, &runs[i]), 0);
    }
    for (size_t i = 0; i < NCLIENTS; i++)
        pthread_join(th[i], NULL);
    pthread_barrier_destroy(&start);
    for (size_t i = 0; i < NCLIENTS; i++) {
        client_run *r = &runs[i];
        cr_expect_eq(r->rc, 0, "client %zu failed: %d", i, r->rc);
        cr_expect_eq(r->keys, V32_KEYS, "client %zu", i);
        cr_expect_eq(r->failed, 0, "client %zu", i);
        cr_expect_eq(r->compiled + r->hits, V32_KEYS, "client %zu", i);
        cr_expect_eq(r->progress, V32_KEYS, "client %zu: progress frames", i);
        cr_expect_eq(r->manifest, V32_KEYS, "client %zu: manifest", i);
    }
    kwc c;
    kwc_must_open(&c, d.sock);
    kwr st = kwc_call(&c, KW_PROTO_STATS, NULL, NULL);
    kwr_expect_type(&st, KW_PROTO_RESULT, "stats");
    char *text = kwr_text(&st);
    /* compiles_started counts flights on the loop thread at submit;
     * compiles is the cache's counter, bumped by the worker before the
     * result is queued, so both are exact once every RESULT is in. */
    cr_expect_eq(kwr_num(&st, "compiles_started"), V32_KEYS, "%s", text);
    cr_expect_eq(kwr_num(&st, "compiles"), V32_KEYS, "%s", text);
    cr_expect_eq(kwr_num(&st, "compiles_inflight"), 0, "%s", text);
    cr_expect_eq(kwr_num(&st, "entries"), V32_KEYS, "%s", text);
    cr_expect_eq(kwr_num(&st, "compile_failures"), 0, "%s", text);
    cr_expect_eq(kwr_num(&st, "protocol_errors"), 0, "%s", text);
    free(text);
    kwr_free(&st);
    kwc_close(&c);
    cJSON_Delete(hdr);
    kwd_stop(&d);
}

/* ---- peer credentials --------------------------------------------------- */

/* What the nobody child saw; its exit status. */
enum {
    NB_ERROR = 10, NB_EOF, NB_PONG, NB_EACCES, NB_CONNECT, NB_OTHER, NB_SETUID
};

/* Forks a child that becomes nobody, connects to sock and pings; returns
 * its NB_* status (bounded wait). */
static int ping_as_nobody(const char *sock)
{
    struct passwd *pw = getpwnam("nobody");
    cr_assert_not_null(pw, "no user nobody");
    uid_t uid = pw->pw_uid;
    gid_t gid = pw->pw_gid;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0);
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (setgroups(0, NULL) < 0 || setgid(gid) < 0 || setuid(uid) < 0 ||
            getuid() != uid)
            _exit(NB_SETUID);
        kwc c;
        int rc = kwc_open(&c, sock);
        if (rc == -EACCES)
            _exit(NB_EACCES);
        if (rc < 0)
            _exit(NB_CONNECT);
        (void)kwc_send(&c, KW_PROTO_PING, NULL); /* may meet a closed peer */
        kwr r;
        rc = kwc_recv(&c, &r, 5000);
        int st = rc == KWC_EOF || rc == -ECONNRESET ? NB_EOF
                 : rc != 0                          ? NB_OTHER
                 : r.type == KW_PROTO_PONG          ? NB_PONG
                 : r.type == KW_PROTO_ERROR         ? NB_ERROR
                                                    : NB_OTHER;
        if (rc == 0 && r.type == KW_PROTO_ERROR) { /* then the close */
            kwr r2;
            int rc2 = kwc_recv(&c, &r2, 5000);
            if (rc2 == 0) {
                kwr_free(&r2);
                st = NB_OTHER;
            } else if (rc2 != KWC_EOF && rc2 != -ECONNRESET)
                st = NB_OTHER;
        }
        if (rc == 0)
            kwr_free(&r);
        kwc_close(&c);
        _exit(st);
    }
    kwd_track(pid, true);
    int st = 0;
    cr_assert(kwd_wait_exit(pid, 15000, &st), "nobody child hangs");
    cr_assert(WIFEXITED(st), "nobody child killed by signal %d", WTERMSIG(st));
    return WEXITSTATUS(st);
}

Test(daemon, refuses_a_client_of_another_uid)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to become nobody");
    kwd d;
    kwd_init(&d, "kwd-uid");
    cr_assert_eq(chmod(d.dir, 0755), 0);
    kwd_start(&d, 2, (const char *const[]){"--socket-mode", "0666", NULL});
    struct stat st;
    cr_assert_eq(stat(d.sock, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0666, "socket mode %o", st.st_mode & 0777);
    int seen = ping_as_nobody(d.sock);
    cr_expect(seen == NB_ERROR || seen == NB_EOF,
              "nobody's PING: child status %d (%s)", seen,
              seen == NB_PONG ? "answered with PONG" : "see NB_* in the test");
    kwc c;
    kwc_must_open(&c, d.sock);
    cr_expect_geq(kwc_stat(&c, "refused"), 1);
    kwc_expect_pong(&c, "root after a refused client");
    kwd_down(&d, &c);
}

Test(daemon, default_socket_mode_keeps_other_uids_out)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to become nobody");
    kwd d;
    kwd_init(&d, "kwd-mode");
    cr_assert_eq(chmod(d.dir, 0755), 0);
    kwd_start(&d, 2, NULL);
    struct stat st;
    cr_assert_eq(stat(d.sock, &st), 0);
    cr_expect_eq(st.st_mode & 0777, 0660, "socket mode %o", st.st_mode & 0777);
    cr_expect_eq(ping_as_nobody(d.sock), NB_EACCES,
                 "nobody's connect() to a 0660 root socket should fail EACCES");
    kwc c;
    kwc_must_open(&c, d.sock);
    cr_expect_eq(kwc_stat(&c, "refused"), 0, "never reached accept");
    kwd_down(&d, &c);
}
