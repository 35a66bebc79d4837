/* indexer_logits.cu: the lightning indexer's fp8 multi-query logits
 * (spec/kernels.md, indexer_logits).  Device code only.
 *
 * Template parameters are the key's fields: HEADS, HEAD_DIM, PAGED,
 * PAGE_ROWS, NEXT_N.  One block (il_threads(): NWG warpgroups of 128
 * threads; dynamic shared memory of il_smem_bytes()) scores QB queries
 * against tiles of 64 K rows, each warpgroup QW of them (NW = QW * HP
 * GEMM columns):
 *
 *   S[n][q*HP + h] = sum_d k[n][d] * q[q][h][d]      (a 64 x NW GEMM)
 *   logits[q][n]   = k_scale[n] * sum_h w[q][h] * relu(S[n][q*HP + h])
 *
 * The K rows are the GEMM's M side, so the head sum of one (row, query)
 * lives in one quad of lanes: each thread folds its own columns, then the
 * quad sums its 2 QW partial sums in a reduce-scatter (il_quad: two
 * shuffle steps, each lane sending the half it does not keep), and each
 * lane writes its share, its queries' windows held in registers; no row
 * ever crosses a warp.  This epilogue, shared by prefill and decode, took
 * prefill from 500 to 585 TFLOP/s and next_n 2 decode from 0.49 to 0.44
 * ms on the H200 (before: a shuffle per value and step, four predicated
 * stores, the windows read from shared memory on every tile).  HP is the
 * head count rounded up to a power of two (at least 16); NW is 128 (256
 * for 256 heads; less for a decode key with fewer queries), so the
 * accumulators leave room for four warpgroups per SM (two blocks of two,
 * or one of four).  Padded heads and queries hold zero bytes and zero
 * weights.
 *
 * Decode: two warpgroups, both on the block's QB queries (QW = QB), each
 * its own pipeline over every other tile (its own 1-4 stages, barriers),
 * so one warpgroup's epilogue overlaps the other's tensor-core work.
 * Prefill: il_nwg() warpgroups (4 when NW is 128 and 4 stages fit, else
 * 2), each its own QW queries, all GEMMing every tile of the block's
 * union window.  On sm_90a they share the tiles (il_loop::run_shared), so
 * K crosses from L2 to shared memory once per QB queries (8 for 64
 * heads, against 2 before): bound by that traffic, prefill went from 7.4
 * to 5.0-5.2 ms (0.42 to 0.60-0.63 of torch._scaled_mm) on the H200; 2
 * warpgroups sharing (QB 4): 5.75 ms.  Copying each tile with one warp
 * in turn and the wgmma descriptors computed once took 25% of the loop's
 * instructions away but only about 2% of its time (4.87-5.05 ms): the
 * loop is bound by latency, not issue slots (Nsight Compute: 59% busy
 * before, 45% after; tensor pipe 45% active).  Off sm_90a each warpgroup
 * pipelines its own copies of the tiles (il_loop::run).  Row scales
 * travel with their tile and decode pages are read one iteration ahead,
 * so no step waits on a dependent global load.  Shared memory holds the
 * block's queries (NQ = QB * HP columns x HEAD_DIM bytes), the stages and
 * the weights; queries and cp.async stages are in the no-swizzle "core
 * matrix" layout of wgmma (8 rows x 16 bytes contiguous, K-direction
 * neighbours 128 bytes apart, 8-row groups 8*HEAD_DIM apart), except on
 * the sm_90a prefill path at head_dim 128, where they are in its 128-byte
 * swizzle (IL_SWIZZLE, il_off_sw): same bits, 5-9% less time on the
 * H200, where Nsight Compute had seen kwarm's shared-memory throughput
 * at 70% for fewer bytes than DeepGEMM's swizzled tiles moved at 64%.
 *
 * How a stage is filled:
 *  - prefill on sm_90a (il_loop::run_shared): one warp per tile, the
 *    block's warps in turn (tile t: warp t % 16), copies its 16-byte
 *    chunks with cp.async into one of 2 S shared stages, completing on
 *    the stage's full mbarrier; each warp marks the stage empty when its
 *    wgmma is done.  All 512 threads copying one chunk each cost about 90
 *    instructions per warp and tile (a quarter of the loop's issue
 *    slots, Nsight Compute on the H200); in turn, about 13;
 *  - off sm_90a: each warpgroup's threads copy 16-byte chunks with
 *    cp.async into its own stages (il_loop::run);
 *  - decode on sm_90a (il_loop::run_tma): one warp per warpgroup issues
 *    1-D bulk copies (cp.async.bulk, one per run of rows inside a page,
 *    8 KiB for pages of 64 rows) and the rows' scales (4-byte cp.async),
 *    completing on the stage's mbarrier.  The tile lands row-major, which
 *    no wgmma shared-memory layout reads, so each thread loads its two
 *    rows' bytes into registers as wgmma's A operand; the queries are
 *    stored with their head_dim words permuted to match (the sum over
 *    head_dim does not depend on the order).  The producer warp issues
 *    its copies after the tile's wgmma, so they run under it rather than
 *    delay it for the whole warpgroup.  Per-thread cp.async of the decode
 *    tiles reached 0.45 of copy bandwidth; register loads straight from
 *    global memory 0.54 with nothing else in the loop.
 *
 * The tensor-core step has two forms with the same fragment layout (the
 * m16n8 accumulator order, 16 rows per warp):
 *  - sm_90a (__CUDA_ARCH_FEAT_SM90_ALL): wgmma.mma_async m64nNk32 e4m3,
 *    the queries (B) from shared memory, the K rows (A) from shared memory
 *    (run_shared) or registers (run_tma);
 *  - elsewhere: mma.sync m16n8k16 f16 (sm_80 and up; two m16n8k8 on
 *    sm_75) on the fp8 bytes converted to f16 (exact: every e4m3 value is
 *    an f16 value), each warp taking 16 rows.  Below sm_80, where there is
 *    no cp.async, the stages are filled with plain loads and stores.
 * Products of fp8 values are exact in fp32, so the paths differ from the
 * double-precision reference only in the order of summation.  The
 * device primitives (PTX wrappers, the MMA step) are in kw_k_il_ptx.cuh,
 * the epilogue (il_partial, il_quad, il_epilogue, il_fill) in
 * kw_k_il_fold.cuh.
 */

