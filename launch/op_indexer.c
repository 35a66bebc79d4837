/* op_indexer.c: the per-row ops (dcp_pack_topk_candidates,
 * dcp_stable_topk, indexer_logits prefill and paged, indexer_topk):
 * dispatch, checks, grid and parameters.  Field indices follow
 * spec/warmup-keys.md §4.4-§4.7. */
#include "kw_launch.h"

#include "internal.h"
#include "kw_err.h"

#include <math.h>

/* The DCP families exist only where the deployment has DCP. */
static int need_dcp(const char *op, const kw_launch_deploy *d, char *err,
                    size_t errlen)
{
    if (d->dcp_world > 1)
        return 0;
    return kw__launch_fail(err, errlen,
                           "%s: the deployment has dcp_world 1; the op "
                           "needs dcp_world > 1", op);
}

/* ---- dcp_pack_topk_candidates (§4.4) --------------------------------- */

int kw__launch_dispatch_pack(const kw_launch_deploy *d, const int64_t *a,
                             int64_t *f, char *err, size_t errlen)
{
    int rc = need_dcp("dcp_pack_topk_candidates", d, err, errlen);
    if (rc < 0)
        return rc;
    f[0] = d->dcp_rank;
    f[1] = d->dcp_world;
    f[2] = d->dcp_interleave;
    f[3] = a[KW_LAUNCH_PACK_ROW_STARTS] != 0;
    f[4] = d->index_topk;
    f[5] = 512;
    return 0;
}

int kw__launch_check_pack(const kw_launch_deploy *d, const int64_t *f,
                          const int64_t *a, char *err, size_t errlen)
{
    static const char *const op = "dcp_pack_topk_candidates";
    (void)d;
    int64_t rows = a[KW_LAUNCH_PACK_NUM_ROWS];
    bool hrs = a[KW_LAUNCH_PACK_ROW_STARTS] != 0;
    if (hrs != (f[3] != 0))
        return kw__launch_fail(err, errlen,
                               "%s row_starts: %s, but the key has "
                               "has_row_starts %s",
                               op, hrs ? "given" : "NULL",
                               f[3] ? "true" : "false");
    int rc;
    if ((rc = kw__launch_need(op, "logits", a[KW_LAUNCH_PACK_LOGITS],
                              rows * a[KW_LAUNCH_PACK_COLS], err,
                              errlen)) < 0 ||
        (rc = kw__launch_need(op, "topk_local", a[KW_LAUNCH_PACK_TOPK_LOCAL],
                              rows * f[4], err, errlen)) < 0)
        return rc;
    return kw__launch_need(op, "packed", a[KW_LAUNCH_PACK_PACKED],
                           rows * f[4], err, errlen);
}

void kw__launch_grid_pack(const int64_t *f, const int64_t *a, unsigned sm,
                          uint64_t grid[3])
{
    (void)f;
    (void)sm;
    grid[0] = (uint64_t)a[KW_LAUNCH_PACK_NUM_ROWS];
}

void kw__launch_params_pack(const int64_t *f, const kw_launch_deploy *d,
                            const int64_t *a, kw_launch_params *p)
{
    (void)f;
    (void)d;
    kw__launch_ptr(p, a[KW_LAUNCH_PACK_LOGITS]);
    kw__launch_ptr(p, a[KW_LAUNCH_PACK_TOPK_LOCAL]);
    kw__launch_ptr(p, a[KW_LAUNCH_PACK_ROW_STARTS]);
    kw__launch_int(p, a[KW_LAUNCH_PACK_NUM_ROWS]);
    kw__launch_int(p, a[KW_LAUNCH_PACK_COLS]);
    kw__launch_ptr(p, a[KW_LAUNCH_PACK_PACKED]);
}

/* ---- dcp_stable_topk (§4.5) ------------------------------------------ */

int kw__launch_dispatch_stable(const kw_launch_deploy *d, const int64_t *a,
                               int64_t *f, char *err, size_t errlen)
{
    (void)a;
    int rc = need_dcp("dcp_stable_topk", d, err, errlen);
    if (rc < 0)
        return rc;
    f[0] = d->index_topk;
    f[1] = d->index_topk * d->dcp_world;
    return 0;
}

