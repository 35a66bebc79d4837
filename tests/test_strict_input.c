/* test_strict_input.c: one JSON reader (common/kw_json.h) for every way a
 * config comes in.  A config that breaks a rule of the reader gets the same
 * exit 2 and the same message from `kwarm keys`, `kwarm prewarm` and
 * `kwarm warmup` (the last with a kwarmd running, which it must not need),
 * and the same text sent to kwarmd by hand, or through libkwarm, is refused
 * there too rather than read leniently. */
#include "daemon_util.h"

#include "kw_client.h"

#define FIXTURE "deepseek-v3.2-exp.json"
#define ARGS_END(...) ((const char *const[]){__VA_ARGS__, NULL})
#define N(a) (sizeof(a) / sizeof((a)[0]))

/* The fixture's text with the first occurrence of from replaced by to (a
 * new string).  Fails the test when from is absent. */
static char *variant(const char *from, const char *to)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, FIXTURE);
    char *text = kw_test_read_file(path, NULL);
    cr_assert_not_null(text, "%s: %s", path, strerror(errno));
    char *at = strstr(text, from);
    cr_assert_not_null(at, "%s lacks %s", FIXTURE, from);
    size_t head = (size_t)(at - text), nf = strlen(from), nt = strlen(to);
    char *out = malloc(strlen(text) - nf + nt + 1);
    cr_assert_not_null(out);
    memcpy(out, text, head);
    memcpy(out + head, to, nt);
    strcpy(out + head + nt, at + nf);
    free(text);
    return out;
}

/* Each bad config: what it breaks, and the edit of the fixture. */
static const struct bad_case {
    const char *what, *from, *to;
} bad_cases[] = {
    {"a \\x01 byte between tokens", "\"index_topk\": 2048",
     "\"index_topk\":\x01 2048"},
    {"1e400 for max_position_embeddings",
     "\"max_position_embeddings\": 163840",
     "\"max_position_embeddings\": 1e400"},
    {"a byte-order mark", "{", "\xef\xbb\xbf{"},
    {"a \\x1f byte between members", "\"kv_lora_rank\"", "\x1f\"kv_lora_rank\""},
    /* 32 levels: over the config cap, so warmup's request (one level more)
     * is never what refuses it. */
    {"32 levels of nesting", "\"index_topk\": 2048",
     "\"index_topk\": 2048, \"deep\": " "[[[[[[[[[[" "[[[[[[[[[[" "[[[[[[[[[[" "["
     "1" "]]]]]]]]]]" "]]]]]]]]]]" "]]]]]]]]]]" "]"},
};

/* Writes text to DIR/name; returns the path (static storage per slot). */
static const char *write_config(const kwd *d, const char *name,
                                const char *text)
{
    static char path[4][512];
    static unsigned slot;
    char *p = path[slot++ % 4];
    snprintf(p, 512, "%s/%s", d->dir, name);
    FILE *f = fopen(p, "wb");
    cr_assert_not_null(f, "%s: %s", p, strerror(errno));
    cr_assert_eq(fwrite(text, 1, strlen(text), f), strlen(text));
    cr_assert_eq(fclose(f), 0);
    return p;
}

/* Runs kwarm with args; returns the exit status and, in *msg, stderr after
 * the "kwarm CMD: " prefix (free() it). */
static int run_kwarm(const char *const *args, char **msg)
{
    const char *argv[16] = {KW_KWARM_BIN};
    size_t n = 0;
    for (; args[n] != NULL; n++) {
        cr_assert(n < 14);
        argv[n + 1] = args[n];
    }
    argv[n + 1] = NULL;
    char *out = NULL, *err = NULL;
    int st = kw_test_run(argv, &out, &err);
    cr_assert_not_null(err);
    char prefix[64];
    snprintf(prefix, sizeof prefix, "kwarm %s: ", args[0]);
    const char *m = strncmp(err, prefix, strlen(prefix)) == 0
                        ? err + strlen(prefix)
                        : err;
    *msg = strdup(m);
    free(out);
    free(err);
    return st;
}

static kwd daemon_;

static void up(void)
{
    kwd_init(&daemon_, "strict");
    kwd_start(&daemon_, 1, NULL);
}

static void down(void)
{
    if (daemon_.pid > 0)
        kwd_stop(&daemon_);
    kwd_cleanup();
}

TestSuite(strict_input, .init = up, .fini = down, .timeout = 120);

/* The fixture itself loads: the failures below are the edit's doing. */
Test(strict_input, unedited_fixture_passes_kwarm_keys)
{
    char *text = variant("{", "{");
    const char *path = write_config(&daemon_, "good.json", text);
    char *msg;
    int st = run_kwarm(ARGS_END("keys", "--model", path), &msg);
    cr_expect_eq(st, 0, "kwarm keys: exit %d: %s", st, msg);
    free(msg);
    free(text);
}

