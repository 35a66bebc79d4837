/* compressed_slot_mapping.cu: where each newly computed compressed KV state
 * is written (spec/kernels.md).  Device code only.
 *
 * Template parameters are the key's fields in spec order: the compress
 * ratio, threads per block, the class of the runtime block_size (states
 * per page on this rank), and the exact DCP world, rank and interleave.
 *
 * Launch: BLOCK threads; any grid: each block converts one contiguous range
 * of whole tiles (BLOCK*4 tokens), so a grid of a few blocks per SM works
 * best.  Tokens at or past query_start_loc[num_reqs] are padding and get
 * -1.  block_table is [num_reqs][width], row stride width.
 *
 * Only one token in RATIO finishes a state, and the work is in those: so
 * each thread takes 4 consecutive tokens (about one state each at ratio 4)
 * and computes only the states among them, with every lane busy, instead
 * of one token per lane with most lanes idle.  Threads find their tokens'
 * requests by searching query_start_loc, staged in shared memory once per
 * block, from their previous chunk's request.  Results leave through a
 * per-warp shared-memory transpose, so stores are whole 256-byte runs.
 * Measured on an H200 at W = 8, ratio 4, 16M tokens: 41% of copy
 * bandwidth one token per lane, 44% with the 4-token chunks, 75% with the
 * transposed stores.
 */
#include "kw_k_dcp.cuh"

#define KW_K_CSM_V 4 /* consecutive tokens per thread */

/* Everything fixed for the launch. */
struct csm_ctx {
    const long long *__restrict__ slot_mapping;
    const int *__restrict__ seq_lens;
    const int *__restrict__ block_table;
    const int *qsl; /* query_start_loc, possibly staged */
    int num_reqs, end, width, bs;
    kw_k_udiv by_bs, by_span; /* block_size and block_size * W */
};

/* The slot of token tok at position pos (>= 0, (pos + 1) % RATIO == 0) of
 * request b, or -1.  slot_mapping is read only when W == 1 and only for
 * tokens that finish a state. */
template <int RATIO, int W, int R, int IL>
__device__ __forceinline__ long long csm_state_slot(const csm_ctx &c, int b,
                                                    int tok, int pos)
{
    if constexpr (W == 1) {
        if (__ldg(c.slot_mapping + tok) == -1)
            return -1;
    }
    const unsigned ubs = (unsigned)c.bs;
    unsigned state = (unsigned)pos / RATIO;
    if constexpr (W > 1) {
        unsigned q = kw_k_udiv_q(c.by_span, state);
        unsigned v = state - q * (ubs * W);
        if ((v / IL) % W != (unsigned)R)
            return -1;
        state = q * ubs + (v / (IL * W)) * IL + v % IL;
    }
    unsigned blk = kw_k_udiv_q(c.by_bs, state);
    if (blk >= (unsigned)c.width)
        return -1;
    long long page = __ldg(c.block_table + (long long)b * c.width + blk);
    return page * c.bs + (long long)(state - blk * ubs);
}

/* One token in any situation (padding, request edges): the slow path. */
template <int RATIO, int W, int R, int IL>
__device__ __forceinline__ long long csm_token(const csm_ctx &c, int &b,
                                               int tok)
{
    if (tok >= c.end)
        return -1;
    b = kw_k_find_from(c.qsl, b, c.num_reqs - 1, tok);
    int qs = c.qsl[b];
    int pos = __ldg(c.seq_lens + b) - (c.qsl[b + 1] - qs) + (tok - qs);
    if (pos < 0 || (pos + 1) % RATIO != 0)
        return -1;
    return csm_state_slot<RATIO, W, R, IL>(c, b, tok, pos);
}

/* Tokens t0 .. t0+3 into r[]: when all four are real tokens of one
 * request, only their states are computed (the first at k0, then every
 * RATIO), with the lane count uniform across the warp. */
