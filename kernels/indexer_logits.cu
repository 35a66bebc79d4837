/* indexer_logits.cu: the lightning indexer's fp8 multi-query logits
 * (spec/kernels.md, indexer_logits).  Device code only.
 *
 * Template parameters are the key's fields: HEADS, HEAD_DIM, PAGED,
 * PAGE_ROWS, NEXT_N.  One block (256 threads, dynamic shared memory of
 * il_smem_bytes()) scores QB queries against tiles of 64 K rows:
 *
 *   S[n][q*HP + h] = sum_d k[n][d] * q[q][h][d]      (a 64 x NQ GEMM)
 *   logits[q][n]   = k_scale[n] * sum_h w[q][h] * relu(S[n][q*HP + h])
 *
 * The K rows are the GEMM's M side, so the head sum of one (row, query)
 * lives in one quad of lanes: each thread folds its own columns, then two
 * shuffles finish the sum, and no row ever crosses a warp.  HP is the head
 * count rounded up to a power of two (at least 16); QB * HP = NQ is 128
 * (256 for 256 heads; less for a decode key with fewer queries), so the
 * accumulators leave room for two blocks per SM.  Padded heads and queries
 * hold zero bytes and zero weights.
 *
 * Each of the two warpgroups runs its own pipeline over every other tile
 * (its own 1-4 stages filled with cp.async, its own named barrier), so one
 * warpgroup's epilogue overlaps the other's tensor-core work.  Row scales
 * travel with their tile and decode pages are read one iteration ahead,
 * so no step waits on a dependent global load.  Shared memory holds the
 * block's queries (NQ x HEAD_DIM bytes, shared), the stages and the
 * weights, in the no-swizzle "core matrix" layout of wgmma (8 rows x 16
 * bytes contiguous, K-direction neighbours 128 bytes apart, 8-row groups
 * 8*HEAD_DIM apart).
 *
 * The tensor-core step has two forms with the same fragment layout (the
 * m16n8 accumulator order, 16 rows per warp):
 *  - sm_90a (__CUDA_ARCH_FEAT_SM90_ALL): wgmma.mma_async m64nNQk32 e4m3,
 *    operands from shared memory;
 *  - elsewhere: mma.sync m16n8k16 f16 (sm_80 and up; two m16n8k8 on
 *    sm_75) on the fp8 bytes converted to f16 (exact: every e4m3 value is
 *    an f16 value), each warp taking 16 rows.  Below sm_80, where there is
 *    no cp.async, the stages are filled with plain loads and stores.
 * Products of fp8 values are exact in fp32, so the paths differ from the
 * double-precision reference only in the order of summation.
 */

#include <cuda_fp16.h>

typedef unsigned long long kw_u64;
typedef unsigned char kw_u8;

#define IL_TILE 128
#define IL_THREADS 256
#define IL_SMEM_BUDGET 217088

__host__ __device__ constexpr int il_pow2ceil(int x)
{
    int p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

__host__ __device__ constexpr int il_pow2floor(int x)
{
    int p = 1;
    while (p * 2 <= x)
        p <<= 1;
    return p;
}

/* Padded heads, queries per block, GEMM width, pipeline stages and shared
 * bytes; kw_k_shmem_bytes() and kw_k_logits_queries() on the host repeat
 * these formulas. */
__host__ __device__ constexpr int il_hp(int h)
{
    return il_pow2ceil(h < 16 ? 16 : h);
}

/* At most 128 GEMM columns (256 only for 256 heads), so the 64
 * accumulators per thread leave room for two blocks per SM, one in its
 * epilogue while the other keeps the tensor cores busy. */
__host__ __device__ constexpr int il_cols(int h)
{
    return il_hp(h) >= 256 ? 256 : 128;
}

__host__ __device__ constexpr int il_qb(int h, bool paged, int next_n)
{
    return !paged ? il_cols(h) / il_hp(h)
           : il_pow2floor(next_n) < il_cols(h) / il_hp(h)
               ? il_pow2floor(next_n)
               : il_cols(h) / il_hp(h);
}

__host__ __device__ constexpr int il_stages(int nq, int d)
{
    return (IL_SMEM_BUDGET - nq * d - nq * 4) / (IL_TILE * (d + 4)) < 1 ? 1
           : (IL_SMEM_BUDGET - nq * d - nq * 4) / (IL_TILE * (d + 4)) > 4
               ? 4
               : (IL_SMEM_BUDGET - nq * d - nq * 4) / (IL_TILE * (d + 4));
}

/* Queries, then the K stages, then the stages' row scales, then weights. */
__host__ __device__ constexpr int il_smem_bytes(int nq, int d)
{
    return nq * d + il_stages(nq, d) * IL_TILE * (d + 4) + nq * 4;
}

/* Byte offset of 16-byte chunk c of row r in a core-matrix tile whose
 * rows are d bytes long. */
__device__ __forceinline__ unsigned il_off(int r, int c, int d)
{
    return (unsigned)(((r >> 3) * (d >> 4) + c) * 128 + (r & 7) * 16);
}

/* 16- and 4-byte copies global -> shared (zero-filled when !valid):
 * cp.async from sm_80 on; before that (sm_75) a plain load and store, so
 * the key still compiles and runs there, and commit/wait are no-ops. */
__device__ __forceinline__ void il_cp16(unsigned dst, const void *src,
                                        bool valid)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n"
                 ::"r"(dst), "l"(src), "r"(valid ? 16 : 0) : "memory");
