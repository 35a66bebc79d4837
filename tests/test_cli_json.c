/* test_cli_json.c: `kwarm keys --json` against the expected fixture sets,
 * and digest stability and sensitivity across processes (spec §6). */
#include "cli_util.h"

/* ---- --json output ------------------------------------------------------ */

/* Runs kwarm keys --json with args and returns the parsed document. */
static cJSON *keys_json(const char *const *args)
{
    result r = kwarm(args);
    cr_assert_eq(r.status, 0, "exit %d: %s", r.status, r.err);
    cr_expect_str_empty(r.err);
    cJSON *doc = cJSON_Parse(r.out);
    cr_assert_not_null(doc, "stdout is not JSON: %.200s", r.out);
    result_free(&r);
    return doc;
}

/* Appends a canonical text of a JSON scalar to buf. */
static void put_scalar(char *buf, size_t cap, const cJSON *v)
{
    size_t k = strlen(buf);
    if (cJSON_IsBool(v))
        snprintf(buf + k, cap - k, "%s", cJSON_IsTrue(v) ? "true" : "false");
    else if (cJSON_IsNumber(v))
        snprintf(buf + k, cap - k, "%.17g", v->valuedouble);
    else if (cJSON_IsString(v))
        snprintf(buf + k, cap - k, "\"%s\"", v->valuestring);
    else
        snprintf(buf + k, cap - k, "?");
}

