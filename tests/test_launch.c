/* test_launch.c: the launch contract without a GPU (issue 22).
 *
 * Every warmed key is reachable and every reachable key is warmed: for
 * every fixture under the deployments of tests/fixtures/expected/ and
 * every rank, the keys dispatch reaches from the calls a serving step
 * makes (runtime values, not classes) equal the keys jit/ derives for
 * that rank, and their union over ranks equals the expected file.  The
 * deployment dispatch reads comes from the keys document, as in a
 * serving process.  Then the launch geometry of every warmed key, and
 * one negative test per check of a call.
 */
#include "kw_keys.h"
#include "kw_launch.h"
#include "kw_ops.h"
#include "kw_test_util.h"

#include <cjson/cJSON.h>
#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a set of (family, fields) ---------------------------------------- */

typedef struct keyset {
    int fam[4096];
    int64_t f[4096][KW_LAUNCH_MAX_FIELDS];
    size_t n;
} keyset;

static bool has(const keyset *s, int fam, const int64_t *f)
{
    for (size_t i = 0; i < s->n; i++)
        if (s->fam[i] == fam &&
            memcmp(s->f[i], f, kw_launch_nfields(fam) * 8) == 0)
            return true;
    return false;
}

static void add(keyset *s, int fam, const int64_t *f)
{
    if (has(s, fam, f))
        return;
    cr_assert(s->n < 4096);
    s->fam[s->n] = fam;
    memset(s->f[s->n], 0, sizeof(s->f[s->n]));
    memcpy(s->f[s->n], f, kw_launch_nfields(fam) * 8);
    s->n++;
}

static void show(int fam, const int64_t *f, char *buf, size_t cap)
{
    size_t len = (size_t)snprintf(buf, cap, "%s", kw_launch_family_name(fam));
    for (size_t i = 0; i < kw_launch_nfields(fam) && len < cap; i++)
        len += (size_t)snprintf(buf + len, cap - len, " %s=%lld",
                                kw_launch_field_name(fam, i),
                                (long long)f[i]);
}

/* Asserts a ⊆ b, naming the first key of a missing from b. */
static void subset(const keyset *a, const keyset *b, const char *what)
{
    for (size_t i = 0; i < a->n; i++) {
        if (has(b, a->fam[i], a->f[i]))
            continue;
        char k[512];
        show(a->fam[i], a->f[i], k, sizeof(k));
        cr_assert_fail("%s: %s", what, k);
    }
}

/* ---- the calls a serving step makes ----------------------------------- */

static void reach(keyset *s, kw_launch_op op, const kw_launch_deploy *d,
                  const kw_launch_call *c)
{
    int64_t f[KW_LAUNCH_MAX_FIELDS];
    char err[256] = "";
    int rc = kw_launch_dispatch(op, d, c, f, err, sizeof(err));
    cr_assert_eq(rc, 0, "%s: dispatch failed: %s", kw_launch_op_name(op),
                 err);
    rc = kw_launch_check(op, d, f, c, err, sizeof(err));
    cr_assert_eq(rc, 0, "%s: its own key refuses the call: %s",
                 kw_launch_op_name(op), err);
    add(s, kw_launch_op_family(op), f);
}

#define PTR 0x7f0000001000ll /* any 16-byte aligned device address */

/* prefill_chunk_metadata: query slices of every start and stop in
 * [0, max_num_batched_tokens] up to 18 (empty slices too: stop <= start
 * writes only token_to_seq), every compress ratio, seq_lens aligned or
 * not, and the world-1 geometry when prefill is context parallel. */