#else
    uint4 v = valid ? *(const uint4 *)src : make_uint4(0, 0, 0, 0);
    asm volatile("st.shared.v4.u32 [%0], {%1, %2, %3, %4};\n"
                 ::"r"(dst), "r"(v.x), "r"(v.y), "r"(v.z), "r"(v.w)
                 : "memory");
#endif
}

__device__ __forceinline__ void il_cp4(unsigned dst, const void *src,
                                       bool valid)
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;\n"
                 ::"r"(dst), "l"(src), "r"(valid ? 4 : 0) : "memory");
#else
    unsigned v = valid ? *(const unsigned *)src : 0u;
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(dst), "r"(v) : "memory");
#endif
}

__device__ __forceinline__ void il_cp_commit()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.commit_group;\n" ::: "memory");
#endif
}

template <int N>
__device__ __forceinline__ void il_cp_wait()
{
#if __CUDA_ARCH__ >= 800
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
#endif
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define IL_WGMMA 1
#else
#define IL_WGMMA 0
#endif

#if IL_WGMMA
/* wgmma descriptor of a no-swizzle K-major tile at shared address a:
 * leading (K-direction) byte offset 128, stride (8-row) byte offset sbo. */
__device__ __forceinline__ kw_u64 il_desc(unsigned a, unsigned sbo)
{
    return (kw_u64)((a & 0x3FFFF) >> 4) | ((kw_u64)(128 >> 4) << 16) |
           ((kw_u64)(sbo >> 4) << 32);
}

template <int N> struct il_wgmma;
template <> struct il_wgmma<16> {
    static __device__ __forceinline__ void run(float *d, kw_u64 da,
                                               kw_u64 db, int acc)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %10, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n16k32.f32.e4m3.e4m3 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7}, %8, %9, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                       "+f"(d[6]), "+f"(d[7])
                     : "l"(da), "l"(db), "r"(acc));
    }
};
template <> struct il_wgmma<32> {
    static __device__ __forceinline__ void run(float *d, kw_u64 da,
                                               kw_u64 db, int acc)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %18, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n32k32.f32.e4m3.e4m3 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}, %16"
                     ", %17, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
                     : "l"(da), "l"(db), "r"(acc));
    }
};
template <> struct il_wgmma<64> {
    static __device__ __forceinline__ void run(float *d, kw_u64 da,
                                               kw_u64 db, int acc)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n64k32.f32.e4m3.e4m3 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%"
                     "17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31},"
                     " %32, %33, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                       "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                       "+f"(d[30]), "+f"(d[31])
                     : "l"(da), "l"(db), "r"(acc));
    }
};
template <> struct il_wgmma<128> {
    static __device__ __forceinline__ void run(float *d, kw_u64 da,
                                               kw_u64 db, int acc)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%"
                     "17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%"
                     "32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%"
                     "47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%"
                     "62,%63}, %64, %65, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                       "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                       "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                       "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                       "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                       "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                       "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                       "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
                     : "l"(da), "l"(db), "r"(acc));
    }
};
template <> struct il_wgmma<256> {
    static __device__ __forceinline__ void run(float *d, kw_u64 da,
                                               kw_u64 db, int acc)
    {
        asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %130, 0;\n"
                     "wgmma.mma_async.sync.aligned.m64n256k32.f32.e4m3.e4m3 "
                     "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,%"
                     "17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,%"
                     "32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,%"
                     "47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,%"
                     "62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,%"
                     "77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,%"
                     "92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105"
                     ",%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117"
                     ",%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}, %128, %"
                     "129, p, 1, 1;\n}\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]),
                       "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]),
                       "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]),
                       "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]),
                       "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]),
                       "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]),
                       "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]),
                       "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]),
                       "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]),
                       "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]),
                       "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63]), "+f"(d[64]), "+f"(d[65]),
                       "+f"(d[66]), "+f"(d[67]), "+f"(d[68]), "+f"(d[69]), "+f"(d[70]), "+f"(d[71]),
                       "+f"(d[72]), "+f"(d[73]), "+f"(d[74]), "+f"(d[75]), "+f"(d[76]), "+f"(d[77]),
                       "+f"(d[78]), "+f"(d[79]), "+f"(d[80]), "+f"(d[81]), "+f"(d[82]), "+f"(d[83]),
                       "+f"(d[84]), "+f"(d[85]), "+f"(d[86]), "+f"(d[87]), "+f"(d[88]), "+f"(d[89]),
                       "+f"(d[90]), "+f"(d[91]), "+f"(d[92]), "+f"(d[93]), "+f"(d[94]), "+f"(d[95]),
                       "+f"(d[96]), "+f"(d[97]), "+f"(d[98]), "+f"(d[99]), "+f"(d[100]), "+f"(d[101]),
                       "+f"(d[102]), "+f"(d[103]), "+f"(d[104]), "+f"(d[105]), "+f"(d[106]), "+f"(d[107]),
                       "+f"(d[108]), "+f"(d[109]), "+f"(d[110]), "+f"(d[111]), "+f"(d[112]), "+f"(d[113]),
                       "+f"(d[114]), "+f"(d[115]), "+f"(d[116]), "+f"(d[117]), "+f"(d[118]), "+f"(d[119]),
                       "+f"(d[120]), "+f"(d[121]), "+f"(d[122]), "+f"(d[123]), "+f"(d[124]), "+f"(d[125]),
                       "+f"(d[126]), "+f"(d[127])
                     : "l"(da), "l"(db), "r"(acc));
    }
};
#endif /* IL_WGMMA */