static int cmp_str(const void *a, const void *b)
{
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* The canonical text of a key, family|arch|name=value,... with the fields
 * sorted by name, so that two keys compare equal as (family, arch, fields)
 * whatever the member order.  skip names a field to leave out, or NULL. */
static char *key_text(const cJSON *key, const char *skip)
{
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(key, "family");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(key, "arch");
    const cJSON *fields = cJSON_GetObjectItemCaseSensitive(key, "fields");
    cr_assert(cJSON_IsString(fam) && cJSON_IsString(arch) &&
              cJSON_IsObject(fields), "malformed key");
    const char *names[32];
    size_t n = 0;
    for (const cJSON *f = fields->child; f != NULL && n < 32; f = f->next)
        if (skip == NULL || strcmp(f->string, skip) != 0)
            names[n++] = f->string;
    qsort(names, n, sizeof *names, cmp_str);
    char buf[2048];
    snprintf(buf, sizeof buf, "%s|%s|", fam->valuestring, arch->valuestring);
    for (size_t i = 0; i < n; i++) {
        size_t k = strlen(buf);
        snprintf(buf + k, sizeof buf - k, "%s%s=", i ? "," : "", names[i]);
        put_scalar(buf, sizeof buf,
                   cJSON_GetObjectItemCaseSensitive(fields, names[i]));
    }
    return strdup(buf);
}

/* A document's keys as a sorted array of canonical texts. */
typedef struct keyset {
    char **text;
    const char **digest; /* borrowed from the document */
    size_t n;
} keyset;

typedef struct keyent {
    char *text;
    const char *digest;
} keyent;

static int cmp_ent(const void *a, const void *b)
{
    return strcmp(((const keyent *)a)->text, ((const keyent *)b)->text);
}

static keyset keys_of(const cJSON *doc, const char *skip)
{
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(doc, "keys");
    cr_assert(cJSON_IsArray(keys), "no keys array");
    size_t n = (size_t)cJSON_GetArraySize(keys);
    keyent *e = calloc(n ? n : 1, sizeof *e);
    cr_assert_not_null(e);
    size_t i = 0;
    for (const cJSON *k = keys->child; k != NULL; k = k->next, i++) {
        const cJSON *d = cJSON_GetObjectItemCaseSensitive(k, "digest");
        e[i].text = key_text(k, skip);
        e[i].digest = cJSON_IsString(d) ? d->valuestring : NULL;
    }
    qsort(e, n, sizeof *e, cmp_ent);
    keyset s = {calloc(n ? n : 1, sizeof(char *)),
                calloc(n ? n : 1, sizeof(char *)), n};
    for (i = 0; i < n; i++) {
        s.text[i] = e[i].text;
        s.digest[i] = e[i].digest;
    }
    free(e);
    return s;
}

static void keyset_free(keyset *s)
{
    for (size_t i = 0; i < s->n; i++)
        free(s->text[i]);
    free(s->text);
    free((void *)s->digest);
}

/* Compares two sorted key sets; reports up to 3 differences each way. */
static void expect_same_keys(const keyset *got, const keyset *want,
                             const char *label)
{
    size_t i = 0, j = 0, extra = 0, missing = 0;
    while (i < got->n || j < want->n) {
        int c = i == got->n    ? 1
                : j == want->n ? -1
                               : strcmp(got->text[i], want->text[j]);
        if (c < 0 && extra++ < 3)
            cr_expect_fail("[%s] unexpected key %s", label, got->text[i]);
        if (c > 0 && missing++ < 3)
            cr_expect_fail("[%s] missing key %s", label, want->text[j]);
        i += c <= 0;
        j += c >= 0;
    }
    cr_expect(extra == 0 && missing == 0, "[%s] %zu extra, %zu missing keys",
              label, extra, missing);
}

/* Expects no two keys of a set to be equal (the output holds no
 * duplicates, §4) and every digest to be 64 lowercase hex digits. */
static void expect_unique_hex(const keyset *s, const char *label)
{
    for (size_t i = 1; i < s->n; i++)
        cr_expect(strcmp(s->text[i - 1], s->text[i]) != 0,
                  "[%s] duplicate key %s", label, s->text[i]);
    for (size_t i = 0; i < s->n; i++) {
        const char *d = s->digest[i];
        bool ok = d != NULL && strlen(d) == 64;
        for (size_t k = 0; ok && k < 64; k++)
            ok = isdigit((unsigned char)d[k]) || (d[k] >= 'a' && d[k] <= 'f');
        cr_expect(ok, "[%s] bad digest %s for %s", label, d ? d : "(none)",
                  s->text[i]);
    }
}

static const char *const models[] = {
    "composite-text-config", "deepseek-v3.2-exp", "deepseek-v4-flash",
    "glm-5-next-kpool",      "glm-5.2",
};

static const struct {
    const char *name;
    const char *flags[8];
} deploys[] = {
    {"default", {NULL}},
    {"dcp2", {"--dcp-world", "2"}},
    {"dcp8-pcp2-bs256",
     {"--dcp-world", "8", "--pcp", "2", "--block-size", "256"}},
};

/* Runs one model under one deployment of the table above. */
static cJSON *run_fixture(const char *model, size_t dep, const char *extra1,
                          const char *extra2)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s.json", KW_FIXTURES, model);
    const char *args[20] = {"keys", "--model", path, "--json"};
    size_t n = 4;
    for (size_t j = 0; deploys[dep].flags[j] != NULL; j++)
        args[n++] = deploys[dep].flags[j];
    if (extra1 != NULL) {
        args[n++] = extra1;
        args[n++] = extra2;
    }
    args[n] = NULL;
    return keys_json(args);
}

static void expect_number(const cJSON *got, const cJSON *want,
                          const char *name, const char *label)
{
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(got, name);
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(want, name);
    cr_assert(cJSON_IsNumber(w), "[%s] expected file lacks %s", label, name);
    cr_expect(cJSON_IsNumber(g) && g->valuedouble == w->valuedouble,
              "[%s] %s = %g, want %g", label, name,
              cJSON_IsNumber(g) ? g->valuedouble : -1.0, w->valuedouble);
}

