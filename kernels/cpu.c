/* cpu.c: runs a family's CPU reference on kernel parameters, so the same
 * argument list drives a GPU launch, the harness's expected outputs and
 * the CPU stand-in device of the tests.  Parameter order: kw_kernels.h. */
#include "kw_kernels.h"

#include "internal.h"
#include "kw_err.h"

#define P(i) kw__k_arg_ptr(args, (i))
#define I(i) kw__k_arg_int(args, (i))

int kw__k_cpu_pcm(const int64_t *fl, void **args)
{
    kw_k_pcm_args a = {
        .compress_ratio = (int32_t)fl[6],
        .query_start_loc = P(0), .seq_lens = P(1), .cu_k = P(2),
        .num_reqs = I(3), .slice_start = I(4), .slice_stop = I(5),
        .dcp_rank = I(6), .dcp_world = I(7), .dcp_interleave = I(8),
        .ks = P(10), .ke = P(11), .token_to_seq = P(12),
    };
    /* total_k (I(9)) is the kernel's copy of cu_k[B], which the
     * reference reads itself; a mismatch is a caller bug. */
    if (a.cu_k && a.num_reqs >= 0 && a.cu_k[a.num_reqs] != I(9))
        return KW_EINVAL;
    return kw_k_ref_prefill_chunk_metadata(&a);
}

int kw__k_cpu_csm(const int64_t *fl, void **args)
{
    kw_k_csm_args a = {
        .compress_ratio = (int32_t)fl[0], .dcp_world = (int32_t)fl[3],
        .dcp_rank = (int32_t)fl[4], .dcp_interleave = (int32_t)fl[5],
        .slot_mapping = P(0), .query_start_loc = P(1), .seq_lens = P(2),
        .block_table = P(3), .num_tokens = I(4), .num_reqs = I(5),
        .width = I(6), .block_size = I(7), .out = P(8),
    };
    return kw_k_ref_compressed_slot_mapping(&a);
}

int kw__k_cpu_ic(const int64_t *fl, void **args)
{
    kw_k_ic_args a = {
        .block_size = (int32_t)fl[0], .block_stride_rows = (int32_t)fl[1],
        .has_prefill_workspace = fl[5] != 0, .count_valid = fl[6] != 0,
        .compact_to_front = fl[7] != 0, .dcp_size = (int32_t)fl[8],
        .dcp_rank = (int32_t)fl[9], .dcp_interleave = (int32_t)fl[10],
        .topk = (int32_t)fl[11],
        .req_id = P(0), .block_table = P(1), .topk_pos = P(2),
        .prefill_req = P(3), .workspace_start = P(4), .num_rows = I(5),
        .num_reqs = I(6), .num_prefill = I(7), .width = I(8),
        .workspace_rank_stride = I(9), .out = P(10), .valid_count = P(11),
    };
    return kw_k_ref_index_conversion(&a);
}

int kw__k_cpu_pack(const int64_t *fl, void **args)
{
    kw_k_pack_args a = {
        .dcp_rank = (int32_t)fl[0], .dcp_world = (int32_t)fl[1],
        .dcp_interleave = (int32_t)fl[2], .has_row_starts = fl[3] != 0,
        .topk = (int32_t)fl[4],
        .logits = P(0), .topk_local = P(1), .row_starts = P(2),
        .num_rows = I(3), .cols = I(4), .packed = P(5),
    };
    return kw_k_ref_dcp_pack_topk_candidates(&a);
}

int kw__k_cpu_topk(const int64_t *fl, void **args)
{
    kw_k_topk_args a = {
        .topk = (int32_t)fl[0], .num_candidates = (int32_t)fl[1],
        .gathered = P(0), .num_rows = I(1), .out = P(2),
    };
    return kw_k_ref_dcp_stable_topk(&a);
}

int kw__k_cpu_logits_mag(const int64_t *fl, void **args, double *mag)
{
    kw_k_logits_args a = {
        .heads = (int32_t)fl[0], .head_dim = (int32_t)fl[1],
        .paged = fl[2] != 0, .page_rows = (int32_t)fl[3],
        .next_n = (int32_t)fl[4],
        .q = P(0), .w = P(1), .k = P(2), .k_scale = P(3),
        .num_pages = -1,
    };
    if (a.paged) {
        a.block_table = P(4);
        a.row_end = P(5);
        a.num_reqs = I(6);
        a.width = I(7);
        a.max_rows = I(8);
    } else {
        a.ks = P(4);
        a.ke = P(5);
        a.num_rows = I(6);
        a.num_k = I(7);
        a.stride = I(8);
    }
    a.logits = P(9);
    return kw_k_ref_indexer_logits(&a, mag);
}

int kw__k_cpu_logits(const int64_t *fl, void **args)
{
    return kw__k_cpu_logits_mag(fl, args, NULL);
}

int kw__k_cpu_itopk(const int64_t *fl, void **args)
{
    kw_k_itopk_args a = {
        .topk = (int32_t)fl[0], .windowed = fl[1] != 0,
        .logits = P(0), .num_rows = I(3), .stride = I(4), .topk_pos = P(5),
    };
    if (a.windowed) {
        a.ks = P(1);
        a.ke = P(2);
    } else {
        a.row_end = P(1);
    }
    return kw_k_ref_indexer_topk(&a);
}