int kw__launch_check_stable(const kw_launch_deploy *d, const int64_t *f,
                            const int64_t *a, char *err, size_t errlen)
{
    static const char *const op = "dcp_stable_topk";
    (void)d;
    int64_t rows = a[KW_LAUNCH_STABLE_NUM_ROWS];
    int rc = kw__launch_need(op, "gathered", a[KW_LAUNCH_STABLE_GATHERED],
                             rows * f[1] * 2, err, errlen);
    if (rc < 0)
        return rc;
    return kw__launch_need(op, "out", a[KW_LAUNCH_STABLE_OUT], rows * f[0],
                           err, errlen);
}

void kw__launch_grid_stable(const int64_t *f, const int64_t *a, unsigned sm,
                            uint64_t grid[3])
{
    (void)f;
    (void)sm;
    grid[0] = (uint64_t)a[KW_LAUNCH_STABLE_NUM_ROWS];
}

void kw__launch_params_stable(const int64_t *f, const kw_launch_deploy *d,
                              const int64_t *a, kw_launch_params *p)
{
    (void)f;
    (void)d;
    kw__launch_ptr(p, a[KW_LAUNCH_STABLE_GATHERED]);
    kw__launch_int(p, a[KW_LAUNCH_STABLE_NUM_ROWS]);
    kw__launch_ptr(p, a[KW_LAUNCH_STABLE_OUT]);
}

/* ---- indexer_logits, prefill (§4.6) ---------------------------------- */

/* The prefill split's bounds (prefill_split): waves of resident blocks
 * wanted when the grid is under one, and rows of num_k per part at least
 * (the kernel itself never gives a part under 2048 rows of its window).
 * 4096: at 8192, 2048 context-parallel queries of H 32 over 8,192 rows
 * (windows of 1-2k and 6-7k rows, 128 blocks) ran unsplit at 1.32x
 * DeepGEMM's time, at 4096 (y 2) at 1.08x; the other S 2048 H 32 shapes
 * moved by -2% to +1.7% (docs/perf.md). */
#define KW_LAUNCH_PREFILL_WAVES 4u
#define KW_LAUNCH_PREFILL_PART_ROWS 4096u

int kw__launch_dispatch_logits(const kw_launch_deploy *d, const int64_t *a,
                               int64_t *f, char *err, size_t errlen)
{
    (void)d;
    (void)err;
    (void)errlen;
    f[0] = a[KW_LAUNCH_LOGITS_HEADS];
    f[1] = a[KW_LAUNCH_LOGITS_HEAD_DIM];
    f[2] = 0;
    f[3] = 0;
    f[4] = 1;
    return 0;
}

int kw__launch_check_logits(const kw_launch_deploy *d, const int64_t *f,
                            const int64_t *a, char *err, size_t errlen)
{
    static const char *const op = "indexer_logits";
    (void)d;
    int64_t T = a[KW_LAUNCH_LOGITS_NUM_ROWS], N = a[KW_LAUNCH_LOGITS_NUM_K];
    int64_t stride = a[KW_LAUNCH_LOGITS_STRIDE];
    int rc;
    if ((rc = kw__launch_same(op, "heads", a[KW_LAUNCH_LOGITS_HEADS], f[0],
                              "the key's", err, errlen)) < 0 ||
        (rc = kw__launch_same(op, "head_dim", a[KW_LAUNCH_LOGITS_HEAD_DIM],
                              f[1], "the key's", err, errlen)) < 0)
        return rc;
    if (stride < N)
        return kw__launch_fail(err, errlen,
                               "%s stride: %lld is below num_k (%lld)", op,
                               (long long)stride, (long long)N);
    int64_t hd = f[0] * f[1];
    if ((rc = kw__launch_need(op, "q", a[KW_LAUNCH_LOGITS_Q], T * hd, err,
                              errlen)) < 0 ||
        (rc = kw__launch_need(op, "w", a[KW_LAUNCH_LOGITS_W], T * f[0], err,
                              errlen)) < 0 ||
        (rc = kw__launch_need(op, "k", a[KW_LAUNCH_LOGITS_K], N * f[1], err,
                              errlen)) < 0 ||
        (rc = kw__launch_need(op, "k_scale", a[KW_LAUNCH_LOGITS_K_SCALE], N,
                              err, errlen)) < 0 ||
        (rc = kw__launch_need(op, "ks", a[KW_LAUNCH_LOGITS_KS], T, err,
                              errlen)) < 0 ||
        (rc = kw__launch_need(op, "ke", a[KW_LAUNCH_LOGITS_KE], T, err,
                              errlen)) < 0)
        return rc;
    return kw__launch_need(op, "logits", a[KW_LAUNCH_LOGITS_LOGITS],
                           T * stride, err, errlen);
}

