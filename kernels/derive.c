/* derive.c: each family's key loops (spec/warmup-keys.md §4), written as
 * in the spec for one rank at a time.  The family table (family.c) points
 * at them; jit/ runs them over the ranks, de-duplicates, crosses with the
 * archs and digests (jit/keys.c). */
#include "kw_kernels.h"

#include "internal.h"
#include "kw_launch.h"

/* Specialization class of §3, as Triton specializes integer arguments:
 * dispatch reads the same function (kw_launch.h). */
#define rep kw_launch_rep

/* §4.1 prefill_chunk_metadata. */
void kw__k_derive_pcm(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx)
{
    int64_t mt = in->max_num_batched_tokens < 8 ? in->max_num_batched_tokens : 8;
    int64_t m = mt > 1 ? mt : 1;
    int64_t starts[3] = {0, 1, 2}, stops[3] = {1, 2 * m - 1, 2 * m};
    int64_t geo[2][3] = {{in->dcp_world > 1 ? in->rank : 0, in->dcp_world,
                          in->dcp_interleave}, {0, 1, 1}};
    size_t ngeo = in->pcp > 1 ? 2 : 1;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (size_t g = 0; g < ngeo; g++)
                for (size_t r = 0; r < in->nratios_p; r++)
                    for (int al = 1; al >= 0; al--) {
                        int64_t row[KW_K_MAX_FIELDS] = {
                            rep(starts[a]), rep(stops[b]), rep(geo[g][0]),
                            rep(geo[g][1]), rep(geo[g][2]), 1024,
                            in->ratios_p[r], al};
                        add(ctx, row);
                    }
}

/* §4.2 compressed_slot_mapping. */
void kw__k_derive_csm(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx)
{
    int64_t geo[2][3] = {{1, 0, 1},
                         {in->dcp_world, in->rank, in->dcp_interleave}};
    size_t ngeo = in->dcp_world > 1 ? 2 : 1;
    for (size_t r = 0; r < in->nratios_s; r++)
        for (size_t g = 0; g < ngeo; g++) {
            int64_t ratio = in->ratios_s[r];
            int64_t row[KW_K_MAX_FIELDS] = {
                ratio, 1024, rep(in->block_size / ratio), geo[g][0], geo[g][1],
                geo[g][2]};
            add(ctx, row);
        }
}

/* vLLM's block-table width (§4.3), as dispatch computes it. */
static int64_t block_table_width(const kw_k_derive_in *in)
{
    kw_launch_deploy d = {.block_size = in->block_size,
                          .dcp_world = in->dcp_world,
                          .max_model_len = in->max_model_len};
    return kw_launch_table_width(&d);
}

/* §4.3 index_conversion. */
void kw__k_derive_ic(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx)
{
    int64_t topk = in->index_topk, W = in->dcp_world, R = in->rank;
    int64_t I = in->dcp_interleave;
    bool pow2 = (topk & (topk - 1)) == 0;
    int64_t rows[6][6] = {
        {0, 0, 0, 1, 0, 1}, {0, 1, 1, 1, 0, 1}, {1, 1, 1, 1, 0, 1},
        {0, 1, 0, W, R, I}, {0, 1, W > 1, W, R, I}, {1, 1, 1, W, R, I}};
    size_t nrows = in->pcp > 1 && W > 1 ? 6 : 5;
    int64_t width = rep(block_table_width(in));
    for (size_t i = 0; i < nrows; i++) {
        bool single = rows[i][1] && pow2;
        int64_t row[KW_K_MAX_FIELDS] = {
            in->block_size, in->block_stride_rows, single ? topk : 128, single,
            single ? 8 : 4, rows[i][0], rows[i][1], rows[i][2], rows[i][3],
            rows[i][4], rows[i][5], topk, width};
        add(ctx, row);
    }
}

/* §4.4 dcp_pack_topk_candidates. */
void kw__k_derive_pack(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx)
{
    if (in->dcp_world <= 1)
        return;
    for (int hrs = 0; hrs < 2; hrs++) {
        int64_t row[KW_K_MAX_FIELDS] = {
            in->rank, in->dcp_world, in->dcp_interleave, hrs, in->index_topk,
            512};
        add(ctx, row);
    }
}

/* §4.5 dcp_stable_topk. */
void kw__k_derive_topk(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx)
{
    if (in->dcp_world <= 1)
        return;
    int64_t row[KW_K_MAX_FIELDS] = {in->index_topk,
                                    in->index_topk * in->dcp_world};
    add(ctx, row);
}

/* §4.6 indexer_logits: one prefill key, one decode key per ratio. */
void kw__k_derive_logits(const kw_k_derive_in *in, kw_k_add_fn add,
                         void *ctx)
{
    if (in->index_n_heads <= 0 || in->index_head_dim <= 0)
        return;
    int64_t pre[KW_K_MAX_FIELDS] = {in->index_n_heads, in->index_head_dim, 0,
                                    0, 1};
    add(ctx, pre);
    for (size_t r = 0; r < in->nratios_p; r++) {
        int64_t row[KW_K_MAX_FIELDS] = {
            in->index_n_heads, in->index_head_dim, 1,
            in->block_size / in->ratios_p[r], 1 + in->num_speculative_tokens};
        add(ctx, row);
    }
}

/* §4.7 indexer_topk. */
void kw__k_derive_itopk(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx)
{
    for (int win = 1; win >= 0; win--) {
        int64_t row[KW_K_MAX_FIELDS] = {in->index_topk, win};
        add(ctx, row);
    }
}