/* Two e4m3 bytes (the low one first) as an f16 pair. */
__device__ __forceinline__ unsigned il_f16x2(unsigned short x)
{
#if __CUDA_ARCH__ >= 890
    unsigned r;
    asm("{\n.reg .b16 t;\nmov.b16 t, %1;\ncvt.rn.f16x2.e4m3x2 %0, t;\n}\n"
        : "=r"(r) : "h"(x));
    return r;
#else
    /* e4m3 s.eeee.mmm as the f16 s.0eeee.mmm0000000 is the value / 2^8,
     * normal and subnormal alike; |x| == 0x7f is NaN. */
    unsigned r = 0;
    for (int i = 0; i < 2; i++) {
        unsigned b = (x >> (8 * i)) & 0xffu;
        unsigned h = (b & 0x7fu) == 0x7fu
                         ? 0x7e00u
                         : ((b & 0x80u) << 8) | ((b & 0x7fu) << 7);
        r |= h << (16 * i);
    }
    __half2 v = *(__half2 *)&r;
    v = __hmul2(v, __floats2half2_rn(256.0f, 256.0f));
    return *(unsigned *)&v;
#endif
}

/* One e4m3 byte as a float (exact). */
__device__ __forceinline__ float il_f8(unsigned b)
{
    unsigned h = il_f16x2((unsigned short)b) & 0xffffu;
    return __half2float(__ushort_as_half((unsigned short)h));
}

/* The portable tensor-core step: this warp's 16 rows (rb..rb+15) of the
 * K tile at kt against every query column, all of HEAD_DIM. */
template <int NQ, int D>
__device__ __forceinline__ void il_mma_warp(float *acc, const kw_u8 *kt,
                                            const kw_u8 *qs, int rb)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
