/* kw_k_il_ptx.cuh: indexer_logits' device primitives (kernels/
 * indexer_logits.cu): the core-matrix tile offset, cp.async copies (plain
 * loads and stores before sm_80), the sm_90a wgmma descriptors and
 * instructions, e4m3 to f16 conversion, the portable mma.sync step, and
 * the sm_90a mbarrier and 1-D bulk-copy wrappers.  Included by
 * indexer_logits.cu only, so only its keys' digests hash it
 * (kernels/sources.c).  It uses nothing of the .cu but the kw_u64 and
 * kw_u8 typedefs, and defines IL_WGMMA (1 when compiled for sm_90a); its
 * end holds the warpgroup helpers and the tensor-core step of a tile
 * (il_mma) that the .cu's loops share.
 */
#ifndef KW_K_IL_PTX_CUH
#define KW_K_IL_PTX_CUH

/* Byte offset of 16-byte chunk c of row r in a core-matrix tile whose
 * rows are d bytes long. */
__device__ __forceinline__ unsigned il_off(int r, int c, int d)
{
    return (unsigned)(((r >> 3) * (d >> 4) + c) * 128 + (r & 7) * 16);
}

/* The same in the 128-byte swizzle of 128-byte rows (wgmma's and TMA's
 * SWIZZLE_128B, tile 1024-byte aligned): row r at 128 r, its chunk c in
 * slot c ^ (r % 8), so the 8 rows of a k-step's 32 bytes lie in distinct
 * banks. */
__device__ __forceinline__ unsigned il_off_sw(int r, int c)
{
    return (unsigned)(r * 128 + ((c ^ (r & 7)) << 4));
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

/* wgmma descriptor of a K-major tile of 128-byte rows in the 128-byte
 * swizzle (il_off_sw) at shared address a, 1024-byte aligned: 8-row
 * groups 1024 bytes apart (the leading offset is unused, 1 by custom). */
__device__ __forceinline__ kw_u64 il_desc_sw(unsigned a)
{
    return (kw_u64)((a & 0x3FFFF) >> 4) | ((kw_u64)1 << 16) |
           ((kw_u64)(1024 >> 4) << 32) | ((kw_u64)1 << 62);
}

/* wgmma m64nNk32 e4m3 into f32 accumulators d[N/2]: run() takes A
 * (the K rows) from shared memory through descriptor da, run_ra() from
 * registers (four words per thread, m16n8k32 order per warp); B is the
 * query tile in shared memory, descriptor db.  acc 0: D = A*B. */
#define IL_F4(b) "+f"(d[b]), "+f"(d[b + 1]), "+f"(d[b + 2]), "+f"(d[b + 3])
#define IL_F8(b) IL_F4(b), IL_F4(b + 4)
#define IL_F16(b) IL_F8(b), IL_F8(b + 8)
#define IL_F32(b) IL_F16(b), IL_F16(b + 16)
#define IL_F64(b) IL_F32(b), IL_F32(b + 32)
#define IL_F128(b) IL_F64(b), IL_F64(b + 64)
#define IL_WGMMA_N(N, DL, PD, AD, BD, PR, AR, BR, ...)                        \
    template <> struct il_wgmma<N> {                                          \
        static __device__ __forceinline__ void run(float *d, kw_u64 da,       \
                                                   kw_u64 db, int acc)        \
        {                                                                     \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" PD ", 0;\n"     \
                         "wgmma.mma_async.sync.aligned.m64n" #N               \
                         "k32.f32.e4m3.e4m3 " DL ", %" AD ", %" BD            \
                         ", p, 1, 1;\n}\n"                                    \
                         : __VA_ARGS__                                        \
                         : "l"(da), "l"(db), "r"(acc));                       \
        }                                                                     \
        static __device__ __forceinline__ void run_ra(float *d,               \
                                                      const unsigned *a,      \
                                                      kw_u64 db, int acc)     \
        {                                                                     \
            asm volatile("{\n.reg .pred p;\nsetp.ne.b32 p, %" PR ", 0;\n"     \
                         "wgmma.mma_async.sync.aligned.m64n" #N               \
                         "k32.f32.e4m3.e4m3 " DL ", " AR ", %" BR             \
                         ", p, 1, 1;\n}\n"                                    \
                         : __VA_ARGS__                                        \
                         : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]),        \
                           "l"(db), "r"(acc));                                \
        }                                                                     \
    };
template <int N> struct il_wgmma;
IL_WGMMA_N(16,
           "{%0,%1,%2,%3,%4,%5,%6,%7}",
           "10", "8", "9", "13", "{%8,%9,%10,%11}", "12", IL_F8(0))
IL_WGMMA_N(32,
           "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15}",
           "18", "16", "17", "21", "{%16,%17,%18,%19}", "20", IL_F16(0))
IL_WGMMA_N(64,
           "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,"
           "%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31}",
           "34", "32", "33", "37", "{%32,%33,%34,%35}", "36", IL_F32(0))
IL_WGMMA_N(128,
           "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,"
           "%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
           "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,"
           "%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,"
           "%62,%63}",
           "66", "64", "65", "69", "{%64,%65,%66,%67}", "68", IL_F64(0))
IL_WGMMA_N(256,
           "{%0,%1,%2,%3,%4,%5,%6,%7,%8,%9,%10,%11,%12,%13,%14,%15,%16,"
           "%17,%18,%19,%20,%21,%22,%23,%24,%25,%26,%27,%28,%29,%30,%31,"
           "%32,%33,%34,%35,%36,%37,%38,%39,%40,%41,%42,%43,%44,%45,%46,"
           "%47,%48,%49,%50,%51,%52,%53,%54,%55,%56,%57,%58,%59,%60,%61,"
           "%62,%63,%64,%65,%66,%67,%68,%69,%70,%71,%72,%73,%74,%75,%76,"
           "%77,%78,%79,%80,%81,%82,%83,%84,%85,%86,%87,%88,%89,%90,%91,"
           "%92,%93,%94,%95,%96,%97,%98,%99,%100,%101,%102,%103,%104,%105,"
           "%106,%107,%108,%109,%110,%111,%112,%113,%114,%115,%116,%117,"
           "%118,%119,%120,%121,%122,%123,%124,%125,%126,%127}",
           "130", "128", "129", "133", "{%128,%129,%130,%131}", "132", IL_F128(0))
#undef IL_WGMMA_N
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

#if IL_WGMMA
/* NW 4-byte words from shared address a (16-byte aligned when NW is a
 * multiple of 4, else 8). */
template <int NW>
__device__ __forceinline__ void il_lds(unsigned *r, unsigned a)
{
    if constexpr (NW % 4 == 0) {
#pragma unroll
        for (int i = 0; i < NW / 4; i++)
            asm volatile("ld.shared.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                         : "=r"(r[4 * i]), "=r"(r[4 * i + 1]),
                           "=r"(r[4 * i + 2]), "=r"(r[4 * i + 3])
                         : "r"(a + 16 * i) : "memory");
    } else {
#pragma unroll
        for (int i = 0; i < NW / 2; i++)
            asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n"
                         : "=r"(r[2 * i]), "=r"(r[2 * i + 1])
                         : "r"(a + 8 * i) : "memory");
    }
}

/* mbarrier at shared address bar: init, the arrival that announces the
 * phase's bytes, and a wait for a phase. */
__device__ __forceinline__ void il_bar_init(unsigned bar, unsigned count)
{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar),
                 "r"(count) : "memory");
}

