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
#include "kw_err.h"
#include "kw_kernels.h"
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

/* ---- geometry of every warmed key -------------------------------------- */

/* A call for key (fam, f) of d with rows rows (and as much of everything
 * else), whose sizes are in the key's classes. */
static kw_launch_op op_of_key(int fam, const int64_t *f)
{
    if (fam == 5 && f[2])
        return KW_LAUNCH_INDEXER_LOGITS_PAGED;
    return (kw_launch_op)fam;
}

/* Checks the geometry of key (fam, f) at a few call sizes. */
static void check_geometry(int fam, const int64_t *f)
{
    kw_launch_op op = op_of_key(fam, f);
    unsigned threads = kw_k_block_threads((kw_k_family)fam, f);
    unsigned qb = kw_launch_logits_queries(fam, f);
    static const int64_t sizes[] = {0, 1, 17, 4096, 1000003};
    for (size_t i = 0; i < sizeof(sizes) / sizeof(sizes[0]); i++) {
        int64_t n = sizes[i];
        kw_launch_call c = {0};
        for (int j = 0; j < KW_LAUNCH_MAX_ARGS; j++)
            c.a[j] = n; /* every size n (pointers are not read) */
        if (op == KW_LAUNCH_PREFILL_CHUNK_METADATA) {
            c.a[KW_LAUNCH_PCM_SLICE_START] = 0;
            c.a[KW_LAUNCH_PCM_TOTAL_K] = 0;
        }
        if (op == KW_LAUNCH_INDEXER_LOGITS_PAGED) {
            c.a[KW_LAUNCH_PAGED_NUM_REQS] = n > 65535 ? 65535 : n;
            c.a[KW_LAUNCH_PAGED_MAX_ROWS] = 65536;
        }
        kw_launch_geo g;
        cr_assert_eq(kw_launch_geometry(op, f, &c, 132, &g), 0, "%s n=%lld",
                     kw_launch_op_name(op), (long long)n);
        cr_assert_eq(g.block[0], threads);
        cr_assert_eq(g.block[1] * g.block[2], 1);
        cr_assert_eq(g.shmem, kw_k_shmem_bytes((kw_k_family)fam, f));
        uint64_t blocks = g.grid[0];
        if (n == 0) {
            cr_assert_eq(blocks, 0, "%s: an empty call launches nothing",
                         kw_launch_op_name(op));
            continue;
        }
        cr_assert_geq(blocks, 1, "%s n=%lld", kw_launch_op_name(op),
                      (long long)n);
        switch (op) {
        case KW_LAUNCH_PREFILL_CHUNK_METADATA:
        case KW_LAUNCH_COMPRESSED_SLOT_MAPPING:
            /* Ranged: each block a contiguous range of 4-item tiles; at
             * most 256 blocks unless each takes 16 tiles or more. */
            cr_assert_leq(blocks, (uint64_t)(n + 4 * threads - 1) /
                                      (4 * threads));
            cr_assert(blocks <= 256 || blocks * 16 * 4 * threads >=
                                           (uint64_t)n);
            break;
        case KW_LAUNCH_INDEX_CONVERSION: {
            uint64_t per = f[11] <= 512 ? 4 * (uint64_t)f[4] : 1;
            cr_assert_geq(blocks * per, (uint64_t)n);
            cr_assert_lt((blocks - 1) * per, (uint64_t)n);
            break;
        }
        case KW_LAUNCH_INDEXER_LOGITS:
            cr_assert_eq(g.grid[0], ((uint64_t)n + qb - 1) / qb);
            cr_assert(g.grid[1] >= 1 && g.grid[2] == 1);
            break;
        case KW_LAUNCH_INDEXER_LOGITS_PAGED:
            cr_assert(blocks >= 1 && blocks <= 400, "split %llu",
                      (unsigned long long)blocks);
            cr_assert_eq(g.grid[1], (unsigned)c.a[KW_LAUNCH_PAGED_NUM_REQS]);
            cr_assert_eq(g.grid[2], (unsigned)((f[4] + qb - 1) / qb));
            break;
        default: /* one block per row */
            cr_assert_eq(blocks, (uint64_t)n);
        }
    }
}

