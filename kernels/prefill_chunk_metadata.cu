/* prefill_chunk_metadata.cu: per-query windows of the prefill indexer over
 * this rank's compressed K rows (spec/kernels.md).  Device code only.
 *
 * Template parameters are the key's fields in spec order; *_REP ones are
 * specialisation classes of the runtime value passed alongside.
 *
 * Launch: BLOCK threads; any grid: the rows (ks, ke) and then the K rows
 * (token_to_seq) form one index space, split into one contiguous range of
 * whole tiles (BLOCK*4) per block, so a grid of a few blocks per SM works
 * best.  Threads find their items' requests by searching query_start_loc
 * or cu_k, staged in shared memory once per block, from their previous
 * item's request.  total_k must equal cu_k[num_reqs];
 * query_start_loc[0] and cu_k[0] are 0; slice_stop <= query_start_loc[B].
 */
#include "kw_k_dcp.cuh"

#define KW_K_PCM_ITEMS 4

/* ks/ke of rows [lo, hi) (row = q - slice_start).  W > 1 unless
 * WORLD_REP == 1, which is why the share is taken on the class alone. */
template <int BLOCK, int WORLD_REP, int RATIO>
__device__ __forceinline__ void pcm_rows(const int *qsl, const int *cuk,
                                         const int *__restrict__ seq_lens,
                                         int num_reqs, int slice_start,
                                         int lo, int hi, unsigned r,
                                         unsigned w, unsigned il,
                                         int *__restrict__ ks,
                                         int *__restrict__ ke)
{
    int b = 0;
    for (int base = lo; base < hi; base += BLOCK * KW_K_PCM_ITEMS) {
#pragma unroll
        for (int i = 0; i < KW_K_PCM_ITEMS; i++) {
            int row = base + i * BLOCK + (int)threadIdx.x;
            if (row >= hi)
                continue;
            int q = slice_start + row;
            b = kw_k_find_from(qsl, b, num_reqs - 1, q);
            int qs = qsl[b];
            int start_pos = __ldg(seq_lens + b) - (qsl[b + 1] - qs);
            unsigned n = (unsigned)(start_pos + 1 + (q - qs)) / (unsigned)RATIO;
            if constexpr (WORLD_REP != 1)
                n = kw_k_dcp_share(n, r, w, il);
            ks[row] = cuk[b];
            ke[row] = cuk[b] + (int)n;
        }
    }
}

/* token_to_seq of K rows [lo, hi). */
template <int BLOCK>
__device__ __forceinline__ void pcm_tokens(const int *cuk, int num_reqs,
                                           int lo, int hi,
                                           int *__restrict__ token_to_seq)
{
    int b = 0;
    for (int base = lo; base < hi; base += BLOCK * KW_K_PCM_ITEMS) {
#pragma unroll
        for (int i = 0; i < KW_K_PCM_ITEMS; i++) {
            int k = base + i * BLOCK + (int)threadIdx.x;
            if (k >= hi)
                continue;
            b = kw_k_find_from(cuk, b, num_reqs - 1, k);
            token_to_seq[k] = b;
        }
    }
}

template <int QSS_REP, int QSE_REP, int RANK_REP, int WORLD_REP, int IL_REP,
          int BLOCK, int RATIO, bool SEQ_ALIGNED>
__global__ void __launch_bounds__(BLOCK) kw_k_prefill_chunk_metadata(
    const int *__restrict__ query_start_loc, const int *__restrict__ seq_lens,
    const int *__restrict__ cu_k, int num_reqs, int slice_start,
    int slice_stop, int dcp_rank, int dcp_world, int dcp_interleave,
    int total_k, int *__restrict__ ks, int *__restrict__ ke,
    int *__restrict__ token_to_seq)
{
    static_assert(RATIO >= 1, "compress_ratio must be positive");
    __shared__ int s_qsl[KW_K_SEG_SMEM], s_cuk[KW_K_SEG_SMEM];
    if constexpr (SEQ_ALIGNED) /* the key promises a 16-byte aligned array */
        seq_lens = (const int *)__builtin_assume_aligned(seq_lens, 16);
    slice_start = kw_k_rep<QSS_REP>(slice_start);
    slice_stop = kw_k_rep<QSE_REP>(slice_stop);
    if (num_reqs <= 0)
        return;
    const int *qsl = kw_k_stage_segs(query_start_loc, num_reqs + 1, s_qsl);
    const int *cuk = kw_k_stage_segs(cu_k, num_reqs + 1, s_cuk);
    /* One index space: rows first, then K rows; this block's range of it. */
    const int rows = max(slice_stop - slice_start, 0);
    int lo, hi;
    kw_k_block_range(rows + total_k, BLOCK * KW_K_PCM_ITEMS, &lo, &hi);
    if (lo < rows)
        pcm_rows<BLOCK, WORLD_REP, RATIO>(
            qsl, cuk, seq_lens, num_reqs, slice_start, lo, min(hi, rows),
            kw_k_rep<RANK_REP>(dcp_rank), kw_k_rep<WORLD_REP>(dcp_world),
            kw_k_rep<IL_REP>(dcp_interleave), ks, ke);
    if (hi > rows)
        pcm_tokens<BLOCK>(cuk, num_reqs, max(lo, rows) - rows, hi - rows,
                          token_to_seq);
}