#include <cuda_fp16.h>

typedef unsigned long long kw_u64;
typedef unsigned char kw_u8;

#define IL_TILE 128
/* IL_SWIZZLE 1 (the default): the sm_90a prefill path (run_shared) keeps
 * its K stages and queries in wgmma's 128-byte swizzle (il_off_sw), for
 * head_dim 128; 0 (bench_indexer DIR -DIL_SWIZZLE=0, for experiments):
 * the no-swizzle core-matrix layout.  Same bits either way; on the H200
 * the swizzle took prefill 5-9% faster (docs/perf.md, "The indexer
 * against DeepGEMM"). */
#ifndef IL_SWIZZLE
#define IL_SWIZZLE 1
#endif
/* IL_REVERSE 1 (the default): prefill blocks take their query groups
 * last first (il_block_start); 0 (-DIL_REVERSE=0, for experiments): in
 * order.  Same bits; on the H200 the short causal and context-parallel
 * shapes took 4-7% less time (docs/perf.md, "Longest windows first"). */
#ifndef IL_REVERSE
#define IL_REVERSE 1
#endif
/* Tiles of a prefill part at least (grid y): 32 (2048 rows), with
 * launch/'s KW_LAUNCH_PREFILL_PART_ROWS 4096.  64 had left the long
 * context-parallel windows of 2048 queries x 8,192 rows at H 32 unsplit
 * (1.32x DeepGEMM's time; 1.08x at 32, docs/perf.md). */
#ifndef IL_PART_TILES
#define IL_PART_TILES 32
#endif
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

/* At most 128 GEMM columns per warpgroup (256 only for 256 heads), so
 * the 64 accumulators per thread leave room for four warpgroups per SM,
 * some in their epilogues while another keeps the tensor cores busy. */
__host__ __device__ constexpr int il_cols(int h)
{
    return il_hp(h) >= 256 ? 256 : 128;
}

__host__ __device__ constexpr int il_stages(int nq, int d)
{
    return (IL_SMEM_BUDGET - nq * d - nq * 4) / (IL_TILE * (d + 4)) < 1 ? 1
           : (IL_SMEM_BUDGET - nq * d - nq * 4) / (IL_TILE * (d + 4)) > 4
               ? 4
               : (IL_SMEM_BUDGET - nq * d - nq * 4) / (IL_TILE * (d + 4));
}

/* Warpgroups per block: prefill 4 when each takes 128 columns and
 * shared memory holds at least 4 shared stages of 64 rows beside their
 * queries, else 2 (decode: always 2). */
__host__ __device__ constexpr int il_nwg(int h, int d, bool paged)
{
    return !paged && il_cols(h) == 128 && il_stages(4 * 128, d) >= 2 ? 4 : 2;
}

__host__ __device__ constexpr int il_threads(int h, int d, bool paged)
{
    return 128 * il_nwg(h, d, paged);
}

/* Queries per block: prefill, il_nwg warpgroups' worth (each warpgroup
 * GEMMs its own il_cols columns against the block's shared K tiles). */
__host__ __device__ constexpr int il_qb(int h, int d, bool paged, int next_n)
{
    return !paged ? il_nwg(h, d, paged) * il_cols(h) / il_hp(h)
           : il_pow2floor(next_n) < il_cols(h) / il_hp(h)
               ? il_pow2floor(next_n)
               : il_cols(h) / il_hp(h);
}

/* Queries, then the K stages, then the stages' row scales, then weights. */
__host__ __device__ constexpr int il_smem_bytes(int nq, int d)
{
    return nq * d + il_stages(nq, d) * IL_TILE * (d + 4) + nq * 4;
}