static void reach_pcm(keyset *s, const kw_launch_deploy *d)
{
    int64_t mnbt = d->max_num_batched_tokens;
    for (int64_t start = 0; start <= mnbt && start < 18; start++)
        for (int64_t stop = 0; stop <= mnbt && stop < 18; stop++)
            for (size_t r = 0; r < d->nratios_p; r++)
                for (int local = 0; local <= (d->pcp > 1); local++)
                    for (int al = 0; al < 2; al++) {
                        kw_launch_call c = {0};
                        c.a[KW_LAUNCH_PCM_QUERY_START_LOC] = PTR;
                        c.a[KW_LAUNCH_PCM_SEQ_LENS] = PTR + (al ? 0 : 4);
                        c.a[KW_LAUNCH_PCM_CU_K] = PTR;
                        c.a[KW_LAUNCH_PCM_KS] = c.a[KW_LAUNCH_PCM_KE] = PTR;
                        c.a[KW_LAUNCH_PCM_TOKEN_TO_SEQ] = PTR;
                        c.a[KW_LAUNCH_PCM_NUM_REQS] = 3;
                        c.a[KW_LAUNCH_PCM_SLICE_START] = start;
                        c.a[KW_LAUNCH_PCM_SLICE_STOP] = stop;
                        c.a[KW_LAUNCH_PCM_TOTAL_K] = 100;
                        c.a[KW_LAUNCH_PCM_COMPRESS_RATIO] = d->ratios_p[r];
                        c.a[KW_LAUNCH_PCM_DCP_LOCAL] = local;
                        reach(s, KW_LAUNCH_PREFILL_CHUNK_METADATA, d, &c);
                    }
}

/* compressed_slot_mapping: each compressed cache (ratio > 1), its pages
 * of block_size / ratio states, in the world-1 geometry and, under DCP,
 * the deployment's. */
static void reach_csm(keyset *s, const kw_launch_deploy *d)
{
    for (size_t r = 0; r < d->nratios_s; r++)
        for (int local = 0; local < 2; local++) {
            kw_launch_call c = {0};
            for (int i = KW_LAUNCH_CSM_SLOT_MAPPING;
                 i <= KW_LAUNCH_CSM_BLOCK_TABLE; i++)
                c.a[i] = PTR;
            c.a[KW_LAUNCH_CSM_OUT] = PTR;
            c.a[KW_LAUNCH_CSM_NUM_TOKENS] = 77;
            c.a[KW_LAUNCH_CSM_NUM_REQS] = 3;
            c.a[KW_LAUNCH_CSM_WIDTH] = kw_launch_table_width(d);
            c.a[KW_LAUNCH_CSM_BLOCK_SIZE] = d->block_size / d->ratios_s[r];
            c.a[KW_LAUNCH_CSM_COMPRESS_RATIO] = d->ratios_s[r];
            c.a[KW_LAUNCH_CSM_DCP_LOCAL] = local;
            reach(s, KW_LAUNCH_COMPRESSED_SLOT_MAPPING, d, &c);
        }
}

/* index_conversion: the forms of docs/spec/launch.md: decode rows in the
 * world-1 geometry plain, counted and compacted, or with the prefill
 * workspace; in the deployment's geometry counted, counted and compacted
 * (W > 1), with the workspace (W > 1 and P > 1).  The block table is as
 * wide as vLLM makes it. */
static void reach_ic(keyset *s, const kw_launch_deploy *d)
{
    const int forms[6][4] = {{0, 0, 0, 1}, {0, 1, 1, 1}, {1, 1, 1, 1},
                             {0, 1, 0, 0}, {0, 1, 1, 0}, {1, 1, 1, 0}};
    size_t n = d->pcp > 1 && d->dcp_world > 1 ? 6 : 5;
    for (size_t i = 0; i < n; i++) {
        if (i == 4 && d->dcp_world == 1)
            continue; /* compaction under DCP only */
        kw_launch_call c = {0};
        c.a[KW_LAUNCH_IC_REQ_ID] = c.a[KW_LAUNCH_IC_BLOCK_TABLE] = PTR;
        c.a[KW_LAUNCH_IC_TOPK_POS] = c.a[KW_LAUNCH_IC_OUT] = PTR;
        c.a[KW_LAUNCH_IC_PREFILL_REQ] = forms[i][0] ? PTR : 0;
        c.a[KW_LAUNCH_IC_WORKSPACE_START] = forms[i][0] ? PTR : 0;
        c.a[KW_LAUNCH_IC_VALID_COUNT] = forms[i][1] ? PTR : 0;
        c.a[KW_LAUNCH_IC_COMPACT_TO_FRONT] = forms[i][2];
        c.a[KW_LAUNCH_IC_DCP_LOCAL] = forms[i][3];
        c.a[KW_LAUNCH_IC_NUM_ROWS] = 9;
        c.a[KW_LAUNCH_IC_NUM_REQS] = 3;
        c.a[KW_LAUNCH_IC_NUM_PREFILL] = 2;
        c.a[KW_LAUNCH_IC_WIDTH] = kw_launch_table_width(d);
        reach(s, KW_LAUNCH_INDEX_CONVERSION, d, &c);
    }
}