Test(launch, every_warmed_key_has_the_kernels_block_shmem_and_a_grid_that_covers_the_call)
{
    size_t nf = sizeof(fixtures) / sizeof(fixtures[0]);
    for (size_t i = 0; i < nf; i++)
        for (size_t j = 0; j < 3; j++) {
            char path[512];
            snprintf(path, sizeof(path), "%s/expected/%s.%s.json",
                     KW_FIXTURES, fixtures[i], deployments[j].name);
            char *text = kw_test_read_file(path, NULL);
            cJSON *doc = cJSON_Parse(text);
            keyset *s = calloc(1, sizeof(*s));
            doc_keys(doc, s);
            for (size_t k = 0; k < s->n; k++)
                check_geometry(s->fam[k], s->f[k]);
            free(s);
            cJSON_Delete(doc);
            free(text);
        }
}

/* The prefill split: grid y is 1 once grid x fills a wave of resident
 * blocks (one block of 512 threads and 132 KiB an SM here), and below
 * that as many parts as make 4 waves, but no more than one per 4096 rows
 * of num_k. */
Test(launch, a_prefill_grid_under_one_wave_splits_its_windows_over_grid_y)
{
    static const struct {
        int64_t rows, num_k;
        unsigned sm, x, y;
    } cases[] = {
        {8192, 65536, 132, 1024, 1},
        {1056, 65536, 132, 132, 1},  /* exactly one wave */
        {1048, 65536, 132, 131, 5},  /* just under: ceil(528 / 131) */
        {1024, 65536, 132, 128, 5},
        {1024, 16384, 132, 128, 4},  /* one part per 4096 rows at most */
        {1024, 8192, 132, 128, 2},
        {1024, 8191, 132, 128, 1},
        {8, 65536, 132, 1, 16},      /* 65536 / 4096 parts */
        {8, 1 << 23, 132, 1, 528},   /* 4 waves of 132 */
        {1024, 65536, 78, 128, 1},   /* a smaller GPU: a wave is 78 */
    };
    int64_t f[KW_LAUNCH_MAX_FIELDS] = {64, 128, 0, 0, 1};
    for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
        kw_launch_call c = {0};
        c.a[KW_LAUNCH_LOGITS_NUM_ROWS] = cases[i].rows;
        c.a[KW_LAUNCH_LOGITS_NUM_K] = cases[i].num_k;
        kw_launch_geo g;
        cr_assert_eq(kw_launch_geometry(KW_LAUNCH_INDEXER_LOGITS, f, &c,
                                        cases[i].sm, &g), 0);
        cr_assert_eq(g.grid[0], cases[i].x, "case %zu", i);
        cr_assert_eq(g.grid[1], cases[i].y, "case %zu: y %u", i, g.grid[1]);
    }
}

/* The decode split: one request of 65,536 rows spreads over more than
 * 80 blocks but no more than a wave (3 blocks an SM of 132 for next_n 1),
 * and 32 requests stay in one wave rather than three. */
Test(launch, a_small_decode_batch_takes_one_wave_of_blocks)
{
    int64_t f[KW_LAUNCH_MAX_FIELDS] = {64, 128, 1, 64, 1};
    kw_launch_call c = {0};
    c.a[KW_LAUNCH_PAGED_MAX_ROWS] = 65536;
    kw_launch_geo g;
    c.a[KW_LAUNCH_PAGED_NUM_REQS] = 1;
    cr_assert_eq(kw_launch_geometry(KW_LAUNCH_INDEXER_LOGITS_PAGED, f, &c,
                                    132, &g), 0);
    cr_assert(g.grid[0] > 80 && g.grid[0] <= 396, "split %u", g.grid[0]);
    c.a[KW_LAUNCH_PAGED_NUM_REQS] = 32;
    cr_assert_eq(kw_launch_geometry(KW_LAUNCH_INDEXER_LOGITS_PAGED, f, &c,
                                    132, &g), 0);
    cr_assert(g.grid[0] * 32 <= 396 && g.grid[0] * 32 > 198, "split %u",
              g.grid[0]);
    c.a[KW_LAUNCH_PAGED_NUM_REQS] = 128;
    cr_assert_eq(kw_launch_geometry(KW_LAUNCH_INDEXER_LOGITS_PAGED, f, &c,
                                    132, &g), 0);
    cr_assert_eq(g.grid[0], 3); /* 384 blocks: the H200's best (perf.md) */
}