#if __CUDA_ARCH__ >= 750
#pragma unroll 1
    for (int s = 0; s < D / 16; s++) {
        unsigned a[4];
        a[0] = il_f16x2(*(const unsigned short *)(kt + il_off(rb + g, s, D) + 2 * tq));
        a[1] = il_f16x2(*(const unsigned short *)(kt + il_off(rb + g + 8, s, D) + 2 * tq));
        a[2] = il_f16x2(*(const unsigned short *)(kt + il_off(rb + g, s, D) + 8 + 2 * tq));
        a[3] = il_f16x2(*(const unsigned short *)(kt + il_off(rb + g + 8, s, D) + 8 + 2 * tq));
#pragma unroll
        for (int j = 0; j < NQ / 8; j++) {
            const kw_u8 *b = qs + il_off(8 * j + g, s, D) + 2 * tq;
            unsigned b0 = il_f16x2(*(const unsigned short *)b);
            unsigned b1 = il_f16x2(*(const unsigned short *)(b + 8));
#if __CUDA_ARCH__ >= 800
            asm volatile(
                "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 "
                "{%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
                : "+f"(acc[4 * j]), "+f"(acc[4 * j + 1]),
                  "+f"(acc[4 * j + 2]), "+f"(acc[4 * j + 3])
                : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0),
                  "r"(b1));
#else
            /* sm_75 has m16n8k8 only: the two k halves one after another. */
            for (int h = 0; h < 2; h++)
                asm volatile(
                    "mma.sync.aligned.m16n8k8.row.col.f32.f16.f16.f32 "
                    "{%0,%1,%2,%3}, {%4,%5}, {%6}, {%0,%1,%2,%3};\n"
                    : "+f"(acc[4 * j]), "+f"(acc[4 * j + 1]),
                      "+f"(acc[4 * j + 2]), "+f"(acc[4 * j + 3])
                    : "r"(a[2 * h]), "r"(a[2 * h + 1]), "r"(h ? b1 : b0));
#endif
        }
    }
#else
#pragma unroll
    for (int j = 0; j < NQ / 8; j++)
        for (int e = 0; e < 4; e++) {
            int r = rb + g + (e >> 1) * 8, c = 8 * j + 2 * tq + (e & 1);
            float s = 0.0f;
            for (int d = 0; d < D; d++)
                s += il_f8(kt[il_off(r, d >> 4, D) + (d & 15)]) *
                     il_f8(qs[il_off(c, d >> 4, D) + (d & 15)]);
            acc[4 * j + e] += s;
        }
#endif
}

/* Where one block's queries are: their output rows and windows. */
template <int QB>
struct il_block {
    int nq;            /* valid queries (the rest are padding) */
    int row0;          /* output row of query 0 (consecutive rows) */
    int lo, hi;        /* union of the windows */
    int limit;         /* columns written: num_k or max_rows */
    long long stride;  /* output row stride */
};

/* Each warpgroup (128 threads) runs its own pipeline over every other
 * tile of 64 rows, with its own stages and its own named barrier, so one
 * warpgroup's epilogue overlaps the other's wgmma. */
#define IL_ROWS 64
#define IL_WG 128

__device__ __forceinline__ int il_wg() { return (int)threadIdx.x >> 7; }
__device__ __forceinline__ int il_wt() { return (int)threadIdx.x & 127; }

/* This warpgroup's barrier (ids 1 and 2; 0 is __syncthreads). */
__device__ __forceinline__ void il_wg_sync()
{
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + il_wg()) : "memory");
}

/* Page of each K row this thread loads for tile t (decode only), fetched
 * one iteration before the copies that need them, so no copy waits on a
 * block-table read: pg[m] for the 16-byte chunks m, pg[NPG - 1] for the
 * scale row.  Rows at or past hi get page 0 (not read). */
template <int D, int PR>
struct il_pages {
    static constexpr int NPG = D / 32 + 1, P = PR > 0 ? PR : 1;
    int pg[NPG];

    __device__ __forceinline__ void fetch(int t, int hi,
                                          const int *__restrict__ bt)
    {
        constexpr int C = D / 16;
#pragma unroll
        for (int m = 0; m < NPG; m++) {
            int r = m < NPG - 1 ? (il_wt() + IL_WG * m) / C : il_wt() % IL_ROWS;
            int row = t * IL_ROWS + r;
            pg[m] = row < hi ? __ldg(bt + row / P) : 0;
        }
    }
};

/* Loads 64-row K tile t and its row scales (this warpgroup's threads) into
 * the stage at shared addresses dst and sdst; rows at or past hi are
 * zero-filled, not read.  Decode rows go through the pages in pg. */