/* The DCP pair (with and without row starts), the indexer's logits
 * (prefill; paged decode per compressed cache, next_n queries a request)
 * and its top-k (windowed or by row end). */
static void reach_rows(keyset *s, const kw_launch_deploy *d)
{
    for (int hrs = 0; d->dcp_world > 1 && hrs < 2; hrs++) {
        kw_launch_call c = {.a = {PTR, PTR, hrs ? PTR : 0, 5, 300, PTR}};
        reach(s, KW_LAUNCH_DCP_PACK_TOPK_CANDIDATES, d, &c);
    }
    if (d->dcp_world > 1) {
        kw_launch_call c = {.a = {PTR, 5, PTR}};
        reach(s, KW_LAUNCH_DCP_STABLE_TOPK, d, &c);
    }
    if (d->index_n_heads > 0) {
        kw_launch_call c = {.a = {PTR, PTR, PTR, PTR, PTR, PTR, 40, 500, 512,
                                  PTR, d->index_n_heads,
                                  d->index_head_dim}};
        reach(s, KW_LAUNCH_INDEXER_LOGITS, d, &c);
        for (size_t r = 0; r < d->nratios_p; r++) {
            kw_launch_call p = {
                .a = {PTR, PTR, PTR, PTR, PTR, PTR, 8, 16, 900, PTR,
                      d->block_size / d->ratios_p[r],
                      1 + d->num_speculative_tokens, d->index_n_heads,
                      d->index_head_dim}};
            reach(s, KW_LAUNCH_INDEXER_LOGITS_PAGED, d, &p);
        }
    }
    for (int win = 0; win < 2; win++) {
        kw_launch_call c = {.a = {PTR, win ? PTR : 0, win ? PTR : 0, 7, 700,
                                  PTR, win ? 0 : PTR}};
        reach(s, KW_LAUNCH_INDEXER_TOPK, d, &c);
    }
}

/* ---- a fixture at a deployment, rank by rank -------------------------- */

typedef struct deployment {
    const char *name; /* of tests/fixtures/expected/NAME.<this>.json */
    const char *flags[8];
} deployment;

static const deployment deployments[] = {
    {"default", {NULL}},
    {"dcp2", {"--dcp-world", "2", NULL}},
    {"dcp8-pcp2-bs256",
     {"--dcp-world", "8", "--pcp", "2", "--block-size", "256", NULL}},
};

static const char *const fixtures[] = {
    "composite-text-config", "deepseek-v3.2-exp", "deepseek-v4-flash",
    "glm-5-next-kpool", "glm-5.2"};

/* Keys of the document doc (a keys --json or an expected file). */
static void doc_keys(const cJSON *doc, keyset *s)
{
    const cJSON *k;
    cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(doc, "keys")) {
        int fam = kw_launch_family_from_name(cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(k, "family")));
        cr_assert(fam >= 0);
        const cJSON *fj = cJSON_GetObjectItemCaseSensitive(k, "fields");
        int64_t f[KW_LAUNCH_MAX_FIELDS] = {0};
        for (size_t i = 0; i < kw_launch_nfields(fam); i++) {
            const cJSON *v = cJSON_GetObjectItemCaseSensitive(
                fj, kw_launch_field_name(fam, i));
            f[i] = cJSON_IsBool(v) ? cJSON_IsTrue(v) : (int64_t)v->valuedouble;
        }
        add(s, fam, f);
    }
}