Test(cli_json, json_output_matches_expected_fixtures)
{
    size_t compared = 0;
    for (size_t m = 0; m < N(models); m++) {
        for (size_t d = 0; d < N(deploys); d++) {
            char label[128], path[512];
            snprintf(label, sizeof label, "%s.%s", models[m], deploys[d].name);
            snprintf(path, sizeof path, "%s/expected/%s.json", KW_FIXTURES,
                     label);
            char *text = kw_test_read_file(path, NULL);
            cr_assert_not_null(text, "%s: %s", path, strerror(errno));
            cJSON *want = cJSON_Parse(text);
            free(text);
            cr_assert_not_null(want, "%s is not JSON", path);
            cJSON *got = run_fixture(models[m], d, NULL, NULL);
            const cJSON *gt = cJSON_GetObjectItemCaseSensitive(got,
                                                               "text_config");
            const cJSON *wt = cJSON_GetObjectItemCaseSensitive(want,
                                                               "text_config");
            cr_expect(cJSON_IsString(gt) && cJSON_IsString(wt) &&
                          strcmp(gt->valuestring, wt->valuestring) == 0,
                      "[%s] text_config", label);
            expect_number(got, want, "workspace_rows", label);
            expect_number(got, want, "workspace_bytes", label);
            keyset g = keys_of(got, NULL), w = keys_of(want, NULL);
            expect_unique_hex(&g, label);
            cr_expect_eq(g.n, w.n, "[%s] %zu keys, want %zu", label, g.n,
                         w.n);
            expect_same_keys(&g, &w, label);
            keyset_free(&g);
            keyset_free(&w);
            cJSON_Delete(got);
            cJSON_Delete(want);
            compared++;
        }
    }
    cr_expect_eq(compared, 15);
}

Test(cli_json, json_document_reports_model_settings_and_deployment)
{
    /* §6's example is the composite fixture under the defaults. */
    cJSON *doc = keys_json(ARGS("keys", "--model",
                                KW_FIXTURES "/composite-text-config.json",
                                "--json"));
    cJSON *want = cJSON_Parse(
        "{\"text_config\": \"/text_config\","
        " \"settings\": {\"index_topk\": 2048, \"compress_ratios\": [],"
        " \"index_kpool\": null, \"max_model_len\": 163840,"
        " \"kv_lora_rank\": 512, \"qk_rope_head_dim\": 64,"
        " \"index_n_heads\": 64, \"index_head_dim\": 128},"
        " \"deployment\": {\"dcp_world\": 1, \"dcp_rank\": \"all\","
        " \"dcp_interleave\": 1, \"pcp\": 1,"
        " \"max_num_batched_tokens\": 8192, \"max_num_seqs\": 256,"
        " \"block_size\": 64, \"max_model_len\": 163840,"
        " \"block_stride_rows\": 64, \"num_speculative_tokens\": 0,"
        " \"arch\": [\"sm_90\"]},"
        " \"workspace_rows\": 65536, \"workspace_bytes\": 75497472}");
    cr_assert_not_null(want);
    const cJSON *model = cJSON_GetObjectItemCaseSensitive(doc, "model");
    cr_expect(cJSON_IsString(model) &&
                  strcmp(model->valuestring,
                         KW_FIXTURES "/composite-text-config.json") == 0,
              "model is the path as given");
    for (const cJSON *w = want->child; w != NULL; w = w->next) {
        const cJSON *g = cJSON_GetObjectItemCaseSensitive(doc, w->string);
        char *gs = g ? cJSON_PrintUnformatted(g) : NULL;
        char *ws = cJSON_PrintUnformatted(w);
        cr_expect(g != NULL && cJSON_Compare(g, w, true), "%s: %s, want %s",
                  w->string, gs ? gs : "(absent)", ws);
        free(gs);
        free(ws);
    }
    cJSON_Delete(want);
    cJSON_Delete(doc);
    /* The deployment echoes the flags after resolution. */
    doc = run_fixture("deepseek-v4-flash", 2, NULL, NULL);
    const cJSON *dep = cJSON_GetObjectItemCaseSensitive(doc, "deployment");
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(dep, "dcp_world")
                     ->valuedouble, 8);
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(dep, "pcp")->valuedouble,
                 2);
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(dep, "block_size")
                     ->valuedouble, 256);
    cr_expect_eq(cJSON_GetObjectItemCaseSensitive(dep, "block_stride_rows")
                     ->valuedouble, 256);
    cJSON_Delete(doc);
}

