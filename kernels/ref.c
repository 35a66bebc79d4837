/* ref.c: CPU references of the request-indexed families, written from
 * spec/kernels.md.  They are the oracle the kernels are checked against,
 * so they follow the spec's wording step by step rather than the kernels'
 * structure. */
#include "kw_kernels.h"

#include "internal.h"
#include "kw_err.h"

#include <stddef.h>

/* A cumulative offset array off[0..n] that starts at 0 and never
 * decreases. */
static bool offsets_ok(const int32_t *off, int32_t n)
{
    if (!off || n < 0 || off[0] != 0)
        return false;
    for (int32_t i = 0; i < n; i++)
        if (off[i + 1] < off[i])
            return false;
    return true;
}

static bool dcp_ok(int32_t w, int32_t r, int32_t il)
{
    return w >= 1 && il >= 1 && r >= 0 && r < w;
}

/* ks/ke of query rows [slice_start, slice_stop) that request b holds. */
static void pcm_request_rows(const kw_k_pcm_args *a, int32_t b)
{
    int32_t qs = a->query_start_loc[b], qe = a->query_start_loc[b + 1];
    int32_t q_len = qe - qs;
    int32_t start_pos = a->seq_lens[b] - q_len;
    for (int32_t q = qs; q < qe; q++) {
        if (q < a->slice_start || q >= a->slice_stop)
            continue;
        int32_t j = q - qs, row = q - a->slice_start;
        uint32_t n = (uint32_t)(start_pos + 1 + j) /
                     (uint32_t)a->compress_ratio;
        if (a->dcp_world > 1)
            n = kw__k_dcp_share(n, (uint32_t)a->dcp_rank,
                                (uint32_t)a->dcp_world,
                                (uint32_t)a->dcp_interleave);
        a->ks[row] = a->cu_k[b];
        a->ke[row] = kw__k_i32((uint32_t)a->cu_k[b] + n);
    }
}

int kw_k_ref_prefill_chunk_metadata(const kw_k_pcm_args *a)
{
    if (!a || a->compress_ratio < 1 || a->num_reqs < 0 || !a->seq_lens ||
        !offsets_ok(a->query_start_loc, a->num_reqs) ||
        !offsets_ok(a->cu_k, a->num_reqs) ||
        !dcp_ok(a->dcp_world, a->dcp_rank, a->dcp_interleave))
        return KW_EINVAL;
    int64_t rows = (int64_t)a->slice_stop - a->slice_start;
    if (rows > 0 && (a->slice_start < 0 || !a->ks || !a->ke ||
                     a->slice_stop > a->query_start_loc[a->num_reqs]))
        return KW_EINVAL;
    if (a->cu_k[a->num_reqs] > 0 && !a->token_to_seq)
        return KW_EINVAL;
    for (int32_t b = 0; b < a->num_reqs; b++) {
        int32_t q_len = a->query_start_loc[b + 1] - a->query_start_loc[b];
        if (a->seq_lens[b] < q_len)
            return KW_EINVAL; /* start_pos < 0: no such request */
        for (int32_t r = a->cu_k[b]; r < a->cu_k[b + 1]; r++)
            a->token_to_seq[r] = b;
        if (rows > 0)
            pcm_request_rows(a, b);
    }
    return 0;
}

/* The slot of the token at position pos of request b, or -1. */
static int64_t csm_slot(const kw_k_csm_args *a, int32_t b, int32_t pos,
                        int64_t own_slot)
{
    const uint32_t ratio = (uint32_t)a->compress_ratio;
    const uint32_t w = (uint32_t)a->dcp_world, il = (uint32_t)a->dcp_interleave;
    const uint32_t bs = (uint32_t)a->block_size;
    if (pos < 0 || ((uint32_t)pos + 1) % ratio != 0)
        return -1;
    if (w == 1 && own_slot == -1) /* under DCP a -1 is another rank's */
        return -1;
    uint32_t state = (uint32_t)pos / ratio;
    if (w > 1) {
        uint32_t v = state % (bs * w);
        if ((v / il) % w != (uint32_t)a->dcp_rank)
            return -1;
        state = (state / (bs * w)) * bs + (v / (il * w)) * il + v % il;
    }
    uint32_t blk = state / bs;
    if (blk >= (uint32_t)a->width)
        return -1;
    int64_t page = a->block_table[(size_t)b * (size_t)a->width + blk];
    return page * a->block_size + (int64_t)(state % bs);
}