/* An arrival on bar once this thread's earlier cp.async copies are done
 * (counted in the barrier's init count). */
__device__ __forceinline__ void il_cp_arrive(unsigned bar)
{
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n"
                 ::"r"(bar) : "memory");
}

/* A plain arrival on bar (release: this thread's earlier reads of what
 * the barrier guards are done). */
__device__ __forceinline__ void il_bar_arrive(unsigned bar)
{
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar)
                 : "memory");
}

__device__ __forceinline__ void il_expect_tx(unsigned bar, unsigned bytes)
{
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n"
                 ::"r"(bar), "r"(bytes) : "memory");
}

__device__ __forceinline__ void il_bar_wait(unsigned bar, unsigned phase)
{
    unsigned done = 0;
    while (!done)
        asm volatile("{\n.reg .pred p;\n"
                     "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                     "selp.u32 %0, 1, 0, p;\n}\n"
                     : "=r"(done) : "r"(bar), "r"(phase) : "memory");
}

/* 1-D bulk copy of bytes (a multiple of 16) from global src to shared
 * dst (both 16-byte aligned), completing on mbarrier bar. */
__device__ __forceinline__ void il_bulk(unsigned dst, const void *src,
                                        unsigned bytes, unsigned bar)
{
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx"
                 "::bytes [%0], [%1], %2, [%3];\n"
                 ::"r"(dst), "l"(src), "r"(bytes), "r"(bar) : "memory");
}
#endif

/* This thread's warpgroup (128 threads) and its index in it. */
__device__ __forceinline__ int il_wg() { return (int)threadIdx.x >> 7; }
__device__ __forceinline__ int il_wt() { return (int)threadIdx.x & 127; }

/* This warpgroup's barrier (ids 1 to 4; 0 is __syncthreads). */
__device__ __forceinline__ void il_wg_sync()
{
    asm volatile("bar.sync %0, 128;\n" ::"r"(1 + il_wg()) : "memory");
}

/* The GEMM of the 64-row K tile at ka (generic kt) against N query
 * columns at qa (generic qs) into acc: wgmma on sm_90a, mma.sync
 * elsewhere. */
template <int N, int D>
__device__ __forceinline__ void il_mma(unsigned ka, unsigned qa,
                                       const kw_u8 *kt, const kw_u8 *qs,
                                       float *acc)
{
#if IL_WGMMA
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < D / 32; kk++)
        il_wgmma<N>::run(acc, il_desc(ka + kk * 256, 8 * D),
                         il_desc(qa + kk * 256, 8 * D), kk > 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
    /* The accumulators are read only after the wait. */
#pragma unroll
    for (int j = 0; j < N / 2; j++)
        asm volatile("" : "+f"(acc[j])::"memory");
#else
#pragma unroll
    for (int j = 0; j < N / 2; j++)
        acc[j] = 0.0f;
    il_mma_warp<N, D>(acc, kt, qs, 16 * ((threadIdx.x >> 5) & 3));
#endif
}

#if IL_WGMMA
/* il_mma on sm_90a in two halves, from the descriptors of the K tile and
 * of the queries: k-step kk is KS * 16 bytes further, KS added to a
 * descriptor (il_desc: 256 bytes, KS 16; il_desc_sw: 32 bytes, KS 2;
 * shared addresses stay below 256 KiB, so the sum stays in the address
 * field).  il_mma_wait: after it the accumulators are read. */
template <int N, int D, int KS>
__device__ __forceinline__ void il_mma_issue(kw_u64 kd, kw_u64 qd, float *acc)
{
    asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
    for (int kk = 0; kk < D / 32; kk++)
        il_wgmma<N>::run(acc, kd + kk * KS, qd + kk * KS, kk > 0);
    asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

template <int N>
__device__ __forceinline__ void il_mma_wait(float *acc)
{
    asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
#pragma unroll
    for (int j = 0; j < N / 2; j++)
        asm volatile("" : "+f"(acc[j])::"memory");
}
#endif

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

#endif /* KW_K_IL_PTX_CUH */
