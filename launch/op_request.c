/* op_request.c: the per-request ops (prefill_chunk_metadata,
 * compressed_slot_mapping, index_conversion): dispatch, checks, grid and
 * parameters.  Field indices follow spec/warmup-keys.md §4.1-§4.3. */
#include "kw_launch.h"

#include "internal.h"
#include "kw_err.h"

#define REP kw_launch_rep

/* Checks the key's DCP geometry classes or values (f[0..2] in the order
 * world, rank, interleave of geo) against the call's. */
static int check_geo(const char *op, const int64_t *want, const int64_t *got,
                     const char *const names[3], char *err, size_t errlen)
{
    for (int i = 0; i < 3; i++)
        if (want[i] != got[i])
            return kw__launch_fail(err, errlen,
                                   "%s %s: the key holds %lld, the call "
                                   "runs with %lld (dcp_local and the "
                                   "deployment choose it)",
                                   op, names[i], (long long)want[i],
                                   (long long)got[i]);
    return 0;
}

/* ---- prefill_chunk_metadata (§4.1) ---------------------------------- */

int kw__launch_dispatch_pcm(const kw_launch_deploy *d, const int64_t *a,
                            int64_t *f, char *err, size_t errlen)
{
    int rc = kw__launch_one_of("prefill_chunk_metadata", "compress_ratio",
                               a[KW_LAUNCH_PCM_COMPRESS_RATIO], d->ratios_p,
                               d->nratios_p, err, errlen);
    if (rc < 0)
        return rc;
    int64_t geo[3];
    kw__launch_geo(d, a[KW_LAUNCH_PCM_DCP_LOCAL] != 0, geo);
    f[0] = REP(a[KW_LAUNCH_PCM_SLICE_START]);
    f[1] = REP(a[KW_LAUNCH_PCM_SLICE_STOP]);
    /* The kernel's own order is rank, world, interleave; rank is 0 when
     * the world is 1. */
    f[2] = REP(geo[0] > 1 ? geo[1] : 0);
    f[3] = REP(geo[0]);
    f[4] = REP(geo[2]);
    f[5] = 1024;
    f[6] = a[KW_LAUNCH_PCM_COMPRESS_RATIO];
    f[7] = a[KW_LAUNCH_PCM_SEQ_LENS] % 16 == 0;
    return 0;
}

int kw__launch_check_pcm(const kw_launch_deploy *d, const int64_t *f,
                         const int64_t *a, char *err, size_t errlen)
{
    static const char *const op = "prefill_chunk_metadata";
    int64_t start = a[KW_LAUNCH_PCM_SLICE_START];
    int64_t stop = a[KW_LAUNCH_PCM_SLICE_STOP];
    int64_t nreq = a[KW_LAUNCH_PCM_NUM_REQS];
    int rc;
    if ((rc = kw__launch_same(op, "class of slice_start", REP(start), f[0],
                              "the key's", err, errlen)) < 0 ||
        (rc = kw__launch_same(op, "class of slice_stop", REP(stop), f[1],
                              "the key's", err, errlen)) < 0 ||
        (rc = kw__launch_same(op, "compress_ratio",
                              a[KW_LAUNCH_PCM_COMPRESS_RATIO], f[6],
                              "the key's", err, errlen)) < 0)
        return rc;
    if (f[7] && a[KW_LAUNCH_PCM_SEQ_LENS] % 16 != 0)
        return kw__launch_fail(err, errlen,
                               "%s seq_lens: not 16-byte aligned, but the "
                               "key assumes it is", op);
    int64_t geo[3];
    kw__launch_geo(d, a[KW_LAUNCH_PCM_DCP_LOCAL] != 0, geo);
    const int64_t want[3] = {f[3], f[2], f[4]};
    const int64_t got[3] = {REP(geo[0]), REP(geo[0] > 1 ? geo[1] : 0),
                            REP(geo[2])};
    static const char *const names[3] = {"dcp_world", "dcp_rank",
                                         "dcp_interleave"};
    if ((rc = check_geo(op, want, got, names, err, errlen)) < 0)
        return rc;
    /* stop <= start is an empty slice: only token_to_seq is written. */
    int64_t rows = stop > start ? stop - start : 0;
    int64_t tk = a[KW_LAUNCH_PCM_TOTAL_K];
    if ((rc = kw__launch_need(op, "query_start_loc",
                              a[KW_LAUNCH_PCM_QUERY_START_LOC], nreq + 1,
                              err, errlen)) < 0 ||
        (rc = kw__launch_need(op, "seq_lens", a[KW_LAUNCH_PCM_SEQ_LENS],
                              nreq, err, errlen)) < 0 ||
        (rc = kw__launch_need(op, "cu_k", a[KW_LAUNCH_PCM_CU_K], nreq + 1,
                              err, errlen)) < 0 ||
        (rc = kw__launch_need(op, "ks", a[KW_LAUNCH_PCM_KS], rows, err,
                              errlen)) < 0 ||
        (rc = kw__launch_need(op, "ke", a[KW_LAUNCH_PCM_KE], rows, err,
                              errlen)) < 0)
        return rc;
    return kw__launch_need(op, "token_to_seq", a[KW_LAUNCH_PCM_TOKEN_TO_SEQ],
                           tk, err, errlen);
}