template <int D, bool PAGED, int PR>
__device__ __forceinline__ void il_load_tile(unsigned dst, unsigned sdst,
                                             int t, int hi,
                                             const kw_u8 *__restrict__ k,
                                             const float *__restrict__ ksc,
                                             const il_pages<D, PR> &pg)
{
    constexpr int C = D / 16, NPG = il_pages<D, PR>::NPG;
    constexpr int P = il_pages<D, PR>::P;
#pragma unroll
    for (int m = 0; m < NPG - 1; m++) {
        int idx = il_wt() + IL_WG * m;
        int r = idx / C, c = idx % C, row = t * IL_ROWS + r;
        bool valid = row < hi;
        const kw_u8 *src = k;
        if (valid)
            src = PAGED ? k + ((long long)pg.pg[m] * P + row % P) * D + c * 16
                        : k + (long long)row * D + c * 16;
        il_cp16(dst + il_off(r, c, D), src, valid);
    }
    /* The rows' scales, so the epilogue waits on no global load. */
    if (il_wt() < IL_ROWS) {
        int r = il_wt(), row = t * IL_ROWS + r;
        const float *src = ksc;
        if (row < hi)
            src = PAGED ? ksc + (long long)pg.pg[NPG - 1] * P + row % P
                        : ksc + row;
        il_cp4(sdst + 4 * r, src, row < hi);
    }
}

/* The block's queries and weights into shared memory (zero padding). */
template <int H, int D, int HP, int NQ>
__device__ __forceinline__ void il_load_queries(kw_u8 *qs, float *ws,
                                                const kw_u8 *__restrict__ q,
                                                const float *__restrict__ w,
                                                long long qrow0, int nq)
{
    constexpr int C = D / 16;
    for (int idx = threadIdx.x; idx < NQ * C; idx += IL_THREADS) {
        int col = idx / C, c = idx % C, qq = col / HP, h = col % HP;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (qq < nq && h < H)
            v = *(const uint4 *)(q + ((qrow0 + qq) * H + h) * D + c * 16);
        *(uint4 *)(qs + il_off(col, c, D)) = v;
    }
    for (int col = threadIdx.x; col < NQ; col += IL_THREADS) {
        int qq = col / HP, h = col % HP;
        ws[col] = qq < nq && h < H ? w[(qrow0 + qq) * H + h] : 0.0f;
    }
}

/* Folds this thread's accumulators into per-(row, query) scores and
 * writes them: k_scale * sum_h w * relu(S) inside each query's window,
 * -inf elsewhere below the block's column limit. */
template <int HP, int QB>
__device__ __forceinline__ void il_epilogue(
    const float *acc, const float *ws, const il_block<QB> &bk, const int *lo,
    const int *hi, int t, const float *sc, float *__restrict__ out)
{
    const int lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
    const int rt = 16 * ((threadIdx.x >> 5) & 3) + g, r0 = t * IL_ROWS + rt;
#pragma unroll
    for (int qq = 0; qq < QB; qq++) {
        float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
        for (int jj = 0; jj < HP / 8; jj++) {
            const int j = qq * (HP / 8) + jj;
            const float2 wv = *(const float2 *)(ws + 8 * j + 2 * tq);
            s0 += fmaxf(acc[4 * j], 0.0f) * wv.x;
            s0 += fmaxf(acc[4 * j + 1], 0.0f) * wv.y;
            s1 += fmaxf(acc[4 * j + 2], 0.0f) * wv.x;
            s1 += fmaxf(acc[4 * j + 3], 0.0f) * wv.y;
        }
        s0 += __shfl_xor_sync(0xffffffffu, s0, 1);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 1);
        s0 += __shfl_xor_sync(0xffffffffu, s0, 2);
        s1 += __shfl_xor_sync(0xffffffffu, s1, 2);
        if (tq != (qq & 3) || qq >= bk.nq)
            continue;
        float *o = out + (bk.row0 + qq) * bk.stride;
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int n = r0 + 8 * e;
            if (n >= bk.limit)
                continue;
            float v = -__int_as_float(0x7f800000);
            if (n >= lo[qq] && n < hi[qq])
                v = (e ? s1 : s0) * sc[rt + 8 * e];
            o[n] = v;
        }
    }
}