Test(strict_input, keys_prewarm_and_warmup_refuse_alike_with_exit_2)
{
    for (size_t i = 0; i < N(bad_cases); i++) {
        const struct bad_case *b = &bad_cases[i];
        char *text = variant(b->from, b->to);
        const char *path = write_config(&daemon_, "bad.json", text);
        char cache[300];
        snprintf(cache, sizeof cache, "%s/prewarm-cache", daemon_.dir);
        char *mk, *mp, *mw;
        int sk = run_kwarm(ARGS_END("keys", "--model", path), &mk);
        int sp = run_kwarm(ARGS_END("prewarm", "--model", path, "--cache",
                                    cache), &mp);
        int sw = run_kwarm(ARGS_END("warmup", "--model", path, "--socket",
                                    daemon_.sock), &mw);
        cr_expect_eq(sk, 2, "[%s] keys: exit %d: %s", b->what, sk, mk);
        cr_expect_eq(sp, 2, "[%s] prewarm: exit %d: %s", b->what, sp, mp);
        cr_expect_eq(sw, 2, "[%s] warmup: exit %d: %s", b->what, sw, mw);
        cr_expect_str_eq(mp, mk, "[%s] prewarm and keys differ", b->what);
        cr_expect_str_eq(mw, mk, "[%s] warmup and keys differ", b->what);
        cr_expect(strstr(mk, path) != NULL, "[%s] no file named: %s",
                  b->what, mk);
        cr_expect(strstr(mk, "(byte ") != NULL ||
                      strstr(mk, "/max_position_embeddings") != NULL,
                  "[%s] no byte offset or pointer: %s", b->what, mk);
        /* Refused before anything was written. */
        struct stat st;
        cr_expect_neq(stat(cache, &st), 0, "[%s] prewarm made %s", b->what,
                      cache);
        free(mk);
        free(mp);
        free(mw);
        free(text);
    }
    /* The daemon saw none of it and is still serving. */
    kwc c;
    kwc_must_open(&c, daemon_.sock);
    kwc_expect_pong(&c, "after the refused warmups");
    kwc_close(&c);
}

/* A request header {"config": TEXT} with TEXT spliced in verbatim: the
 * frame is refused as a whole, so kwarmd never builds a tree from it. */
Test(strict_input, kwarmd_refuses_the_same_text_in_a_request)
{
    for (size_t i = 0; i < N(bad_cases); i++) {
        const struct bad_case *b = &bad_cases[i];
        char *text = variant(b->from, b->to);
        size_t n = strlen(text) + 32;
        char *hdr = malloc(n);
        cr_assert_not_null(hdr);
        int hl = snprintf(hdr, n, "{\"config\": %s}", text);
        uint8_t head[KW_PROTO_HEAD_LEN];
        cr_assert_eq(kw_proto_encode_head(head, KW_PROTO_KEYS, (uint32_t)hl,
                                          0), KW_PROTO_HEAD_LEN);
        kwc c;
        kwc_must_open(&c, daemon_.sock);
        cr_assert_eq(kwc_send_raw(&c, head, sizeof head), 0);
        cr_assert_eq(kwc_send_raw(&c, hdr, (size_t)hl), 0);
        kwr r = kwc_must_recv(&c, KWD_REPLY_MS);
        kwr_expect_type(&r, KW_PROTO_ERROR, b->what);
        cr_expect_str_eq(kwr_str(&r, "code"), "KW_EPROTO", "[%s]", b->what);
        kwr_free(&r);
        kwc_close(&c);
        free(hdr);
        free(text);
    }
}

/* libkwarm reads the caller's config text by the same rules; it used to
 * take cJSON_Parse()'s reading (1e400 became null on the wire). */
Test(strict_input, libkwarm_refuses_the_same_text)
{
    for (size_t i = 0; i < N(bad_cases); i++) {
        const struct bad_case *b = &bad_cases[i];
        char *text = variant(b->from, b->to);
        kw_client *c = NULL;
        char err[512];
        cr_assert_eq(kw_client_connect(&c, daemon_.sock, 10000, err,
                                       sizeof err), 0, "%s", err);
        char *out = NULL;
        int rc = kw_client_keys(c, text, NULL, "bad.json", &out);
        cr_expect_eq(rc, KW_EJSON, "[%s] rc %d: %s", b->what, rc,
                     kw_client_last_error(c));
        cr_expect_null(out);
        free(out);
        kw_client_close(c);
        free(text);
    }
}