void kw__launch_grid_pcm(const int64_t *f, const int64_t *a, unsigned sm,
                         uint64_t grid[3])
{
    (void)sm;
    int64_t rows = a[KW_LAUNCH_PCM_SLICE_STOP] - a[KW_LAUNCH_PCM_SLICE_START];
    rows = rows > 0 ? rows : 0;
    grid[0] = kw__launch_ranged_grid(rows + a[KW_LAUNCH_PCM_TOTAL_K],
                                     (unsigned)f[5]);
}

void kw__launch_params_pcm(const int64_t *f, const kw_launch_deploy *d,
                           const int64_t *a, kw_launch_params *p)
{
    (void)f;
    int64_t geo[3];
    kw__launch_geo(d, a[KW_LAUNCH_PCM_DCP_LOCAL] != 0, geo);
    kw__launch_ptr(p, a[KW_LAUNCH_PCM_QUERY_START_LOC]);
    kw__launch_ptr(p, a[KW_LAUNCH_PCM_SEQ_LENS]);
    kw__launch_ptr(p, a[KW_LAUNCH_PCM_CU_K]);
    kw__launch_int(p, a[KW_LAUNCH_PCM_NUM_REQS]);
    kw__launch_int(p, a[KW_LAUNCH_PCM_SLICE_START]);
    kw__launch_int(p, a[KW_LAUNCH_PCM_SLICE_STOP]);
    kw__launch_int(p, geo[0] > 1 ? geo[1] : 0);
    kw__launch_int(p, geo[0]);
    kw__launch_int(p, geo[2]);
    kw__launch_int(p, a[KW_LAUNCH_PCM_TOTAL_K]);
    kw__launch_ptr(p, a[KW_LAUNCH_PCM_KS]);
    kw__launch_ptr(p, a[KW_LAUNCH_PCM_KE]);
    kw__launch_ptr(p, a[KW_LAUNCH_PCM_TOKEN_TO_SEQ]);
}

/* ---- compressed_slot_mapping (§4.2) ---------------------------------- */

int kw__launch_dispatch_csm(const kw_launch_deploy *d, const int64_t *a,
                            int64_t *f, char *err, size_t errlen)
{
    int rc = kw__launch_one_of("compressed_slot_mapping", "compress_ratio",
                               a[KW_LAUNCH_CSM_COMPRESS_RATIO], d->ratios_s,
                               d->nratios_s, err, errlen);
    if (rc < 0)
        return rc;
    int64_t geo[3];
    kw__launch_geo(d, a[KW_LAUNCH_CSM_DCP_LOCAL] != 0, geo);
    f[0] = a[KW_LAUNCH_CSM_COMPRESS_RATIO];
    f[1] = 1024;
    f[2] = REP(a[KW_LAUNCH_CSM_BLOCK_SIZE]);
    f[3] = geo[0];
    f[4] = geo[1];
    f[5] = geo[2];
    return 0;
}