/* Resident blocks of the key per SM: shared memory (228 KiB an SM, 1
 * KiB reserved per block, as on sm_90) and 2048 threads an SM. */
static unsigned logits_per_sm(const int64_t *f)
{
    unsigned threads = kw_launch_threads(5, f);
    unsigned per_sm = 233472u / (kw_launch_shmem(5, f) + 1024u);
    if (per_sm > 2048u / threads)
        per_sm = 2048u / threads;
    return per_sm ? per_sm : 1;
}

/* Parts each prefill block's window may be split into over grid y (any
 * split is correct).  Only a grid under one wave of resident blocks is
 * split: there SMs are idle for certain, and windows of unequal length
 * (context-parallel chunks) leave the long blocks alone at the end.  It
 * then gets KW_LAUNCH_PREFILL_WAVES waves, at most one part per
 * KW_LAUNCH_PREFILL_PART_ROWS rows of num_k; the kernel uses only as many
 * parts as its window holds 2048 rows (32 tiles), and the rest of the
 * blocks only share the -inf fill.  On the H200 a part's set-up and
 * pipeline fill cost about four tiles, and a grid of two or more waves
 * gained nothing from splitting (docs/perf.md). */
static uint64_t prefill_split(const int64_t *f, uint64_t blocks,
                              uint64_t num_k, unsigned sm)
{
    uint64_t slots = (uint64_t)logits_per_sm(f) * (sm ? sm : 1);
    if (blocks >= slots)
        return 1;
    uint64_t want = (KW_LAUNCH_PREFILL_WAVES * slots + blocks - 1) / blocks;
    uint64_t most = num_k / KW_LAUNCH_PREFILL_PART_ROWS;
    if (want > most)
        want = most;
    return want ? want : 1;
}

void kw__launch_grid_logits(const int64_t *f, const int64_t *a, unsigned sm,
                            uint64_t grid[3])
{
    uint64_t qb = kw_launch_logits_queries(5, f);
    grid[0] = ((uint64_t)a[KW_LAUNCH_LOGITS_NUM_ROWS] + qb - 1) / qb;
    grid[1] = grid[0] ? prefill_split(f, grid[0],
                                      (uint64_t)a[KW_LAUNCH_LOGITS_NUM_K], sm)
                      : 1;
}

void kw__launch_params_logits(const int64_t *f, const kw_launch_deploy *d,
                              const int64_t *a, kw_launch_params *p)
{
    (void)f;
    (void)d;
    for (int i = KW_LAUNCH_LOGITS_Q; i <= KW_LAUNCH_LOGITS_KE; i++)
        kw__launch_ptr(p, a[i]);
    for (int i = KW_LAUNCH_LOGITS_NUM_ROWS; i <= KW_LAUNCH_LOGITS_STRIDE; i++)
        kw__launch_int(p, a[i]);
    kw__launch_ptr(p, a[KW_LAUNCH_LOGITS_LOGITS]);
}

/* ---- indexer_logits, paged decode (§4.6) ----------------------------- */

int kw__launch_dispatch_paged(const kw_launch_deploy *d, const int64_t *a,
                              int64_t *f, char *err, size_t errlen)
{
    (void)d;
    (void)err;
    (void)errlen;
    f[0] = a[KW_LAUNCH_PAGED_HEADS];
    f[1] = a[KW_LAUNCH_PAGED_HEAD_DIM];
    f[2] = 1;
    f[3] = a[KW_LAUNCH_PAGED_PAGE_ROWS];
    f[4] = a[KW_LAUNCH_PAGED_NEXT_N];
    return 0;
}