/* Writes -inf over columns [c0, c1) of every valid query of the block. */
template <int QB>
__device__ __forceinline__ void il_fill(const il_block<QB> &bk, int c0,
                                        int c1, float *__restrict__ out)
{
    const float ninf = -__int_as_float(0x7f800000);
    if (c1 > bk.limit)
        c1 = bk.limit;
    for (int qq = 0; qq < bk.nq; qq++)
        for (int n = c0 + threadIdx.x; n < c1; n += IL_THREADS)
            out[(bk.row0 + qq) * bk.stride + n] = ninf;
}

/* Shared-memory layout: queries, then each warpgroup's S stages of K
 * rows, then their row scales, then the weights. */
template <int D, int NQ, int S>
struct il_smem_map {
    unsigned qa, kbase, sbase; /* shared addresses of this warpgroup's */
    const kw_u8 *qs, *kbytes;  /* stages */
    float *ws;
    const float *scs;

    __device__ __forceinline__ il_smem_map(kw_u8 *base)
    {
        const int w = il_wg();
        qs = base;
        kbytes = base + NQ * D + w * S * IL_ROWS * D;
        scs = (const float *)(base + NQ * D + S * IL_TILE * D) + w * S * IL_ROWS;
        ws = (float *)(base + NQ * D + S * IL_TILE * (D + 4));
        qa = (unsigned)__cvta_generic_to_shared(base);
        kbase = qa + NQ * D + w * S * IL_ROWS * D;
        sbase = qa + NQ * D + S * IL_TILE * D + w * S * IL_ROWS * 4;
    }
};

/* The GEMM of stage st into acc: wgmma on sm_90a, mma.sync elsewhere. */
template <int D, int NQ, int S>
__device__ __forceinline__ void il_mma(const il_smem_map<D, NQ, S> &m, int st,
                                       float *acc)
{
#if IL_WGMMA
    const unsigned ka = m.kbase + st * IL_ROWS * D;
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < D / 32; kk++)
        il_wgmma<NQ>::run(acc, il_desc(ka + kk * 256, 8 * D),
                          il_desc(m.qa + kk * 256, 8 * D), kk > 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#else
#pragma unroll
    for (int j = 0; j < NQ / 2; j++)
        acc[j] = 0.0f;
    il_mma_warp<NQ, D>(acc, m.kbytes + st * IL_ROWS * D, m.qs,
                       16 * ((threadIdx.x >> 5) & 3));
#endif
}

/* Waits for this thread's copies of all but the newest N groups, then
 * makes the warpgroup's copies visible to it and to wgmma. */
template <int N>
__device__ __forceinline__ void il_arrive()
{
    il_cp_wait<N>();
#if IL_WGMMA
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
    il_wg_sync();
}

/* One warpgroup's tile loop: its tiles are t(j) = tlo + (2j + w) * tstep
 * in units of 64 rows, j < nt. */
template <int H, int D, bool PAGED, int PR, int NEXT_N>
struct il_loop {
    static constexpr int HP = il_hp(H), QB = il_qb(H, PAGED, NEXT_N);
    static constexpr int NQ = QB * HP, S = il_stages(NQ, D);
    il_smem_map<D, NQ, S> m;
    il_block<QB> bk;
    const int *lo, *hi;
    int tlo, tstep, nt;
    const kw_u8 *k;
    const float *ksc;
    const int *bt;
    float *out;

    __device__ __forceinline__ il_loop(kw_u8 *base) : m(base) {}

    __device__ __forceinline__ int tile(int j) const
    {
        return tlo + (2 * j + il_wg()) * tstep;
    }

    __device__ __forceinline__ void load(int j, const il_pages<D, PR> &pg)
    {
        const int st = j % S;
        il_load_tile<D, PAGED, PR>(m.kbase + st * IL_ROWS * D,
                                   m.sbase + st * IL_ROWS * 4, tile(j),
                                   bk.hi, k, ksc, pg);
    }

    __device__ __forceinline__ void pages(int j, il_pages<D, PR> &pg)
    {
        if (PAGED && j < nt)
            pg.fetch(tile(j), bk.hi, bt);
    }

    /* Prefetch distance S - 1 tiles; the pages of a tile are read one
     * iteration before its copies are issued. */
    __device__ __forceinline__ void run()
    {
        il_pages<D, PR> pg;
        float acc[NQ / 2];
        for (int s = 0; s < S - 1; s++) {
            pages(s, pg);
            if (s < nt)
                load(s, pg);
            il_cp_commit();
        }
        pages(S - 1, pg);
#pragma unroll 1
        for (int j = 0; j < nt; j++) {
            if (j + S - 1 < nt)
                load(j + S - 1, pg);
            il_cp_commit();
            pages(j + S, pg);
            il_arrive<S - 1>();
            il_mma(m, j % S, acc);
            il_epilogue<HP, QB>(acc, m.ws, bk, lo, hi, tile(j),
                                m.scs + (j % S) * IL_ROWS, out);
            il_wg_sync(); /* stage j % S is free for tile j + S */
        }
    }
};