int kw__launch_check_csm(const kw_launch_deploy *d, const int64_t *f,
                         const int64_t *a, char *err, size_t errlen)
{
    static const char *const op = "compressed_slot_mapping";
    int64_t bs = a[KW_LAUNCH_CSM_BLOCK_SIZE];
    if (bs < 1)
        return kw__launch_fail(err, errlen, "%s block_size: %lld is below 1",
                               op, (long long)bs);
    int rc;
    if ((rc = kw__launch_same(op, "class of block_size", REP(bs), f[2],
                              "the key's", err, errlen)) < 0 ||
        (rc = kw__launch_same(op, "compress_ratio",
                              a[KW_LAUNCH_CSM_COMPRESS_RATIO], f[0],
                              "the key's", err, errlen)) < 0)
        return rc;
    int64_t geo[3];
    kw__launch_geo(d, a[KW_LAUNCH_CSM_DCP_LOCAL] != 0, geo);
    static const char *const names[3] = {"dcp_world_size", "dcp_rank",
                                         "cp_kv_cache_interleave_size"};
    if ((rc = check_geo(op, f + 3, geo, names, err, errlen)) < 0)
        return rc;
    int64_t nt = a[KW_LAUNCH_CSM_NUM_TOKENS], nr = a[KW_LAUNCH_CSM_NUM_REQS];
    if ((rc = kw__launch_need(op, "slot_mapping",
                              a[KW_LAUNCH_CSM_SLOT_MAPPING], nt, err,
                              errlen)) < 0 ||
        (rc = kw__launch_need(op, "out", a[KW_LAUNCH_CSM_OUT], nt, err,
                              errlen)) < 0 ||
        (rc = kw__launch_need(op, "query_start_loc",
                              a[KW_LAUNCH_CSM_QUERY_START_LOC], nr + 1, err,
                              errlen)) < 0 ||
        (rc = kw__launch_need(op, "seq_lens", a[KW_LAUNCH_CSM_SEQ_LENS], nr,
                              err, errlen)) < 0)
        return rc;
    return kw__launch_need(op, "block_table", a[KW_LAUNCH_CSM_BLOCK_TABLE],
                           nr * a[KW_LAUNCH_CSM_WIDTH], err, errlen);
}

void kw__launch_grid_csm(const int64_t *f, const int64_t *a, unsigned sm,
                         uint64_t grid[3])
{
    (void)sm;
    grid[0] = kw__launch_ranged_grid(a[KW_LAUNCH_CSM_NUM_TOKENS],
                                     (unsigned)f[1]);
}

void kw__launch_params_csm(const int64_t *f, const kw_launch_deploy *d,
                           const int64_t *a, kw_launch_params *p)
{
    (void)f;
    (void)d;
    for (int i = KW_LAUNCH_CSM_SLOT_MAPPING; i <= KW_LAUNCH_CSM_BLOCK_TABLE;
         i++)
        kw__launch_ptr(p, a[i]);
    for (int i = KW_LAUNCH_CSM_NUM_TOKENS; i <= KW_LAUNCH_CSM_BLOCK_SIZE; i++)
        kw__launch_int(p, a[i]);
    kw__launch_ptr(p, a[KW_LAUNCH_CSM_OUT]);
}

/* ---- index_conversion (§4.3) ----------------------------------------- */

int kw__launch_dispatch_ic(const kw_launch_deploy *d, const int64_t *a,
                           int64_t *f, char *err, size_t errlen)
{
    (void)err;
    (void)errlen;
    int64_t topk = d->index_topk, geo[3];
    kw__launch_geo(d, a[KW_LAUNCH_IC_DCP_LOCAL] != 0, geo);
    bool count = a[KW_LAUNCH_IC_VALID_COUNT] != 0;
    bool single = count && (topk & (topk - 1)) == 0;
    f[0] = d->block_size;
    f[1] = d->block_stride_rows;
    f[2] = single ? topk : 128;
    f[3] = single;
    f[4] = single ? 8 : 4;
    f[5] = a[KW_LAUNCH_IC_PREFILL_REQ] != 0;
    f[6] = count;
    f[7] = a[KW_LAUNCH_IC_COMPACT_TO_FRONT] != 0;
    f[8] = geo[0];
    f[9] = geo[1];
    f[10] = geo[2];
    f[11] = topk;
    f[12] = REP(a[KW_LAUNCH_IC_WIDTH]);
    return 0;
}

