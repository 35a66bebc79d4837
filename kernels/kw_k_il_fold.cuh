/* kw_k_il_fold.cuh: indexer_logits' epilogue, shared by prefill and
 * decode: each thread folds its own GEMM columns into per-(row, query)
 * partial sums (relu, head weight), the quad sums them in a
 * reduce-scatter, and each lane writes its share (spec/kernels.md,
 * indexer_logits).  Device code only; included by indexer_logits.cu after
 * il_block, il_row16 and IL_ROWS, which it uses. */
#ifndef KW_K_IL_FOLD_CUH
#define KW_K_IL_FOLD_CUH

/* Adds this thread's share of GEMM columns [8 j0, 8 j1) to its partial
 * sums: v[2 qq + e] += w[h] * relu(S) over its heads h of query qq, for
 * its tile row r + 8 e (il_row16). */
template <int HP, int V>
__device__ __forceinline__ void il_partial(float (&v)[V], const float *acc,
                                           const float *ws, int j0, int j1)
{
    const int tq = threadIdx.x & 3;
#pragma unroll
    for (int j = j0; j < j1; j++) {
        const int qq = j / (HP / 8);
        const float2 wv = *(const float2 *)(ws + 8 * j + 2 * tq);
        v[2 * qq] += fmaxf(acc[4 * j], 0.0f) * wv.x;
        v[2 * qq] += fmaxf(acc[4 * j + 1], 0.0f) * wv.y;
        v[2 * qq + 1] += fmaxf(acc[4 * j + 2], 0.0f) * wv.x;
        v[2 * qq + 1] += fmaxf(acc[4 * j + 3], 0.0f) * wv.y;
    }
}

/* il_partial over all NJ column groups, with this thread's weights in
 * registers: wr[j] holds w[8 j + 2 tq] and w[8 j + 2 tq + 1]. */
template <int HP, int V, int NJ>
__device__ __forceinline__ void il_partial_r(float (&v)[V], const float *acc,
                                             const float2 (&wr)[NJ])
{
#pragma unroll
    for (int j = 0; j < NJ; j++) {
        const int qq = j / (HP / 8);
        v[2 * qq] += fmaxf(acc[4 * j], 0.0f) * wr[j].x;
        v[2 * qq] += fmaxf(acc[4 * j + 1], 0.0f) * wr[j].y;
        v[2 * qq + 1] += fmaxf(acc[4 * j + 2], 0.0f) * wr[j].x;
        v[2 * qq + 1] += fmaxf(acc[4 * j + 3], 0.0f) * wr[j].y;
    }
}

/* The quad's sums of the V = 2 QB partial sums of il_partial, scattered:
 * lane tq = b + 2 c ends with NV of them, those of index il_quad::idx(i),
 * after two shuffle steps (each lane sends the half it does not keep)
 * instead of a shuffle per value and step. */
template <int QB>
struct il_quad {
    static constexpr int V = 2 * QB, NV = V >= 4 ? V / 4 : 1;
    static constexpr int NL = NV >= 2 ? NV / 2 : 1; /* queries per lane */
    int lo[NL], hi[NL], lim[NL]; /* window; columns written (0: none) */

    static __device__ __forceinline__ int idx(int i)
    {
        const int tq = threadIdx.x & 3;
        return V >= 4 ? (tq & 1) * (V / 2) + (tq >> 1) * (V / 4) + i
                      : (tq & 1);
    }

    __device__ __forceinline__ il_quad(const il_block<QB> &bk, const int *qlo,
                                       const int *qhi)
    {
#pragma unroll
        for (int l = 0; l < NL; l++) {
            const int qq = idx(2 * l) >> 1;
            lo[l] = qlo[qq];
            hi[l] = qhi[qq];
            lim[l] = qq < bk.nq && (V >= 4 || (threadIdx.x & 2) == 0)
                         ? bk.limit : 0;
        }
    }