Test(launch, a_grid_past_the_drivers_limits_is_refused)
{
    int64_t f[KW_LAUNCH_MAX_FIELDS] = {64, 128, 1, 64, 1};
    kw_launch_call c = {0};
    c.a[KW_LAUNCH_PAGED_NUM_REQS] = 65536; /* gridDim.y <= 65535 */
    c.a[KW_LAUNCH_PAGED_MAX_ROWS] = 64;
    kw_launch_geo g;
    cr_assert_eq(kw_launch_geometry(KW_LAUNCH_INDEXER_LOGITS_PAGED, f, &c,
                                    132, &g), KW_EINVAL);
    c.a[KW_LAUNCH_PAGED_NUM_REQS] = 65535;
    cr_assert_eq(kw_launch_geometry(KW_LAUNCH_INDEXER_LOGITS_PAGED, f, &c,
                                    132, &g), 0);
}

/* ---- the checks of a call: one negative test per rule ----------------- */

/* V3.2 at dcp_world 2, rank 1, from its keys document. */
static kw_launch_deploy v32_dcp2(void)
{
    static const deployment dep = {"dcp2", {"--dcp-world", "2", NULL}};
    cJSON *doc = keys_doc("deepseek-v3.2-exp", &dep, 1);
    char *text = cJSON_PrintUnformatted(doc), err[256] = "";
    kw_launch_deploy d;
    cr_assert_eq(kw_ops_deploy_from_keys(text, &d, err, sizeof(err)), 0,
                 "%s", err);
    cJSON_free(text);
    cJSON_Delete(doc);
    return d;
}

/* Dispatch then check of c: the code, with err checked to name want. */
static int run_checks(kw_launch_op op, const kw_launch_deploy *d,
                      const kw_launch_call *c, const int64_t *fields,
                      const char *want)
{
    int64_t f[KW_LAUNCH_MAX_FIELDS];
    char err[256] = "";
    int rc = kw_launch_dispatch(op, d, c, f, err, sizeof(err));
    if (rc == 0)
        rc = kw_launch_check(op, d, fields ? fields : f, c, err,
                             sizeof(err));
    if (want)
        cr_assert(rc == KW_EINVAL && strstr(err, want),
                  "%s: want KW_EINVAL naming '%s', got %d: %s",
                  kw_launch_op_name(op), want, rc, err);
    else
        cr_assert_eq(rc, 0, "%s: %s", kw_launch_op_name(op), err);
    return rc;
}

static kw_launch_call topk_call(void)
{
    return (kw_launch_call){.a = {PTR, PTR, PTR, 3, 100, PTR, 0}};
}

Test(launch, a_size_outside_int32_or_a_flag_not_0_or_1_is_refused)
{
    kw_launch_deploy d = v32_dcp2();
    kw_launch_call c = topk_call();
    run_checks(KW_LAUNCH_INDEXER_TOPK, &d, &c, NULL, NULL);
    c.a[KW_LAUNCH_TOPK_NUM_ROWS] = -1;
    run_checks(KW_LAUNCH_INDEXER_TOPK, &d, &c, NULL, "num_rows: -1");
    c.a[KW_LAUNCH_TOPK_NUM_ROWS] = (int64_t)INT32_MAX + 1;
    run_checks(KW_LAUNCH_INDEXER_TOPK, &d, &c, NULL, "num_rows");
    c.a[KW_LAUNCH_TOPK_NUM_ROWS] = INT32_MAX;
    cr_assert_eq(run_checks(KW_LAUNCH_INDEXER_TOPK, &d, &c, NULL, NULL), 0);
    kw_launch_call ic = {0};
    ic.a[KW_LAUNCH_IC_COMPACT_TO_FRONT] = 2;
    run_checks(KW_LAUNCH_INDEX_CONVERSION, &d, &ic, NULL,
               "compact_to_front: 2 is not 0 or 1");
}