/* ---- digests ------------------------------------------------------------ */

/* Expects two key sets to hold the same keys with the same digests. */
static void expect_same_digests(const keyset *a, const keyset *b,
                                const char *label)
{
    expect_same_keys(a, b, label);
    for (size_t i = 0; i < a->n && i < b->n; i++)
        cr_expect(a->digest[i] && b->digest[i] &&
                      strcmp(a->digest[i], b->digest[i]) == 0,
                  "[%s] digest of %s differs", label, a->text[i]);
}

Test(cli_json, digests_are_identical_across_processes)
{
    for (size_t m = 0; m < N(models); m++) {
        cJSON *a = run_fixture(models[m], 1, NULL, NULL);
        cJSON *b = run_fixture(models[m], 1, NULL, NULL);
        keyset ka = keys_of(a, NULL), kb = keys_of(b, NULL);
        expect_same_digests(&ka, &kb, models[m]);
        keyset_free(&ka);
        keyset_free(&kb);
        cJSON_Delete(a);
        cJSON_Delete(b);
    }
}

Test(cli_json, digests_are_identical_across_working_directories)
{
    /* Each test runs in its own process, so chdir stays local to it. */
    cr_assert_eq(chdir("/"), 0);
    cJSON *a = keys_json(ARGS("keys", "--model", V4, "--json",
                              "--dcp-world", "2"));
    cr_assert_eq(chdir(KW_FIXTURES), 0, "%s", strerror(errno));
    cJSON *b = keys_json(ARGS("keys", "--model", "deepseek-v4-flash.json",
                              "--json", "--dcp-world", "2"));
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(b, "model");
    cr_expect(cJSON_IsString(mb) &&
                  strcmp(mb->valuestring, "deepseek-v4-flash.json") == 0,
              "the path is reported as given");
    keyset ka = keys_of(a, NULL), kb = keys_of(b, NULL);
    cr_expect(ka.n > 0);
    expect_same_digests(&ka, &kb, "cwd / vs fixtures");
    keyset_free(&ka);
    keyset_free(&kb);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

Test(cli_json, block_stride_rows_changes_only_index_conversion_digests)
{
    cJSON *a = run_fixture("deepseek-v3.2-exp", 0, NULL, NULL);
    cJSON *b = run_fixture("deepseek-v3.2-exp", 0, "--block-stride-rows",
                           "4096");
    /* Without the one field, the keys pair up one to one. */
    keyset ka = keys_of(a, "block_stride_rows");
    keyset kb = keys_of(b, "block_stride_rows");
    expect_same_keys(&ka, &kb, "stride 64 vs 4096");
    size_t conv = 0;
    for (size_t i = 0; i < ka.n && i < kb.n; i++) {
        bool is_conv = strncmp(ka.text[i], "index_conversion|", 17) == 0;
        bool same = strcmp(ka.digest[i], kb.digest[i]) == 0;
        conv += is_conv;
        if (is_conv)
            cr_expect(!same, "digest unchanged for %s", ka.text[i]);
        else
            cr_expect(same, "digest changed for %s", ka.text[i]);
    }
    /* §7: with W = 1 there are 4 index_conversion keys, each with 4096. */
    cr_expect_eq(conv, 4);
    keyset_free(&ka);
    keyset_free(&kb);
    keyset kfull = keys_of(b, NULL);
    for (size_t i = 0; i < kfull.n; i++)
        if (strncmp(kfull.text[i], "index_conversion|", 17) == 0)
            cr_expect(strstr(kfull.text[i], "block_stride_rows=4096") != NULL,
                      "%s", kfull.text[i]);
    keyset_free(&kfull);
    cJSON_Delete(a);
    cJSON_Delete(b);
}

/* Rewrites each key text's arch to "*" so keys of two archs pair up. */
static void blank_arch(keyset *s)
{
    for (size_t i = 0; i < s->n; i++) {
        char *bar = strchr(s->text[i], '|');
        char *bar2 = bar ? strchr(bar + 1, '|') : NULL;
        cr_assert_not_null(bar2);
        memmove(bar + 2, bar2, strlen(bar2) + 1);
        bar[1] = '*';
    }
}

Test(cli_json, arch_changes_every_digest)
{
    cJSON *a = run_fixture("deepseek-v4-flash", 1, "--arch", "sm_90");
    cJSON *b = run_fixture("deepseek-v4-flash", 1, "--arch", "sm_100");
    cJSON *both = run_fixture("deepseek-v4-flash", 1, "--arch",
                              "sm_90,sm_100");
    keyset ka = keys_of(a, NULL), kb = keys_of(b, NULL);
    keyset kboth = keys_of(both, NULL);
    /* The union of the two runs, digests included. */
    cr_expect_eq(kboth.n, ka.n + kb.n);
    for (size_t i = 0; i < kboth.n; i++) {
        const keyset *one = strstr(kboth.text[i], "|sm_90|") ? &ka : &kb;
        bool found = false;
        for (size_t j = 0; j < one->n && !found; j++)
            found = strcmp(one->text[j], kboth.text[i]) == 0 &&
                    strcmp(one->digest[j], kboth.digest[i]) == 0;
        cr_expect(found, "%s not as in its one-arch run", kboth.text[i]);
    }
    blank_arch(&ka);
    blank_arch(&kb);
    expect_same_keys(&ka, &kb, "sm_90 vs sm_100 fields");
    for (size_t i = 0; i < ka.n; i++)
        for (size_t j = 0; j < kb.n; j++)
            cr_expect(strcmp(ka.digest[i], kb.digest[j]) != 0,
                      "sm_90 and sm_100 share digest %s", ka.digest[i]);
    keyset_free(&ka);
    keyset_free(&kb);
    keyset_free(&kboth);
    cJSON_Delete(a);
    cJSON_Delete(b);
    cJSON_Delete(both);
}

Test(cli_json, every_key_of_a_run_has_its_own_digest)
{
    cJSON *doc = run_fixture("glm-5-next-kpool", 2, "--arch", "sm_90,sm_100a");
    keyset k = keys_of(doc, NULL);
    cr_expect(k.n > 0);
    for (size_t i = 0; i < k.n; i++)
        for (size_t j = i + 1; j < k.n; j++)
            cr_expect(strcmp(k.digest[i], k.digest[j]) != 0,
                      "%s and %s share a digest", k.text[i], k.text[j]);
    keyset_free(&k);
    cJSON_Delete(doc);
}

/* The CLI's digest is kw_keys_digest() of the printed (family, fields,
 * arch); changing only the family changes it. */
Test(cli_json, digest_covers_the_family)
{
    cJSON *doc = run_fixture("deepseek-v4-flash", 1, NULL, NULL);
    const cJSON *keys = cJSON_GetObjectItemCaseSensitive(doc, "keys");
    size_t checked = 0;
    for (const cJSON *k = keys->child; k != NULL; k = k->next) {
        kw_keys_key key;
        memset(&key, 0, sizeof key);
        const char *fam =
            cJSON_GetObjectItemCaseSensitive(k, "family")->valuestring;
        cr_assert_eq(kw_keys_family_from_name(fam, &key.family), 0, "%s",
                     fam);
        snprintf(key.arch, sizeof key.arch, "%s",
                 cJSON_GetObjectItemCaseSensitive(k, "arch")->valuestring);
        const cJSON *fields = cJSON_GetObjectItemCaseSensitive(k, "fields");
        for (size_t i = 0; i < kw_keys_nfields(key.family); i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(
                fields, kw_keys_field_name(key.family, i));
            cr_assert_not_null(v);
            key.fields[i] = cJSON_IsBool(v) ? cJSON_IsTrue(v)
                                            : (int64_t)v->valuedouble;
        }
        uint8_t dg[KW_KEYS_DIGEST_LEN];
        char hex[KW_KEYS_HEX_LEN];
        cr_assert_eq(kw_keys_digest(&key, dg), 0);
        kw_keys_hex(dg, hex);
        cr_expect_str_eq(
            hex, cJSON_GetObjectItemCaseSensitive(k, "digest")->valuestring,
            "%s", fam);
        /* Same field values and arch, every other family. */
        for (int f = 0; f < KW_K_NFAMILIES; f++) {
            if (f == (int)key.family)
                continue;
            kw_keys_key other = key;
            other.family = (kw_k_family)f;
            char ohex[KW_KEYS_HEX_LEN];
            cr_assert_eq(kw_keys_digest(&other, dg), 0);
            kw_keys_hex(dg, ohex);
            cr_expect_str_neq(ohex, hex, "%s vs %s", fam,
                              kw_keys_family_name((kw_k_family)f));
        }
        checked++;
    }
    cr_expect(checked > 0);
    cJSON_Delete(doc);
}

/* ---- issue 15: bad indexer inputs exit 2 naming the pointer or flag ---- */

Test(cli_json, bad_indexer_inputs_exit_2_naming_pointer_or_flag,
     .init = tmp_setup, .fini = tmp_teardown)
{
    expect_bad_input("head_dim 100",
                     ARGS("keys", "--model",
                          KW_FIXTURES "/bad/head-dim-not-32.json"),
                     NEEDLES("head-dim-not-32.json",
                             "/text_config/index_head_dim"));
    expect_bad_input("heads 512",
                     ARGS("keys", "--model",
                          KW_FIXTURES "/bad/heads-out-of-range.json"),
                     NEEDLES("heads-out-of-range.json", "/index_n_heads"));
    expect_bad_input("--num-speculative-tokens 8",
                     ARGS("keys", "--model", V32, "--num-speculative-tokens",
                          "8"),
                     NEEDLES("--num-speculative-tokens"));
    static const char dep[] = "{\"num_speculative_tokens\": 8}";
    char *path = tmp_file("spec8.json", dep, sizeof dep - 1);
    expect_bad_input("deploy num_speculative_tokens 8",
                     ARGS("keys", "--model", V32, "--deploy", path),
                     NEEDLES("spec8.json", "/num_speculative_tokens"));
    free(path);
}

/* --num-speculative-tokens 1 (flag or deploy file): decode next_n 2. */
Test(cli_json, speculative_tokens_reach_the_decode_key,
     .init = tmp_setup, .fini = tmp_teardown)
{
    static const char dep[] = "{\"num_speculative_tokens\": 1}";
    char *path = tmp_file("spec1.json", dep, sizeof dep - 1);
    cJSON *docs[2] = {
        keys_json(ARGS("keys", "--model", V32, "--num-speculative-tokens", "1",
                       "--json")),
        keys_json(ARGS("keys", "--model", V32, "--deploy", path, "--json"))};
    free(path);
    for (int d = 0; d < 2; d++) {
        size_t decode = 0;
        const cJSON *k;
        cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(docs[d], "keys"))
        {
            const cJSON *f = cJSON_GetObjectItemCaseSensitive(k, "fields");
            if (strcmp(cJSON_GetObjectItemCaseSensitive(k, "family")
                           ->valuestring, "indexer_logits") != 0 ||
                !cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(f, "paged")))
                continue;
            cr_expect_eq(cJSON_GetObjectItemCaseSensitive(f, "next_n")
                             ->valuedouble, 2);
            decode++;
        }
        cr_expect_eq(decode, 1);
        cJSON_Delete(docs[d]);
    }
}