template <int RATIO, int W, int R, int IL>
__device__ __forceinline__ void csm_chunk(const csm_ctx &c, int &b, int t0,
                                          long long (&r)[KW_K_CSM_V])
{
#pragma unroll
    for (int k = 0; k < KW_K_CSM_V; k++)
        r[k] = -1;
    int pos0 = -1, qe = 0;
    if (t0 + KW_K_CSM_V <= c.end) {
        b = kw_k_find_from(c.qsl, b, c.num_reqs - 1, t0);
        int qs = c.qsl[b];
        qe = c.qsl[b + 1];
        pos0 = __ldg(c.seq_lens + b) - (qe - qs) + (t0 - qs);
    }
    if (t0 + KW_K_CSM_V > qe || pos0 < 0) { /* edge: token by token */
#pragma unroll
        for (int k = 0; k < KW_K_CSM_V; k++)
            r[k] = csm_token<RATIO, W, R, IL>(c, b, t0 + k);
        return;
    }
    const int k0 = RATIO - 1 - pos0 % RATIO; /* (pos0 + k0 + 1) % RATIO == 0 */
#pragma unroll
    for (int j = 0; j < (KW_K_CSM_V + RATIO - 1) / RATIO; j++) {
        const int k = k0 + j * RATIO;
        if (k >= KW_K_CSM_V)
            break;
        long long v = csm_state_slot<RATIO, W, R, IL>(c, b, t0 + k, pos0 + k);
#pragma unroll
        for (int kk = 0; kk < KW_K_CSM_V; kk++)
            r[kk] = kk == k ? v : r[kk];
    }
}

template <int RATIO, int BLOCK, int BS_REP, int W, int R, int IL>
__global__ void __launch_bounds__(BLOCK) kw_k_compressed_slot_mapping(
    const long long *__restrict__ slot_mapping,
    const int *__restrict__ query_start_loc, const int *__restrict__ seq_lens,
    const int *__restrict__ block_table, int num_tokens, int num_reqs,
    int width, int block_size, long long *__restrict__ out)
{
    static_assert(RATIO >= 1 && W >= 1 && R >= 0 && R < W && IL >= 1,
                  "invalid compressed_slot_mapping key");
    constexpr int TILE = BLOCK * KW_K_CSM_V;
    __shared__ int s_qsl[KW_K_SEG_SMEM];
    csm_ctx c;
    c.slot_mapping = slot_mapping;
    c.seq_lens = seq_lens;
    c.block_table = block_table;
    c.qsl = kw_k_stage_segs(query_start_loc, num_reqs + 1, s_qsl);
    c.num_reqs = num_reqs;
    c.end = c.qsl[num_reqs];
    c.width = width;
    c.bs = kw_k_rep<BS_REP>(block_size);
    c.by_bs = kw_k_udiv_of((unsigned)c.bs);
    c.by_span = kw_k_udiv_of((unsigned)c.bs * W);
    /* Each warp's 4*32 results pass through its own shared-memory strip:
     * lane L stores tokens L, L+32, ... (whole 256-byte runs) instead of
     * its own 32 bytes, which would leave half-written sectors per store. */
    __shared__ long long s_out[BLOCK * KW_K_CSM_V];
    long long *strip = s_out + (threadIdx.x / 32) * 32 * KW_K_CSM_V;
    const int lane = threadIdx.x & 31;
    int lo, hi, b = 0;
    kw_k_block_range(num_tokens, TILE, &lo, &hi);
    for (int base = lo; base < hi; base += TILE) {
        const int wbase = base + (int)(threadIdx.x / 32) * 32 * KW_K_CSM_V;
        const int t0 = wbase + KW_K_CSM_V * lane;
        long long r[KW_K_CSM_V] = {-1, -1, -1, -1};
        if (t0 < hi)
            csm_chunk<RATIO, W, R, IL>(c, b, t0, r);
#pragma unroll
        for (int k = 0; k < KW_K_CSM_V; k++)
            strip[KW_K_CSM_V * lane + k] = r[k];
        __syncwarp();
#pragma unroll
        for (int k = 0; k < KW_K_CSM_V; k++) {
            int tok = wbase + 32 * k + lane;
            if (tok < hi)
                out[tok] = strip[32 * k + lane];
        }
        __syncwarp(); /* the strip is refilled next tile */
    }
}
