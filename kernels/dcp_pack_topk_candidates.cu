/* dcp_pack_topk_candidates.cu: packs a rank's local top-k as (score,
 * global id) pairs for the cross-rank gather (spec/kernels.md).  Device
 * code only.
 *
 * Template parameters are the key's fields in spec order: the exact DCP
 * rank, world and interleave, whether row_starts is given, topk, and the
 * threads per block.
 *
 * Launch: BLOCK threads, one block per row (any grid: rows are
 * grid-strided).  Each thread handles 4 consecutive entries per step: one
 * 16-byte load of positions, four gathers, two 16-byte stores, when TOPK %
 * 4 == 0 and the row pointers are aligned; one entry at a time otherwise.
 * logits is [num_rows][cols], contiguous.
 */
#include "kw_k_dcp.cuh"

/* Entry p of a row: (logits[p + rs], global(p)), or (-inf, -1). */
template <int R, int W, int IL>
__device__ __forceinline__ float2 pack_one(const float *__restrict__ lrow,
                                           int p, int rs, int cols)
{
    long long c = (long long)p + rs;
    if (p < 0 || c < 0 || c >= cols)
        return make_float2(__int_as_float(0xff800000), -1.0f);
    int g = (int)kw_k_dcp_global((unsigned)p, R, W, IL);
    return make_float2(__ldg(lrow + c), (float)g);
}

template <int R, int W, int IL, int TOPK, int BLOCK, bool VEC>
__device__ __forceinline__ void pack_row(const float *__restrict__ lrow,
                                         const int *__restrict__ in,
                                         float *__restrict__ o, int rs,
                                         int cols)
{
    if constexpr (VEC) {
        for (int i = threadIdx.x * 4; i < TOPK; i += BLOCK * 4) {
            int4 p = __ldg((const int4 *)(in + i));
            float2 a = pack_one<R, W, IL>(lrow, p.x, rs, cols);
            float2 b = pack_one<R, W, IL>(lrow, p.y, rs, cols);
            float2 c = pack_one<R, W, IL>(lrow, p.z, rs, cols);
            float2 d = pack_one<R, W, IL>(lrow, p.w, rs, cols);
            float4 *dst = (float4 *)(o + 2 * (long long)i);
            dst[0] = make_float4(a.x, a.y, b.x, b.y);
            dst[1] = make_float4(c.x, c.y, d.x, d.y);
        }
    } else {
        for (int i = threadIdx.x; i < TOPK; i += BLOCK) {
            float2 a = pack_one<R, W, IL>(lrow, __ldg(in + i), rs, cols);
            o[2 * (long long)i] = a.x;
            o[2 * (long long)i + 1] = a.y;
        }
    }
}

template <int R, int W, int IL, bool HAS_ROW_STARTS, int TOPK, int BLOCK>
__global__ void __launch_bounds__(BLOCK) kw_k_dcp_pack_topk_candidates(
    const float *__restrict__ logits, const int *__restrict__ topk_local,
    const int *__restrict__ row_starts, int num_rows, int cols,
    float *__restrict__ packed)
{
    static_assert(W >= 1 && R >= 0 && R < W && IL >= 1 && TOPK >= 1,
                  "invalid dcp_pack_topk_candidates key");
    for (int row = blockIdx.x; row < num_rows; row += gridDim.x) {
        const int rs = HAS_ROW_STARTS ? __ldg(row_starts + row) : 0;
        const float *lrow = logits + (long long)row * cols;
        const int *in = topk_local + (long long)row * TOPK;
        float *o = packed + (long long)row * TOPK * 2;
        bool vec = TOPK % 4 == 0 &&
                   (((unsigned long long)in | (unsigned long long)o) & 15) == 0;
        if (vec)
            pack_row<R, W, IL, TOPK, BLOCK, TOPK % 4 == 0>(lrow, in, o, rs,
                                                          cols);
        else
            pack_row<R, W, IL, TOPK, BLOCK, false>(lrow, in, o, rs, cols);
    }
}