Test(launch, a_null_pointer_where_elements_are_read_is_refused)
{
    kw_launch_deploy d = v32_dcp2();
    kw_launch_call c = topk_call();
    c.a[KW_LAUNCH_TOPK_TOPK_POS] = 0;
    run_checks(KW_LAUNCH_INDEXER_TOPK, &d, &c, NULL, "topk_pos: a NULL");
    c = topk_call();
    c.a[KW_LAUNCH_TOPK_KE] = 0;
    run_checks(KW_LAUNCH_INDEXER_TOPK, &d, &c, NULL, "ke: a NULL");
    c.a[KW_LAUNCH_TOPK_NUM_ROWS] = 0; /* nothing read: NULLs are fine */
    c.a[KW_LAUNCH_TOPK_TOPK_POS] = 0;
    run_checks(KW_LAUNCH_INDEXER_TOPK, &d, &c, NULL, NULL);
}

Test(launch, windows_and_row_end_together_are_refused)
{
    kw_launch_deploy d = v32_dcp2();
    kw_launch_call c = topk_call();
    c.a[KW_LAUNCH_TOPK_ROW_END] = PTR;
    run_checks(KW_LAUNCH_INDEXER_TOPK, &d, &c, NULL, "row_end: given");
    /* A windowed key given row_end alone: the key against the call. */
    int64_t win[2] = {2048, 1};
    c = (kw_launch_call){.a = {PTR, 0, 0, 3, 100, PTR, PTR}};
    run_checks(KW_LAUNCH_INDEXER_TOPK, &d, &c, win, "row_end: given");
    c.a[KW_LAUNCH_TOPK_ROW_END] = 0;
    run_checks(KW_LAUNCH_INDEXER_TOPK, &d, &c, win, "ks: a NULL");
}

Test(launch, a_size_outside_its_keys_class_is_refused)
{
    kw_launch_deploy d = v32_dcp2();
    /* index_conversion: the key holds block_table_stride 16; width 18 is
     * class 2, width 1 class 1. */
    kw_launch_call c = {0};
    c.a[KW_LAUNCH_IC_REQ_ID] = c.a[KW_LAUNCH_IC_BLOCK_TABLE] = PTR;
    c.a[KW_LAUNCH_IC_TOPK_POS] = c.a[KW_LAUNCH_IC_OUT] = PTR;
    c.a[KW_LAUNCH_IC_NUM_ROWS] = 4;
    c.a[KW_LAUNCH_IC_NUM_REQS] = 2;
    c.a[KW_LAUNCH_IC_WIDTH] = 1280;
    int64_t f[KW_LAUNCH_MAX_FIELDS];
    char err[256];
    cr_assert_eq(kw_launch_dispatch(KW_LAUNCH_INDEX_CONVERSION, &d, &c, f,
                                    err, sizeof(err)), 0);
    cr_assert_eq(f[12], 16);
    run_checks(KW_LAUNCH_INDEX_CONVERSION, &d, &c, f, NULL);
    c.a[KW_LAUNCH_IC_WIDTH] = 18;
    run_checks(KW_LAUNCH_INDEX_CONVERSION, &d, &c, f,
               "class of width: 2, but the key's block_table_stride is 16");
    /* prefill_chunk_metadata: slice_start class 1 means exactly 1. */
    kw_launch_call p = {.a = {PTR, PTR, PTR, 2, 1, 9, 10, PTR, PTR, PTR, 1,
                              0}};
    cr_assert_eq(kw_launch_dispatch(KW_LAUNCH_PREFILL_CHUNK_METADATA, &d, &p,
                                    f, err, sizeof(err)), 0);
    p.a[KW_LAUNCH_PCM_SLICE_START] = 3;
    run_checks(KW_LAUNCH_PREFILL_CHUNK_METADATA, &d, &p, f,
               "class of slice_start: 2, but the key's is 1");
    /* ... and an aligned key refuses a misaligned seq_lens. */
    p.a[KW_LAUNCH_PCM_SLICE_START] = 1;
    p.a[KW_LAUNCH_PCM_SEQ_LENS] = PTR + 4;
    run_checks(KW_LAUNCH_PREFILL_CHUNK_METADATA, &d, &p, f,
               "seq_lens: not 16-byte aligned");
    /* paged logits: page_rows and next_n are exact. */
    int64_t pk[KW_LAUNCH_MAX_FIELDS] = {64, 128, 1, 64, 1};
    kw_launch_call q = {.a = {PTR, PTR, PTR, PTR, PTR, PTR, 2, 4, 256, PTR,
                              32, 1, 64, 128}};
    run_checks(KW_LAUNCH_INDEXER_LOGITS_PAGED, &d, &q, pk,
               "page_rows: 32, but the key's is 64");
    q.a[KW_LAUNCH_PAGED_PAGE_ROWS] = 64;
    q.a[KW_LAUNCH_PAGED_HEADS] = 32;
    run_checks(KW_LAUNCH_INDEXER_LOGITS_PAGED, &d, &q, pk, "heads: 32");
}