    static __device__ __forceinline__ void sum(float (&v)[V], float (&u)[NV])
    {
        const bool b = threadIdx.x & 1, c = threadIdx.x & 2;
        constexpr int H1 = V / 2;
        float w[H1];
#pragma unroll
        for (int i = 0; i < H1; i++)
            w[i] = (b ? v[i + H1] : v[i]) +
                   __shfl_xor_sync(0xffffffffu, b ? v[i] : v[i + H1], 1);
        if constexpr (H1 == 1) {
            u[0] = w[0] + __shfl_xor_sync(0xffffffffu, w[0], 2);
        } else {
#pragma unroll
            for (int i = 0; i < H1 / 2; i++)
                u[i] = (c ? w[i + H1 / 2] : w[i]) +
                       __shfl_xor_sync(0xffffffffu,
                                       c ? w[i] : w[i + H1 / 2], 2);
        }
    }

    /* Sums v over the quad and writes this lane's share for tile rows
     * r0 and r0 + 8 (scales sc0, sc1): k_scale * sum inside the query's
     * window, -inf elsewhere below the column limit. */
    __device__ __forceinline__ void write(float (&v)[V], const il_block<QB> &bk,
                                          int r0, float sc0, float sc1,
                                          float *__restrict__ out) const
    {
        float u[NV];
        sum(v, u);
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int id = idx(i), l = NV >= 2 ? i / 2 : 0;
            const int n = r0 + 8 * (id & 1);
            if (n < lim[l])
                out[(bk.row0 + (id >> 1)) * bk.stride + n] =
                    n >= lo[l] && n < hi[l] ? u[i] * (id & 1 ? sc1 : sc0)
                                            : -__int_as_float(0x7f800000);
        }
    }

    /* write() for rows inside every window of the block's QB queries, all
     * valid, and below the column limit: no per-score check. */
    static __device__ __forceinline__ void write_inside(
        float (&v)[V], const il_block<QB> &bk, int r0, float sc0, float sc1,
        float *__restrict__ out)
    {
        float u[NV];
        sum(v, u);
        if (V < 4 && (threadIdx.x & 2))
            return; /* two lanes of the quad hold the other halves */
#pragma unroll
        for (int i = 0; i < NV; i++) {
            const int id = idx(i);
            out[(bk.row0 + (id >> 1)) * bk.stride + r0 + 8 * (id & 1)] =
                u[i] * (id & 1 ? sc1 : sc0);
        }
    }
};

/* Folds this thread's accumulators into per-(row, query) scores and
 * writes them (il_quad). */
template <int HP, int QB>
__device__ __forceinline__ void il_epilogue(const float *acc, const float *ws,
                                            const il_block<QB> &bk,
                                            const il_quad<QB> &lq, int t,
                                            const float *sc,
                                            float *__restrict__ out)
{
    const int rt = il_row16();
    float v[2 * QB] = {};
    il_partial<HP>(v, acc, ws, 0, QB * HP / 8);
    lq.write(v, bk, t * IL_ROWS + rt, sc[rt], sc[rt + 8], out);
}

/* Writes -inf over columns [c0, c1) of every valid query of the block
 * (NT threads). */
template <int QB, int NT>
__device__ __forceinline__ void il_fill(const il_block<QB> &bk, int c0,
                                        int c1, float *__restrict__ out)
{
    const float ninf = -__int_as_float(0x7f800000);
    if (c1 > bk.limit)
        c1 = bk.limit;
    for (int qq = 0; qq < bk.nq; qq++)
        for (int n = c0 + threadIdx.x; n < c1; n += NT)
            out[(bk.row0 + qq) * bk.stride + n] = ninf;
}

/* Part y of ny of the columns outside [a, b) (below a, then from b to
 * the limit), in near-equal shares, written -inf. */
template <int QB, int NT>
__device__ __forceinline__ void il_fill_part(const il_block<QB> &bk, int a,
                                             int b, int y, int ny,
                                             float *__restrict__ out)
{
    const long long n = (long long)a + (bk.limit > b ? bk.limit - b : 0);
    const int f0 = (int)(n * y / ny), f1 = (int)(n * (y + 1) / ny);
    if (f0 < a)
        il_fill<QB, NT>(bk, f0, f1 < a ? f1 : a, out);
    if (f1 > a)
        il_fill<QB, NT>(bk, b + (f0 > a ? f0 : a) - a, b + f1 - a, out);
}

#endif /* KW_K_IL_FOLD_CUH */