int kw__launch_check_paged(const kw_launch_deploy *d, const int64_t *f,
                           const int64_t *a, char *err, size_t errlen)
{
    static const char *const op = "indexer_logits_paged";
    (void)d;
    int rc;
    if ((rc = kw__launch_same(op, "heads", a[KW_LAUNCH_PAGED_HEADS], f[0],
                              "the key's", err, errlen)) < 0 ||
        (rc = kw__launch_same(op, "head_dim", a[KW_LAUNCH_PAGED_HEAD_DIM],
                              f[1], "the key's", err, errlen)) < 0 ||
        (rc = kw__launch_same(op, "page_rows", a[KW_LAUNCH_PAGED_PAGE_ROWS],
                              f[3], "the key's", err, errlen)) < 0 ||
        (rc = kw__launch_same(op, "next_n", a[KW_LAUNCH_PAGED_NEXT_N], f[4],
                              "the key's", err, errlen)) < 0)
        return rc;
    int64_t B = a[KW_LAUNCH_PAGED_NUM_REQS], Q = B * f[4];
    int64_t width = a[KW_LAUNCH_PAGED_WIDTH];
    if ((rc = kw__launch_need(op, "q", a[KW_LAUNCH_PAGED_Q], Q * f[0] * f[1],
                              err, errlen)) < 0 ||
        (rc = kw__launch_need(op, "w", a[KW_LAUNCH_PAGED_W], Q * f[0], err,
                              errlen)) < 0 ||
        (rc = kw__launch_need(op, "k_pages", a[KW_LAUNCH_PAGED_K_PAGES],
                              B * width, err, errlen)) < 0 ||
        (rc = kw__launch_need(op, "k_scale_pages",
                              a[KW_LAUNCH_PAGED_K_SCALE_PAGES], B * width,
                              err, errlen)) < 0 ||
        (rc = kw__launch_need(op, "block_table",
                              a[KW_LAUNCH_PAGED_BLOCK_TABLE], B * width, err,
                              errlen)) < 0 ||
        (rc = kw__launch_need(op, "row_end", a[KW_LAUNCH_PAGED_ROW_END], Q,
                              err, errlen)) < 0)
        return rc;
    return kw__launch_need(op, "logits", a[KW_LAUNCH_PAGED_LOGITS],
                           Q * a[KW_LAUNCH_PAGED_MAX_ROWS], err, errlen);
}

/* Blocks per request of the decode grid (any split is correct): the one
 * whose grid fills its last wave of resident blocks best, weighed by how
 * evenly the 64-row tiles divide among the block's two warpgroups, less
 * 5% per wave (each wave pays its blocks' set-up and pipeline fill: on
 * the H200, 32 requests of 65,536 rows took 80 us in one wave against 88
 * in three); ties go to the smaller split.  Splits up to 80, or up to one
 * wave when fewer blocks than that fill it (one request: 5.9 us at 264
 * blocks against 8.9 at 74).  Resident blocks per SM: logits_per_sm(). */
static uint64_t decode_split(const int64_t *f, uint64_t blocks,
                             uint64_t tiles, unsigned sm)
{
    double slots = (double)logits_per_sm(f) * sm;
    uint64_t most = (uint64_t)slots / blocks;
    if (most < 80)
        most = 80;
    double best = 0.0;
    uint64_t split = 1;
    for (uint64_t s = 1; s <= most; s++) {
        double waves = (double)blocks * (double)s / slots;
        double per_wg = (double)tiles / (2.0 * (double)s);
        double eff = waves / ceil(waves) * per_wg / ceil(per_wg);
        eff *= 1.0 - 0.05 * ceil(waves);
        if (eff > best + 1e-9) {
            best = eff;
            split = s;
        }
    }
    return split;
}