#include "kw_k_il_ptx.cuh"

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

/* The first of the two tile rows (r, r + 8) this thread's accumulators
 * hold: 16 rows per warp, lane group g. */
__device__ __forceinline__ int il_row16()
{
    return 16 * (((int)threadIdx.x >> 5) & 3) + (((int)threadIdx.x & 31) >> 2);
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

/* The block's queries and weights into shared memory (zero padding).
 * PERM (the bulk-copy decode path, il_loop::run_tma): the 4-byte word
 * w = tq * C + c of a query row (C = D / 16 chunks) goes to word tq of GEMM
 * k-chunk c, the order in which run_tma's threads hold the K rows; the
 * head_dim sum does not depend on the order. */
template <int H, int D, int HP, int NQ, bool PERM, bool SWZ, int NT>
__device__ __forceinline__ void il_load_queries(kw_u8 *qs, float *ws,
                                                const kw_u8 *__restrict__ q,
                                                const float *__restrict__ w,
                                                long long qrow0, int nq)
{
    constexpr int C = D / 16;
    for (int idx = threadIdx.x; idx < NQ * C; idx += NT) {
        int col = idx / C, c = idx % C, qq = col / HP, h = col % HP;
        uint4 v = make_uint4(0, 0, 0, 0);
        if (qq < nq && h < H)
            v = *(const uint4 *)(q + ((qrow0 + qq) * H + h) * D + c * 16);
        if (PERM) {
            const unsigned x[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
            for (int i = 0; i < 4; i++) {
                const int wd = 4 * c + i;
                *(unsigned *)(qs + il_off(col, wd % C, D) + 4 * (wd / C)) = x[i];
            }
        } else {
            *(uint4 *)(qs + (SWZ ? il_off_sw(col, c) : il_off(col, c, D))) = v;
        }
    }
    for (int col = threadIdx.x; col < NQ; col += NT) {
        int qq = col / HP, h = col % HP;
        ws[col] = qq < nq && h < H ? w[(qrow0 + qq) * H + h] : 0.0f;
    }
}

#include "kw_k_il_fold.cuh"

/* Shared-memory layout: queries, then each warpgroup's S stages of K
 * rows, then their row scales, then the weights.  NW < NQ (prefill): each
 * warpgroup GEMMs its own NW of the NQ query columns (qs, qa and ws point
 * at them); k0, s0 and sc0 are the first stage of warpgroup 0, where
 * il_loop::run_shared's 2 S shared stages start. */
template <int D, int NQ, int NW, int S, int SW>
struct il_smem_map {
    unsigned qa, kbase, sbase, k0, s0; /* shared addresses */
    const kw_u8 *qs, *kbytes;
    float *ws;
    const float *scs, *sc0;

    __device__ __forceinline__ il_smem_map(kw_u8 *base)
    {
        const int w = il_wg(), c = NW < NQ ? w * NW : 0;
        qs = base + c * D;
        kbytes = base + NQ * D + w * SW * IL_ROWS * D;
        sc0 = (const float *)(base + NQ * D + S * IL_TILE * D);
        scs = sc0 + w * SW * IL_ROWS;
        ws = (float *)(base + NQ * D + S * IL_TILE * (D + 4)) + c;
        const unsigned a = (unsigned)__cvta_generic_to_shared(base);
        qa = a + c * D;
        k0 = a + NQ * D;
        kbase = k0 + w * SW * IL_ROWS * D;
        s0 = k0 + S * IL_TILE * D;
        sbase = s0 + w * SW * IL_ROWS * 4;
    }
};

/* One warpgroup's tile loop: its tiles are t(j) = tlo + (2j + w) * tstep
 * in units of 64 rows (decode), or t(j) = tlo + j (prefill: every tile of
 * the block, for this warpgroup's queries), j < nt. */
template <int H, int D, bool PAGED, int PR, int NEXT_N>
struct il_loop {
    static constexpr int HP = il_hp(H), QB = il_qb(H, D, PAGED, NEXT_N);
    static constexpr int NWG = il_nwg(H, D, PAGED), NT = 128 * NWG;
    /* Prefill splits the block's queries between the warpgroups: QW of
     * them (NW GEMM columns) each. */
    static constexpr int QW = PAGED ? QB : QB / NWG, NQ = QB * HP, NW = QW * HP;
    /* Shared stages: 2 S of 64 rows; run() gives each warpgroup SW. */
    static constexpr int S = il_stages(NQ, D), SW = 2 * S / NWG;
    static constexpr int PP = PR > 0 ? PR : 1; /* page rows (decode) */
    /* Prefill stages and queries in the 128-byte swizzle (IL_SWIZZLE). */
    static constexpr bool SWZ = IL_WGMMA && IL_SWIZZLE && !PAGED && D == 128;
    il_smem_map<D, NQ, NW, S, SW> m;
    il_block<QW> bk; /* this warpgroup's queries */
    const int *lo, *hi;
    int tlo, tstep, nt;
    const kw_u8 *k;
    const float *ksc;
    const int *bt;
    float *out;

    __device__ __forceinline__ il_loop(kw_u8 *base) : m(base) {}

    __device__ __forceinline__ int tile(int j) const
    {
        return PAGED ? tlo + (2 * j + il_wg()) * tstep : tlo + j;
    }

    __device__ __forceinline__ void load(int j, const il_pages<D, PR> &pg)
    {
        const int st = j % SW;
        il_load_tile<D, PAGED, PR>(m.kbase + st * IL_ROWS * D,
                                   m.sbase + st * IL_ROWS * 4, tile(j),
                                   bk.hi, k, ksc, pg);
    }

    __device__ __forceinline__ void pages(int j, il_pages<D, PR> &pg)
    {
        if (PAGED && j < nt)
            pg.fetch(tile(j), bk.hi, bt);
    }

    /* Prefetch distance SW - 1 tiles; the pages of a tile are read one
     * iteration before its copies are issued. */
    __device__ __forceinline__ void run()
    {
        il_pages<D, PR> pg;
        const il_quad<QW> lq(bk, lo, hi);
        float acc[NW / 2];
        for (int s = 0; s < SW - 1; s++) {
            pages(s, pg);
            if (s < nt)
                load(s, pg);
            il_cp_commit();
        }
        pages(SW - 1, pg);
#pragma unroll 1
        for (int j = 0; j < nt; j++) {
            if (j + SW - 1 < nt)
                load(j + SW - 1, pg);
            il_cp_commit();
            pages(j + SW, pg);
            il_arrive<SW - 1>();
            il_mma<NW, D>(m.kbase + (j % SW) * IL_ROWS * D, m.qa,
                          m.kbytes + (j % SW) * IL_ROWS * D, m.qs, acc);
            il_epilogue<HP, QW>(acc, m.ws, bk, lq, tile(j),
                                m.scs + (j % SW) * IL_ROWS, out);
            il_wg_sync(); /* stage j % SW is free for tile j + SW */
        }
    }

#if IL_WGMMA
    /* mma_regs commits the NQ columns in G groups of NG (two of 16 or 32
     * for 32 or 64 columns, where the fold of one group overlaps the
     * next's tensor-core work; measured slower at 128 columns). */
    static constexpr int G = NQ == 32 || NQ == 64 ? 2 : 1, NG = NQ / G;

    /* il_epilogue for run_tma: waits for each commit group of mma_regs in
     * turn and folds its columns while the later ones run. */
    __device__ __forceinline__ void fold(float *acc, int t, float sc0,
                                         float sc1, const il_quad<QB> &lq) const
    {
        float v[2 * QB] = {};
#pragma unroll
        for (int g = 0; g < G; g++) {
            if (g == 0 && G > 1)
                asm volatile("wgmma.wait_group.sync.aligned 1;\n" ::: "memory");
            else
                asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory");
            /* The group's accumulators are read only after the wait. */
#pragma unroll
            for (int i = 0; i < NG / 2; i++)
                asm volatile("" : "+f"(acc[g * NG / 2 + i])::"memory");
            il_partial<HP>(v, acc, m.ws, g * NG / 8, (g + 1) * NG / 8);
        }
        lq.write(v, bk, t * IL_ROWS + il_row16(), sc0, sc1, out);
    }

    /* Decode on sm_90a (run_tma): warp 0 of the warpgroup fetches each
     * 64-row K tile into a stage with 1-D bulk copies (one per run of rows
     * inside a page: one 8 KiB copy for pages of 64 rows), completing on
     * the stage's mbarrier; no thread copies K bytes.  Each thread then
     * reads bytes [tq D/4, (tq + 1) D/4) of tile rows r and r + 8
     * (il_row16) into registers, wgmma's A operand; the queries were
     * stored permuted to match (il_load_queries, PERM).  Rows at or past
     * the window are not fetched, and the epilogue writes -inf there. */
    __device__ __forceinline__ void issue(int j, int st, unsigned bar,
                                          const int (&pg)[2]) const
    {
        const int lane = threadIdx.x & 31, row0 = tile(j) * IL_ROWS;
        const int nv = min(max(bk.hi - row0, 0), IL_ROWS);
        const unsigned dst = m.kbase + st * IL_ROWS * D;
        if (lane == 0)
            il_expect_tx(bar, (unsigned)(nv * D));
#pragma unroll
        for (int e = 0; e < 2; e++) {
            const int r = lane + 32 * e, slot = (row0 + r) % PP;
            const long long at = (long long)pg[e] * PP + slot;
            if (r < nv && (r == 0 || slot == 0))
                il_bulk(dst + r * D, k + at * D,
                        (unsigned)(min(PP - slot, nv - r) * D), bar);
            if (r < nv)
                il_cp4(m.sbase + (st * IL_ROWS + r) * 4, ksc + at, true);
        }
        il_cp_arrive(bar);
    }

    /* Pages of the rows this lane issues (lane, lane + 32) of tile j. */
    __device__ __forceinline__ void issue_pages(int j, int (&pg)[2]) const
    {
        const int row = tile(j) * IL_ROWS + (threadIdx.x & 31);
#pragma unroll
        for (int e = 0; e < 2; e++)
            pg[e] = j < nt && row + 32 * e < bk.hi
                        ? __ldg(bt + (row + 32 * e) / PP) : 0;
    }

    /* The GEMM of one tile with A (this thread's K words kr) from
     * registers: kr[2s], kr[2s + 1] of row r and the same of row r + 8
     * are k-step s's fragment; the columns go in G commit groups.  qd is
     * il_desc of the queries. */
    __device__ __forceinline__ void mma_regs(const unsigned *kr, kw_u64 qd,
                                             float *acc) const
    {
        constexpr int NW = D / 16;
        asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory");
#pragma unroll
        for (int g = 0; g < G; g++) {
#pragma unroll
            for (int s = 0; s < D / 32; s++) {
                const unsigned a[4] = {kr[2 * s], kr[NW + 2 * s],
                                       kr[2 * s + 1], kr[NW + 2 * s + 1]};
                il_wgmma<NG>::run_ra(acc + g * NG / 2, a,
                                     qd + ((g * NG * D + s * 256) >> 4),
                                     s > 0);
            }
            asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory");
        }
    }

    __device__ __forceinline__ void run_tma(const unsigned bar0)
    {
        constexpr int NW = D / 16;
        const bool producer = (il_wt() >> 5) == 0;
        const int tq = threadIdx.x & 3, rl = il_row16();
        const kw_u64 qd = il_desc(m.qa, 8 * D);
        const il_quad<QB> lq(bk, lo, hi);
        int pg[2];
        unsigned kr[2 * NW];
        float acc[NQ / 2];
        if (producer) {
            for (int s = 0; s < S; s++) {
                issue_pages(s, pg);
                if (s < nt)
                    issue(s, s, bar0 + 8 * s, pg);
            }
            issue_pages(S, pg);
            __syncwarp();
        }
#pragma unroll 1
        for (int j = 0; j < nt; j++) {
            const int st = j % S;
            il_bar_wait(bar0 + 8 * st, (unsigned)(j / S) & 1u);
            const unsigned src = m.kbase + st * IL_ROWS * D + tq * (D / 4);
#pragma unroll
            for (int e = 0; e < 2; e++)
                il_lds<NW>(kr + e * NW, src + (rl + 8 * e) * D);
            const float *sc = m.scs + st * IL_ROWS + rl;
            const float sc0 = sc[0], sc1 = sc[8];
            il_wg_sync(); /* stage st is read: refill it with tile j + S */
            mma_regs(kr, qd, acc); /* first: the copies below run under it */
            if (producer && j + S < nt) {
                issue(j + S, st, bar0 + 8 * st, pg);
                issue_pages(j + S + 1, pg);
            }
            __syncwarp();
            fold(acc, tile(j), sc0, sc1, lq);
        }
    }
    /* Prefill on sm_90a (run_shared): every warpgroup GEMMs every tile of
     * the block, each against its own queries, from 2 S shared stages.
     * Warp t % (NT / 32) copies tile t (16-byte cp.async at stage offset
     * 16 idx, idx = lane + 32 i: row 8 (idx / 8 / C) + idx % 8, chunk
     * idx / 8 % C, so each copy instruction writes whole 128-byte lines);
     * one iteration later it waits for them, fences them into the async
     * proxy and its lanes arrive on the stage's full barrier (count 32),
     * so one warp fences per tile, not every thread (release_shared).
     * Lane 0 of each warp arrives on its empty barrier once the warp's
     * wgmma is done (count NT / 32); only the copying warp waits for the
     * stage to be empty.  H200, 4096 x 65536 causal, same process: the
     * fence moved 5.44 -> 5.29 ms, the weights in registers 5.29 -> 5.10
     * (they were 16 LDS.64 per thread and tile beside the wgmma's own
     * shared-memory reads). */
    static constexpr int SS = 2 * S, PD = SS > 3 ? SS - 2 : SS - 1;

    __device__ __forceinline__ void issue_shared(int j) const
    {
        constexpr int C = D / 16;
        const int lane = threadIdx.x & 31, st = j % SS, row0 = tile(j) * IL_ROWS;
        const unsigned dst = m.k0 + st * IL_ROWS * D;
        const kw_u8 *kt = k + (long long)row0 * D;
        if constexpr (SWZ) {
            /* 8 lanes a row, 4 whole rows (512 bytes) per instruction:
             * copy i takes row lane / 8 + 4 i, whose slot depends on
             * lane and i % 2 only (il_off_sw). */
            const int r = lane >> 3;
            const unsigned d0 = dst + il_off_sw(r, lane & 7);
            const unsigned d1 = dst + il_off_sw(r + 4, lane & 7) - 512;
#pragma unroll
            for (int i = 0; i < IL_ROWS / 4; i++) {
                const bool v = row0 + r + 4 * i < bk.hi;
                il_cp16((i & 1 ? d1 : d0) + 512 * i,
                        v ? kt + 16 * lane + 512 * i : k, v);
            }
        } else {
#pragma unroll
            for (int i = 0; i < IL_ROWS * C / 32; i++) {
                const int idx = lane + 32 * i, r = 8 * (idx / 8 / C) + idx % 8;
                const bool v = row0 + r < bk.hi;
                il_cp16(dst + 16 * idx, v ? kt + r * D + idx / 8 % C * 16 : k,
                        v);
            }
        }
#pragma unroll
        for (int e = 0; e < IL_ROWS / 32; e++) {
            const int r = lane + 32 * e;
            il_cp4(m.s0 + (st * IL_ROWS + r) * 4,
                   row0 + r < bk.hi ? ksc + row0 + r : ksc, row0 + r < bk.hi);
        }
        il_cp_commit();
    }

    __device__ __forceinline__ void release_shared(int j, unsigned full) const
    {
        il_cp_wait<0>();
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
        il_bar_arrive(full + 8 * (j % SS));
    }

    /* Loop indices [*j0, *j1) of the tiles inside every window of this
     * warpgroup's queries and below the column limit: their scores are
     * written without a per-score check (il_quad::write_inside); the
     * boundary tiles take il_quad::write, whose windows come from shared
     * memory, so no window stays in a register across the loop. */
    __device__ __forceinline__ void inside(int *j0, int *j1) const
    {
        int a = 0, b = bk.limit;
        for (int qq = 0; qq < bk.nq; qq++) {
            a = max(a, lo[qq]);
            b = min(b, hi[qq]);
        }
        *j0 = (a + IL_ROWS - 1) / IL_ROWS - tlo;
        *j1 = bk.nq == QW ? b / IL_ROWS - tlo : 0;
    }

    /* Prefetch distance PD < SS tiles: tile j + PD refills the stage of
     * tile j + PD - SS, so a warpgroup waits for the others only when it
     * runs SS - PD tiles ahead of one. */
    __device__ __forceinline__ void run_shared(unsigned full, unsigned empty)
    {
        const int warp = (int)threadIdx.x >> 5;
        /* The descriptors of stage 0 and of the queries, and the barrier
         * addresses, are computed once, not in every iteration (the empty
         * asm keeps the compiler from recomputing the addresses). */
        const kw_u64 kd = SWZ ? il_desc_sw(m.k0) : il_desc(m.k0, 8 * D);
        const kw_u64 qd = SWZ ? il_desc_sw(m.qa) : il_desc(m.qa, 8 * D);
        asm("" : "+r"(full), "+r"(empty));
        float acc[NW / 2];
        float2 wr[NW / 8]; /* this thread's head weights */
#pragma unroll
        for (int j = 0; j < NW / 8; j++)
            wr[j] = *(const float2 *)(m.ws + 8 * j + 2 * (threadIdx.x & 3));
        int j0, j1;
        inside(&j0, &j1);
        for (int j = warp; j < PD && j < nt; j += NT / 32) {
            issue_shared(j);
            release_shared(j, full);
        }
        int pend = -1; /* tile this warp copied and has not released */
#pragma unroll 1
        for (int j = 0; j < nt; j++) {
            const int st = j % SS, jn = j + PD;
            if (pend >= 0) {
                release_shared(pend, full);
                pend = -1;
            }
            if (jn < nt && jn % (NT / 32) == warp) {
                if (jn >= SS)
                    il_bar_wait(empty + 8 * (jn % SS), (jn / SS - 1) & 1u);
                issue_shared(jn);
                pend = jn;
            }
            il_bar_wait(full + 8 * st, (unsigned)(j / SS) & 1u);
            il_mma_issue<NW, D, SWZ ? 2 : 16>(kd + st * (IL_ROWS * D >> 4), qd,
                                              acc);
            il_mma_wait<NW>(acc);
            const float *sc = m.sc0 + st * IL_ROWS + il_row16();
            const float sc0 = sc[0], sc1 = sc[8];
            __syncwarp();
            if ((threadIdx.x & 31) == 0)
                il_bar_arrive(empty + 8 * st);
            float v[2 * QW] = {};
            il_partial_r<HP>(v, acc, wr);
            const int r0 = tile(j) * IL_ROWS + il_row16();
            if (j >= j0 && j < j1) {
                il_quad<QW>::write_inside(v, bk, r0, sc0, sc1, out);
            } else {
                const il_quad<QW> lq(bk, lo, hi);
                lq.write(v, bk, r0, sc0, sc1, out);
            }
        }
    }
#endif

    /* The mbarriers (sm_90a; bars[2][NB]): decode, each warpgroup's S
     * stage barriers (bars[w]); prefill, the 2 S shared stages' full
     * (bars[0]) and empty (bars[1]) barriers.  Returns the shared address
     * of bars[w] (decode: this warpgroup's). */
    static constexpr int NB = PAGED ? S : 2 * S;

    __device__ __forceinline__ unsigned init_bars(kw_u64 (*bars)[NB]) const
    {
        const unsigned b = (unsigned)__cvta_generic_to_shared(
            bars[PAGED ? il_wg() : il_wg() & 1]);
#if IL_WGMMA
        if ((PAGED || il_wg() < 2) && il_wt() < NB)
            il_bar_init(b + 8 * il_wt(), PAGED ? 33 /* expect_tx + 32 lanes */
                                         : il_wg() ? NT / 32 : 32);
        asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
        asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
        return b;
    }

    /* Runs the tile loop; bar: init_bars()'s address. */
    __device__ __forceinline__ void go(unsigned bar, kw_u64 (*bars)[NB])
    {
#if IL_WGMMA
        if constexpr (PAGED)
            run_tma(bar);
        else
            run_shared((unsigned)__cvta_generic_to_shared(bars[0]),
                       (unsigned)__cvta_generic_to_shared(bars[1]));
#else
        run();
#endif
    }
};

/* Blocks per SM the registers are capped for: two for 128 GEMM columns
 * (one in its epilogue while the other keeps the tensor cores busy), one
 * for 256 or for four warpgroups; three for the sm_90a decode path at 64
 * columns or fewer, whose K rows need no registers beyond one tile
 * (shared memory then decides). */
__host__ __device__ constexpr int il_min_blocks(int h, int d, bool paged,
                                               int nn)
{
    return IL_WGMMA && paged && il_qb(h, d, paged, nn) * il_hp(h) <= 64 ? 3
           : il_nwg(h, d, paged) == 4 ? 1
           : (paged ? il_qb(h, d, paged, nn) * il_hp(h) : il_cols(h)) <= 128
               ? 2
               : 1;
}

/* Fills bk's rows and limits from the launch (prefill: blockIdx.x is the
 * query group; decode: blockIdx.y the request, blockIdx.z the query
 * group) and the block's query windows lo/hi (shared; decode windows
 * start at 0).  Returns the block table of the block's request (decode),
 * else ia. */
template <int QB, bool PAGED, int NEXT_N>
__device__ __forceinline__ const int *il_block_start(
    il_block<QB> &bk, const int *__restrict__ ia, const int *__restrict__ ib,
    int x, int y, int z, int *lo, int *hi)
{
    const int *bt = ia;
    if (PAGED) {
        const int b = blockIdx.y, q0 = blockIdx.z * QB;
        bk.nq = NEXT_N - q0 < QB ? NEXT_N - q0 : QB;
        bk.row0 = b * NEXT_N + q0;
        bk.limit = z;
        bk.stride = z;
        bt = ia + (long long)b * y;
    } else {
        /* IL_REVERSE: the last query group first.  Causal windows grow
         * with the query, and the SMs take blocks in blockIdx order, so
         * the longest blocks start first and the shortest fill the tail
         * (longest processing time first). */
        bk.row0 = (IL_REVERSE ? gridDim.x - 1 - blockIdx.x : blockIdx.x) * QB;
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
    return bt;
}

/* The union of the block's non-empty query windows ([0, 0) if none). */
template <int QB>
__device__ __forceinline__ void il_block_union(il_block<QB> &bk,
                                               const int *lo, const int *hi)
{
    bk.lo = 0x7fffffff;
    bk.hi = 0;
    for (int qq = 0; qq < bk.nq; qq++)
        if (lo[qq] < hi[qq]) {
            bk.lo = min(bk.lo, lo[qq]);
            bk.hi = max(bk.hi, hi[qq]);
        }
    if (bk.hi == 0)
        bk.lo = 0;
}

/* Parts a prefill block's union window is split into over grid y: one
 * per IL_PART_TILES tiles, at least 1, at most gridDim.y. */
template <int QB>
__device__ __forceinline__ int il_parts(const il_block<QB> &bk)
{
    const int n = (bk.hi + IL_ROWS - 1) / IL_ROWS - bk.lo / IL_ROWS;
    return max(1, min((int)gridDim.y, n / IL_PART_TILES));
}

/* Entry point.  Prefill: (q, w, k, k_scale, ks, ke, num_rows, num_k,
 * stride, logits); decode: (q, w, k_pages, k_scale_pages, block_table,
 * row_end, num_reqs, width, max_rows, logits); see kw_kernels.h. */
template <int H, int D, bool PAGED, int PR, int NEXT_N>
__global__ void __launch_bounds__(il_threads(H, D, PAGED),
                                  il_min_blocks(H, D, PAGED, NEXT_N))
    kw_k_indexer_logits(
    const kw_u8 *__restrict__ q, const float *__restrict__ w,
    const kw_u8 *__restrict__ k, const float *__restrict__ ksc,
    const int *__restrict__ ia, const int *__restrict__ ib, int x, int y,
    int z, float *__restrict__ out)
{
    typedef il_loop<H, D, PAGED, PR, NEXT_N> L;
    constexpr int HP = L::HP, QB = L::QB, NQ = L::NQ, QW = L::QW;
    static_assert(D % 32 == 0 && L::NW <= 256, "key outside the family");
    /* The stage barriers count on every warpgroup: with fewer threads
     * than kw_k_block_threads() the block would wait forever. */
    if (blockDim.x != L::NT)
        __trap();
    /* The swizzle is of address bits: its tiles start 1024-aligned.  Only
     * the swizzled keys ask for it, since the padding it puts before the
     * dynamic shared memory (up to 1 KiB) would cost a decode SM its
     * third block. */
    kw_u8 *il_smem;
    if constexpr (L::SWZ) {
        extern __shared__ __align__(1024) kw_u8 il_smem_sw[];
        il_smem = il_smem_sw;
        if (__cvta_generic_to_shared(il_smem) & 1023u)
            __trap();
    } else {
        extern __shared__ __align__(128) kw_u8 il_smem_ns[];
        il_smem = il_smem_ns;
    }
    __shared__ int lo[QB], hi[QB];
    L lp(il_smem);
    il_block<QB> bk;
    lp.bt = il_block_start<QB, PAGED, NEXT_N>(bk, ia, ib, x, y, z, lo, hi);
    /* A prefill block past its window's parts (grid y, below) fills its
     * share and leaves before loading anything: it holds an SM's shared
     * memory, and a grid of such blocks would queue on the few SMs the
     * working blocks leave free. */
    if (!PAGED && gridDim.y > 1) {
        __syncthreads();
        il_block_union(bk, lo, hi);
        if ((int)blockIdx.y >= il_parts(bk)) {
            il_fill_part<QB, L::NT>(bk, bk.lo / IL_ROWS * IL_ROWS,
                                    (bk.hi + IL_ROWS - 1) / IL_ROWS * IL_ROWS,
                                    (int)blockIdx.y, (int)gridDim.y, out);
            return;
        }
    }
    constexpr bool TMA = IL_WGMMA && PAGED;
    il_load_queries<H, D, HP, NQ, TMA, L::SWZ, L::NT>(
        il_smem, (float *)(il_smem + NQ * D + L::S * IL_TILE * (D + 4)), q, w,
        bk.row0, bk.nq);
    __shared__ __align__(8) kw_u64 il_bars[2][L::NB];
    const unsigned bar = lp.init_bars(il_bars);
    __syncthreads();
    il_block_union(bk, lo, hi);
    /* Tiles of 64 rows: decode blocks stride over them (any grid), a
     * prefill block covers its queries' union window. */
    const int thi = (bk.hi + IL_ROWS - 1) / IL_ROWS;
    int first, count;
    if (PAGED) {
        lp.tlo = blockIdx.x;
        lp.tstep = gridDim.x;
        count = lp.tlo < thi ? (thi - lp.tlo + lp.tstep - 1) / lp.tstep : 0;
        const int tend = (bk.limit + IL_ROWS - 1) / IL_ROWS;
        for (int t = lp.tlo + count * lp.tstep; t < tend; t += lp.tstep)
            il_fill<QB, L::NT>(bk, t * IL_ROWS, (t + 1) * IL_ROWS, out);
    } else {
        /* Grid y (launch/'s prefill split, for grids under one wave):
         * the columns outside the union window are filled in gridDim.y
         * near-equal shares, and its tiles split into as many near-equal
         * parts as it holds IL_PART_TILES, at most gridDim.y; the blocks
         * past them only fill (a part's set-up costs about four tiles). */
        const int ny = (int)gridDim.y, y = (int)blockIdx.y, np = il_parts(bk);
        first = bk.lo / IL_ROWS;
        count = thi - first;
        const int t0 = first + (int)((long long)count * min(y, np) / np);
        lp.tlo = t0;
        lp.tstep = 1;
        count = y < np ? first + (int)((long long)count * (y + 1) / np) - t0 : 0;
        il_fill_part<QB, L::NT>(bk, first * IL_ROWS, thi * IL_ROWS, y, ny, out);
    }
    /* Decode: warpgroup w takes the block's tiles w, w + 2, ...; prefill:
     * every tile, for its QW queries. */
    const int q0 = PAGED ? 0 : il_wg() * QW;
    lp.nt = PAGED ? (count - il_wg() + 1) / 2 : count;
    lp.bk = {PAGED ? bk.nq : min(max(bk.nq - q0, 0), QW), bk.row0 + q0,
             bk.lo, bk.hi, bk.limit, bk.stride};
    lp.lo = lo + q0;
    lp.hi = hi + q0;
    lp.k = k;
    lp.ksc = ksc;
    lp.out = out;
    lp.go(bar, il_bars);
}