/* The optional pointers a key's booleans promise, and only those. */
static int check_ic_options(const int64_t *f, const int64_t *a, char *err,
                            size_t errlen)
{
    static const char *const op = "index_conversion";
    bool has_ws = a[KW_LAUNCH_IC_PREFILL_REQ] != 0;
    if (has_ws != (f[5] != 0))
        return kw__launch_fail(err, errlen,
                               "%s prefill_req: %s, but the key has "
                               "has_prefill_workspace %s",
                               op, has_ws ? "given" : "NULL",
                               f[5] ? "true" : "false");
    if ((a[KW_LAUNCH_IC_VALID_COUNT] != 0) != (f[6] != 0))
        return kw__launch_fail(err, errlen,
                               "%s valid_count: %s, but the key has "
                               "count_valid %s",
                               op, a[KW_LAUNCH_IC_VALID_COUNT] ? "given" : "NULL",
                               f[6] ? "true" : "false");
    if ((a[KW_LAUNCH_IC_COMPACT_TO_FRONT] != 0) != (f[7] != 0))
        return kw__launch_fail(err, errlen,
                               "%s compact_to_front: %lld, but the key's is "
                               "%lld", op,
                               (long long)a[KW_LAUNCH_IC_COMPACT_TO_FRONT],
                               (long long)f[7]);
    int64_t np = has_ws ? a[KW_LAUNCH_IC_NUM_PREFILL] : 0;
    return kw__launch_need(op, "workspace_start",
                           a[KW_LAUNCH_IC_WORKSPACE_START], np, err, errlen);
}

int kw__launch_check_ic(const kw_launch_deploy *d, const int64_t *f,
                        const int64_t *a, char *err, size_t errlen)
{
    static const char *const op = "index_conversion";
    int64_t width = a[KW_LAUNCH_IC_WIDTH], rows = a[KW_LAUNCH_IC_NUM_ROWS];
    int rc;
    if ((rc = kw__launch_same(op, "class of width", REP(width), f[12],
                              "the key's block_table_stride", err,
                              errlen)) < 0 ||
        (rc = check_ic_options(f, a, err, errlen)) < 0)
        return rc;
    int64_t geo[3];
    kw__launch_geo(d, a[KW_LAUNCH_IC_DCP_LOCAL] != 0, geo);
    static const char *const names[3] = {"dcp_size", "dcp_rank",
                                         "dcp_interleave"};
    if ((rc = check_geo(op, f + 8, geo, names, err, errlen)) < 0)
        return rc;
    int64_t entries = rows * f[11];
    if ((rc = kw__launch_need(op, "req_id", a[KW_LAUNCH_IC_REQ_ID],
                              rows, err, errlen)) < 0 ||
        (rc = kw__launch_need(op, "topk_pos", a[KW_LAUNCH_IC_TOPK_POS],
                              entries, err, errlen)) < 0 ||
        (rc = kw__launch_need(op, "out", a[KW_LAUNCH_IC_OUT], entries, err,
                              errlen)) < 0)
        return rc;
    return kw__launch_need(op, "block_table", a[KW_LAUNCH_IC_BLOCK_TABLE],
                           a[KW_LAUNCH_IC_NUM_REQS] * width, err, errlen);
}

void kw__launch_grid_ic(const int64_t *f, const int64_t *a, unsigned sm,
                        uint64_t grid[3])
{
    (void)sm;
    /* Rows of up to 512 entries go one per warp (IC_WARP_TOPK in
     * index_conversion.cu), and each warp walks 4 of them: a block
     * retires only with its slowest warp, and fewer, longer-lived blocks
     * took the compacting V4-Flash variant from 0.64 to 0.68 of copy on
     * the H200.  Longer rows go one per block. */
    uint64_t per = f[11] <= 512 ? 4 * (uint64_t)f[4] : 1;
    grid[0] = ((uint64_t)a[KW_LAUNCH_IC_NUM_ROWS] + per - 1) / per;
}

void kw__launch_params_ic(const int64_t *f, const kw_launch_deploy *d,
                          const int64_t *a, kw_launch_params *p)
{
    (void)f;
    (void)d;
    for (int i = KW_LAUNCH_IC_REQ_ID; i <= KW_LAUNCH_IC_WORKSPACE_START; i++)
        kw__launch_ptr(p, a[i]);
    for (int i = KW_LAUNCH_IC_NUM_ROWS; i <= KW_LAUNCH_IC_WORKSPACE_RANK_STRIDE;
         i++)
        kw__launch_int(p, a[i]);
    kw__launch_ptr(p, a[KW_LAUNCH_IC_OUT]);
    kw__launch_ptr(p, a[KW_LAUNCH_IC_VALID_COUNT]);
}