void kw__launch_grid_paged(const int64_t *f, const int64_t *a, unsigned sm,
                           uint64_t grid[3])
{
    uint64_t B = (uint64_t)a[KW_LAUNCH_PAGED_NUM_REQS];
    uint64_t qb = kw_launch_logits_queries(5, f);
    uint64_t groups = ((uint64_t)f[4] + qb - 1) / qb;
    uint64_t tiles = ((uint64_t)a[KW_LAUNCH_PAGED_MAX_ROWS] + 63) / 64;
    grid[0] = B && tiles ? decode_split(f, B * groups, tiles, sm) : 0;
    grid[1] = B;
    grid[2] = groups;
}

void kw__launch_params_paged(const int64_t *f, const kw_launch_deploy *d,
                             const int64_t *a, kw_launch_params *p)
{
    (void)f;
    (void)d;
    for (int i = KW_LAUNCH_PAGED_Q; i <= KW_LAUNCH_PAGED_ROW_END; i++)
        kw__launch_ptr(p, a[i]);
    for (int i = KW_LAUNCH_PAGED_NUM_REQS; i <= KW_LAUNCH_PAGED_MAX_ROWS; i++)
        kw__launch_int(p, a[i]);
    kw__launch_ptr(p, a[KW_LAUNCH_PAGED_LOGITS]);
}

/* ---- indexer_topk (§4.7) --------------------------------------------- */

int kw__launch_dispatch_itopk(const kw_launch_deploy *d, const int64_t *a,
                              int64_t *f, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    f[0] = d->index_topk;
    f[1] = a[KW_LAUNCH_TOPK_KS] != 0 || a[KW_LAUNCH_TOPK_KE] != 0;
    return 0;
}

int kw__launch_check_itopk(const kw_launch_deploy *d, const int64_t *f,
                           const int64_t *a, char *err, size_t errlen)
{
    static const char *const op = "indexer_topk";
    (void)d;
    int64_t rows = a[KW_LAUNCH_TOPK_NUM_ROWS];
    bool win = f[1] != 0;
    if (!win && (a[KW_LAUNCH_TOPK_KS] || a[KW_LAUNCH_TOPK_KE]))
        return kw__launch_fail(err, errlen,
                               "%s ks, ke: given, but the key is not "
                               "windowed (it reads row_end)", op);
    if (win && a[KW_LAUNCH_TOPK_ROW_END])
        return kw__launch_fail(err, errlen,
                               "%s row_end: given with ks and ke; give "
                               "either the windows or row_end", op);
    int rc;
    if ((rc = kw__launch_need(op, win ? "ks" : "row_end",
                              win ? a[KW_LAUNCH_TOPK_KS]
                                  : a[KW_LAUNCH_TOPK_ROW_END],
                              rows, err, errlen)) < 0 ||
        (rc = kw__launch_need(op, "ke", win ? a[KW_LAUNCH_TOPK_KE] : 1, rows,
                              err, errlen)) < 0 ||
        (rc = kw__launch_need(op, "logits", a[KW_LAUNCH_TOPK_LOGITS],
                              rows * a[KW_LAUNCH_TOPK_STRIDE], err,
                              errlen)) < 0)
        return rc;
    return kw__launch_need(op, "topk_pos", a[KW_LAUNCH_TOPK_TOPK_POS],
                           rows * f[0], err, errlen);
}

void kw__launch_grid_itopk(const int64_t *f, const int64_t *a, unsigned sm,
                           uint64_t grid[3])
{
    (void)f;
    (void)sm;
    grid[0] = (uint64_t)a[KW_LAUNCH_TOPK_NUM_ROWS];
}

void kw__launch_params_itopk(const int64_t *f, const kw_launch_deploy *d,
                             const int64_t *a, kw_launch_params *p)
{
    (void)d;
    bool win = f[1] != 0;
    kw__launch_ptr(p, a[KW_LAUNCH_TOPK_LOGITS]);
    kw__launch_ptr(p, win ? a[KW_LAUNCH_TOPK_KS] : a[KW_LAUNCH_TOPK_ROW_END]);
    kw__launch_ptr(p, win ? a[KW_LAUNCH_TOPK_KE] : 0);
    kw__launch_int(p, a[KW_LAUNCH_TOPK_NUM_ROWS]);
    kw__launch_int(p, a[KW_LAUNCH_TOPK_STRIDE]);
    kw__launch_ptr(p, a[KW_LAUNCH_TOPK_TOPK_POS]);
}