/* Entry point.  Prefill: (q, w, k, k_scale, ks, ke, num_rows, num_k,
 * stride, logits); decode: (q, w, k_pages, k_scale_pages, block_table,
 * row_end, num_reqs, width, max_rows, logits); see kw_kernels.h. */
template <int H, int D, bool PAGED, int PR, int NEXT_N>
__global__ void __launch_bounds__(
    IL_THREADS, il_qb(H, PAGED, NEXT_N) * il_hp(H) <= 128 ? 2 : 1)
    kw_k_indexer_logits(
    const kw_u8 *__restrict__ q, const float *__restrict__ w,
    const kw_u8 *__restrict__ k, const float *__restrict__ ksc,
    const int *__restrict__ ia, const int *__restrict__ ib, int x, int y,
    int z, float *__restrict__ out)
{
    typedef il_loop<H, D, PAGED, PR, NEXT_N> L;
    constexpr int HP = L::HP, QB = L::QB, NQ = L::NQ;
    static_assert(D % 32 == 0 && NQ <= 256, "key outside the family");
    extern __shared__ __align__(128) kw_u8 il_smem[];
    __shared__ int lo[QB], hi[QB];
    L lp(il_smem);
    il_block<QB> &bk = lp.bk;
    lp.bt = ia;
    if (PAGED) {
        const int b = blockIdx.y, q0 = blockIdx.z * QB;
        bk.nq = NEXT_N - q0 < QB ? NEXT_N - q0 : QB;
        bk.row0 = b * NEXT_N + q0;
        bk.limit = z;
        bk.stride = z;
        lp.bt = ia + (long long)b * y;
    } else {
        bk.row0 = blockIdx.x * QB;
        bk.nq = x - bk.row0 < QB ? x - bk.row0 : QB;
        bk.limit = y;
        bk.stride = z;
    }
    if (threadIdx.x < QB) {
        int i = bk.row0 + threadIdx.x;
        bool v = (int)threadIdx.x < bk.nq;
        lo[threadIdx.x] = v && !PAGED ? ia[i] : 0;
        hi[threadIdx.x] = v ? ib[i] : 0;
    }
    il_load_queries<H, D, HP, NQ>((kw_u8 *)lp.m.qs, lp.m.ws, q, w, bk.row0,
                                  bk.nq);
    __syncthreads();
    bk.lo = 0x7fffffff;
    bk.hi = 0;
    for (int qq = 0; qq < bk.nq; qq++)
        if (lo[qq] < hi[qq]) {
            bk.lo = min(bk.lo, lo[qq]);
            bk.hi = max(bk.hi, hi[qq]);
        }
    if (bk.hi == 0)
        bk.lo = 0;
    /* Tiles of 64 rows: decode blocks stride over them (any grid), a
     * prefill block covers its queries' union window. */
    const int thi = (bk.hi + IL_ROWS - 1) / IL_ROWS;
    int first, count;
    if (PAGED) {
        lp.tlo = blockIdx.x;
        lp.tstep = gridDim.x;
        count = lp.tlo < thi ? (thi - lp.tlo + lp.tstep - 1) / lp.tstep : 0;
        const int tend = (bk.limit + IL_ROWS - 1) / IL_ROWS;
        for (int t = lp.tlo; t < tend; t += lp.tstep)
            if (t >= thi)
                il_fill(bk, t * IL_ROWS, (t + 1) * IL_ROWS, out);
    } else {
        first = bk.lo / IL_ROWS;
        lp.tlo = first;
        lp.tstep = 1;
        count = thi - first;
        il_fill(bk, 0, first * IL_ROWS, out);
        il_fill(bk, thi * IL_ROWS, bk.limit, out);
    }
    /* Warpgroup w takes the block's tiles w, w + 2, ... */
    lp.nt = (count - il_wg() + 1) / 2;
    lp.lo = lo;
    lp.hi = hi;
    lp.k = k;
    lp.ksc = ksc;
    lp.out = out;
    lp.run();
}