Test(launch, a_call_no_key_can_serve_names_the_allowed_values)
{
    kw_launch_deploy d = v32_dcp2();
    kw_launch_call p = {.a = {PTR, PTR, PTR, 2, 0, 9, 10, PTR, PTR, PTR, 4,
                              0}};
    run_checks(KW_LAUNCH_PREFILL_CHUNK_METADATA, &d, &p, NULL,
               "compress_ratio: 4 is not one of (1)");
    kw_launch_call s = {.a = {PTR, PTR, PTR, PTR, 5, 3, 0, 8, PTR, 4, 0}};
    run_checks(KW_LAUNCH_COMPRESSED_SLOT_MAPPING, &d, &s, NULL,
               "but the model has none");
    d.dcp_world = 1;
    d.dcp_rank = 0;
    kw_launch_call st = {.a = {PTR, 4, PTR}};
    run_checks(KW_LAUNCH_DCP_STABLE_TOPK, &d, &st, NULL,
               "needs dcp_world > 1");
    kw_launch_call l = {.a = {PTR, PTR, PTR, PTR, PTR, PTR, 4, 10, 9, PTR, 64,
                              128}};
    run_checks(KW_LAUNCH_INDEXER_LOGITS, &d, &l, NULL,
               "stride: 9 is below num_k (10)");
}

Test(launch, op_and_argument_tables_name_every_argument_once)
{
    for (int op = 0; op < KW_LAUNCH_NOPS; op++) {
        size_t n = kw_launch_nargs((kw_launch_op)op);
        cr_assert(n >= 3 && n <= KW_LAUNCH_MAX_ARGS);
        cr_assert_eq(kw_launch_op_from_name(kw_launch_op_name(op)), op);
        for (size_t i = 0; i < n; i++) {
            const char *a = kw_launch_arg_name((kw_launch_op)op, i);
            cr_assert_eq(kw_launch_arg_index((kw_launch_op)op, a), (int)i,
                         "%s %s twice", kw_launch_op_name(op), a);
        }
        cr_assert_null(kw_launch_arg_name((kw_launch_op)op, n));
    }
    cr_assert_eq(kw_launch_op_family(KW_LAUNCH_INDEXER_LOGITS_PAGED), 5);
    cr_assert_eq(kw_launch_op_from_name("nope"), -1);
}

Test(launch, a_deployment_dispatch_cannot_read_is_refused_naming_the_setting)
{
    kw_launch_deploy d = v32_dcp2();
    char err[256] = "";
    cr_assert_eq(kw_launch_deploy_check(&d, err, sizeof(err)), 0, "%s", err);
    d.dcp_rank = 2;
    cr_assert_eq(kw_launch_deploy_check(&d, err, sizeof(err)), KW_EINVAL);
    cr_assert(strstr(err, "dcp_rank"), "%s", err);
    d = v32_dcp2();
    d.num_speculative_tokens = 8;
    cr_assert_eq(kw_launch_deploy_check(&d, err, sizeof(err)), KW_EINVAL);
    cr_assert(strstr(err, "num_speculative_tokens"), "%s", err);
    d = v32_dcp2();
    d.nratios_p = KW_LAUNCH_MAX_RATIOS + 1;
    cr_assert_eq(kw_launch_deploy_check(&d, err, sizeof(err)), KW_EINVAL);
    d.nratios_p = KW_LAUNCH_MAX_RATIOS;
    cr_assert_eq(kw_launch_deploy_check(&d, err, sizeof(err)), 0, "%s", err);
}