int kw_k_ref_compressed_slot_mapping(const kw_k_csm_args *a)
{
    if (!a || a->compress_ratio < 1 || a->block_size < 1 || a->width < 0 ||
        a->num_tokens < 0 || a->num_reqs < 0 ||
        !dcp_ok(a->dcp_world, a->dcp_rank, a->dcp_interleave) ||
        !offsets_ok(a->query_start_loc, a->num_reqs) ||
        a->query_start_loc[a->num_reqs] > a->num_tokens ||
        (a->num_reqs > 0 && (!a->seq_lens || !a->block_table)) ||
        (a->num_tokens > 0 && (!a->out || !a->slot_mapping)))
        return KW_EINVAL;
    for (int32_t t = 0; t < a->num_tokens; t++)
        a->out[t] = -1; /* padding past the last request */
    for (int32_t b = 0; b < a->num_reqs; b++) {
        int32_t qs = a->query_start_loc[b], qe = a->query_start_loc[b + 1];
        for (int32_t j = 0; j < qe - qs; j++) {
            int32_t pos = a->seq_lens[b] - (qe - qs) + j;
            a->out[qs + j] = csm_slot(a, b, pos, a->slot_mapping[qs + j]);
        }
    }
    return 0;
}

/* One index_conversion entry t of a row (spec wording, step by step). */
static int32_t ic_entry(const kw_k_ic_args *a, int32_t t, int32_t req,
                        int32_t preq)
{
    const uint32_t w = (uint32_t)a->dcp_size, il = (uint32_t)a->dcp_interleave;
    if (t < 0)
        return -1;
    uint32_t owner = kw__k_dcp_owner((uint32_t)t, w, il);
    uint32_t l = kw__k_dcp_local((uint32_t)t, w, il);
    if (preq >= 0) /* prefill row: every rank's workspace is readable */
        return kw__k_i32(owner * (uint32_t)a->workspace_rank_stride +
                         (uint32_t)a->workspace_start[preq] + l);
    uint32_t blk = l / (uint32_t)a->block_size;
    uint32_t off = l % (uint32_t)a->block_size;
    if (owner != (uint32_t)a->dcp_rank || blk >= (uint32_t)a->width)
        return -1;
    size_t at = (size_t)req * (size_t)a->width + blk;
    uint32_t page = (uint32_t)a->block_table[at];
    return kw__k_i32(page * (uint32_t)a->block_stride_rows + off);
}

static bool ic_args_ok(const kw_k_ic_args *a)
{
    if (!a || a->block_size < 1 || a->block_stride_rows < 1 || a->topk < 1 ||
        a->num_rows < 0 || a->num_reqs < 0 || a->width < 0 ||
        !dcp_ok(a->dcp_size, a->dcp_rank, a->dcp_interleave))
        return false;
    if (a->num_rows == 0)
        return true;
    if (!a->req_id || !a->topk_pos || !a->out ||
        (a->count_valid && !a->valid_count) ||
        (a->has_prefill_workspace && (!a->prefill_req || a->num_prefill < 0)))
        return false;
    return a->width == 0 || a->num_reqs == 0 || a->block_table;
}

/* Row r's request indices, or false when they are out of range. */
static bool ic_row_reqs(const kw_k_ic_args *a, int32_t r, int32_t *req,
                        int32_t *preq)
{
    *preq = a->has_prefill_workspace ? a->prefill_req[r] : -1;
    *req = *preq >= 0 ? 0 : a->req_id[r];
    if (*preq >= 0)
        return *preq < a->num_prefill && a->workspace_start;
    return *preq == -1 && *req >= 0 && *req < a->num_reqs;
}

int kw_k_ref_index_conversion(const kw_k_ic_args *a)
{
    if (!ic_args_ok(a))
        return KW_EINVAL;
    for (int32_t r = 0; r < a->num_rows; r++) {
        int32_t req, preq;
        if (!ic_row_reqs(a, r, &req, &preq))
            return KW_EINVAL;
        const int32_t *in = a->topk_pos + (size_t)r * (size_t)a->topk;
        int32_t *o = a->out + (size_t)r * (size_t)a->topk;
        int32_t n = 0; /* outputs != -1 so far */
        for (int32_t k = 0; k < a->topk; k++) {
            int32_t v = ic_entry(a, in[k], req, preq);
            if (a->compact_to_front && v != -1)
                o[n] = v; /* n <= k: never overwrites an unread output */
            else if (!a->compact_to_front)
                o[k] = v;
            n += v != -1;
        }
        if (a->compact_to_front)
            for (int32_t k = n; k < a->topk; k++)
                o[k] = -1;
        if (a->count_valid)
            a->valid_count[r] = n;
    }
    return 0;
}