/* `kwarm keys --model FIXTURE FLAGS [--dcp-rank R] --json`, parsed. */
static cJSON *keys_doc(const char *fixture, const deployment *dep, int rank)
{
    char path[512], r[16];
    snprintf(path, sizeof(path), "%s/%s.json", KW_FIXTURES, fixture);
    snprintf(r, sizeof(r), "%d", rank);
    const char *argv[24] = {KW_KWARM_BIN, "keys", "--model", path, "--json"};
    size_t n = 5;
    for (size_t i = 0; dep->flags[i]; i++)
        argv[n++] = dep->flags[i];
    if (rank >= 0) {
        argv[n++] = "--dcp-rank";
        argv[n++] = r;
    }
    argv[n] = NULL;
    char *out = NULL, *err = NULL;
    int st = kw_test_run(argv, &out, &err);
    cr_assert_eq(st, 0, "kwarm keys %s: %s", fixture, err ? err : "");
    cJSON *doc = cJSON_Parse(out);
    cr_assert_not_null(doc);
    free(out);
    free(err);
    return doc;
}

static int64_t world_of(const deployment *dep)
{
    for (size_t i = 0; dep->flags[i]; i += 2)
        if (strcmp(dep->flags[i], "--dcp-world") == 0)
            return atoll(dep->flags[i + 1]);
    return 1;
}

static void check_fixture(const char *fixture, const deployment *dep)
{
    keyset *all = calloc(1, sizeof(*all)), *want = calloc(1, sizeof(*want));
    cr_assert(all && want);
    for (int64_t rank = 0; rank < world_of(dep); rank++) {
        keyset *warmed = calloc(1, sizeof(*warmed));
        keyset *reached = calloc(1, sizeof(*reached));
        cr_assert(warmed && reached);
        cJSON *doc = keys_doc(fixture, dep, (int)rank);
        doc_keys(doc, warmed);
        char *text = cJSON_PrintUnformatted(doc), err[256] = "";
        kw_launch_deploy d;
        cr_assert_eq(kw_ops_deploy_from_keys(text, &d, err, sizeof(err)), 0,
                     "%s: %s", fixture, err);
        reach_pcm(reached, &d);
        reach_csm(reached, &d);
        reach_ic(reached, &d);
        reach_rows(reached, &d);
        char what[256];
        snprintf(what, sizeof(what), "%s %s rank %lld: warmed, not reached",
                 fixture, dep->name, (long long)rank);
        subset(warmed, reached, what);
        snprintf(what, sizeof(what), "%s %s rank %lld: reached, not warmed",
                 fixture, dep->name, (long long)rank);
        subset(reached, warmed, what);
        for (size_t i = 0; i < reached->n; i++)
            add(all, reached->fam[i], reached->f[i]);
        cJSON_free(text);
        cJSON_Delete(doc);
        free(warmed);
        free(reached);
    }
    char path[512];
    snprintf(path, sizeof(path), "%s/expected/%s.%s.json", KW_FIXTURES,
             fixture, dep->name);
    char *text = kw_test_read_file(path, NULL);
    cr_assert_not_null(text, "%s", path);
    cJSON *expected = cJSON_Parse(text);
    doc_keys(expected, want);
    subset(want, all, "expected but reached on no rank");
    subset(all, want, "reached on some rank but not expected");
    cJSON_Delete(expected);
    free(text);
    free(all);
    free(want);
}

Test(launch, every_warmed_key_is_reached_and_every_reached_key_warmed)
{
    size_t nf = sizeof(fixtures) / sizeof(fixtures[0]);
    for (size_t i = 0; i < nf; i++)
        for (size_t j = 0; j < 3; j++)
            check_fixture(fixtures[i], &deployments[j]);
}
