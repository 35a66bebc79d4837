/* index_conversion.cu: request-local top-k positions to physical KV rows
 * (spec/kernels.md).  Device code only.
 *
 * Template parameters are the key's fields in spec order; only the last
 * (block_table_stride) is a class, of the runtime width.
 *
 * Launch: NUM_WARPS*32 threads; any grid (rows are grid-strided).  Rows of
 * up to IC_WARP_TOPK entries go one per warp, so a block takes NUM_WARPS
 * rows at a time (the harness launches ceil(rows / (4 * NUM_WARPS))
 * blocks, so each warp walks 4 rows): a warp holds its whole row in
 * registers, scans with shuffles and never waits on a block barrier.  One block per row of 512 left half the threads idle and
 * each block a chain of DRAM round trips and barriers; at 65,536 rows that
 * measured 0.28-0.47 of copy bandwidth.  Longer rows go one per block (the
 * harness: one block per row), walked in chunks of NUM_WARPS*32*VEC*G
 * entries (one chunk when SINGLE_TILE and BLOCK_N == TOPK).  Both use
 * 16-byte loads and stores when the row pointers allow.  compact_to_front
 * stages the survivors in shared memory, so the compacted row is written
 * with coalesced stores; a warp's row with every entry gathering (W=1, no
 * prefill workspace) is compacted by ballots in registers instead.  Every
 * path loads its entries first and then converts them all, the block-table
 * gathers going out back to back (ic_conv_all).
 *
 * Rows whose request index is out of range (req_id outside [0, num_reqs)
 * for decode rows, prefill_req >= num_prefill for prefill rows) come out
 * all -1 rather than reading outside the arrays; the CPU reference rejects
 * such input instead.
 */
#include "kw_k_dcp.cuh"

/* Rows up to this long go one per warp (kw__k_gen_ic() in kernels/gen.c
 * mirrors it for the harness's grid). */
#define IC_WARP_TOPK 512

/* *p when on, else 0, as one predicated non-coherent load: no access when
 * !on, and no branch (an __ldg under an `if` compiled to one). */
__device__ __forceinline__ int ic_ldg_if(bool on, const int *p)
{
    int v = 0;
    asm("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %2, 0;\n\t"
        "@q ld.global.nc.b32 %0, [%1];\n\t}"
        : "+r"(v)
        : "l"(p), "r"((unsigned)on));
    return v;
}

/* *p = v when on, as one predicated store: no branch (a store under an
 * `if` compiled to one, with its divergence bookkeeping). */
__device__ __forceinline__ void ic_st_if(bool on, int *p, int v)
{
    asm volatile("{\n\t.reg .pred q;\n\tsetp.ne.u32 q, %0, 0;\n\t"
                 "@q st.global.b32 [%1], %2;\n\t}"
                 :
                 : "r"((unsigned)on), "l"(p), "r"(v)
                 : "memory");
}

/* One entry's conversion: everything that is fixed for the row. */
template <int BS, int STRIDE, int W, int R, int IL, bool HAS_WS>
struct ic_conv {
    const int *bt_row;
    int width;
    int ws_base;   /* workspace_start[prefill_req] */
    int ws_stride; /* workspace_rank_stride */
    bool prefill;
    bool dead;

    /* Every entry in range gathers from the block table (no DCP ranks to
     * skip, no prefill rows): ic_row_warp_ballot pays off only then. */
    static constexpr bool GATHERS_ALL = W == 1 && !HAS_WS;

    /* Row `row`'s conversion: a prefill row when prefill_req says so (only
     * with HAS_WS); dead (all -1) when its request index is out of range. */
    __device__ __forceinline__ static ic_conv
    of_row(int row, const int *__restrict__ req_id,
           const int *__restrict__ block_table,
           const int *__restrict__ prefill_req,
           const int *__restrict__ workspace_start, int num_reqs,
           int num_prefill, int width, int ws_stride)
    {
        ic_conv c;
        int preq = HAS_WS ? __ldg(prefill_req + row) : -1;
        int req = preq >= 0 ? 0 : __ldg(req_id + row);
        c.prefill = preq >= 0;
        c.dead = c.prefill ? preq >= num_prefill : (req < 0 || req >= num_reqs);
        c.ws_base = c.prefill && !c.dead ? __ldg(workspace_start + preq) : 0;
        c.ws_stride = ws_stride;
        c.width = width;
        c.bt_row = block_table + (long long)(c.dead ? 0 : req) * width;
        return c;
    }

    /* Branch-free, the gather a predicated load.  With an early return
     * per case the compiler put each gather in its own branch and waited
     * for it before the next: 16 block-table round trips in series per
     * row (Nsight Compute on the H200, W=1 compacting variant: 37% of the
     * warp-stall samples waited on those loads; 11% after this). */
    __device__ __forceinline__ int operator()(int t) const
    {
        const unsigned owner = kw_k_dcp_owner((unsigned)t, W, IL);
        const unsigned l =
            W == 1 ? (unsigned)t : kw_k_dcp_local((unsigned)t, W, IL);
        const unsigned blk = l / BS;
        const bool live = t >= 0 && !dead, ws = HAS_WS && prefill;
        const bool gather =
            live && !ws && owner == (unsigned)R && blk < (unsigned)width;
        const int page = ic_ldg_if(gather, bt_row + blk);
        if (ws)
            return live ? (int)(owner * (unsigned)ws_stride +
                                (unsigned)ws_base + l)
                        : -1;
        return gather ? (int)((unsigned)page * STRIDE + l % BS) : -1;
    }
};

/* Exclusive block-wide prefix sums of G per-thread counts, ordered g-major
 * (all threads' v[0], then all threads' v[1], ...), which is the order of
 * the entries they count.  sm holds G*(THREADS/32) ints.  Returns the
 * total.  One barrier, so every thread of the block must call it; the
 * caller must pass another barrier before sm is written again. */
template <int THREADS, int G>
__device__ __forceinline__ int ic_block_scan(const int (&v)[G], int (&excl)[G],
                                             int *sm)
{
    constexpr int NW = THREADS / 32;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    int incl[G];
#pragma unroll
    for (int g = 0; g < G; g++) {
        int x = v[g];
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            int y = __shfl_up_sync(0xffffffffu, x, off);
            x += lane >= off ? y : 0;
        }
        incl[g] = x;
        if (lane == 31)
            sm[g * NW + warp] = x;
    }
    __syncthreads();
    int run = 0;
#pragma unroll
    for (int g = 0; g < G; g++) {
        int before = 0, sum = 0;
#pragma unroll
        for (int w = 0; w < NW; w++) {
            int t = sm[g * NW + w];
            sum += t;
            before += w < warp ? t : 0;
        }
        excl[g] = run + before + incl[g] - v[g];
        run += sum;
    }
    return run;
}

/* Loads entries i0 .. i0+V-1 of a row (V == 4: one 16-byte load, and
 * TOPK % 4 == 0 makes a vector either whole or past the end), -1 past it. */
template <int V, int TOPK>
__device__ __forceinline__ void ic_load(const int *__restrict__ in, int i0,
                                        int (&t)[V])
{
    if constexpr (V == 4) {
        int4 q = i0 < TOPK ? __ldg((const int4 *)(in + i0))
                           : make_int4(-1, -1, -1, -1);
        t[0] = q.x, t[1] = q.y, t[2] = q.z, t[3] = q.w;
    } else {
        t[0] = i0 < TOPK ? __ldg(in + i0) : -1;
    }
}

template <int V, int TOPK>
__device__ __forceinline__ void ic_store(int *__restrict__ o, int i0,
                                         const int (&v)[V])
{
    if (i0 >= TOPK)
        return;
    if constexpr (V == 4)
        *(int4 *)(o + i0) = make_int4(v[0], v[1], v[2], v[3]);
    else
        o[i0] = v[0];
}

/* Converts the G*V entries a thread loaded, in place, into cnt[g] (each
 * group's outputs != -1); returns their sum.  The __syncwarp() before is a
 * fence to ptxas, which otherwise hoists a gather up to the load it needs
 * and issues the rest of the loads only when that one has arrived: a DRAM
 * round trip per group instead of one per row (the gathers themselves then
 * go out back to back, predicated loads with no branch between them). */
template <int G, int V, class Conv>
__device__ __forceinline__ int ic_conv_all(const Conv &conv, int (&val)[G][V],
                                           int (&cnt)[G])
{
    __syncwarp();
    int sum = 0;
#pragma unroll
    for (int g = 0; g < G; g++) {
        cnt[g] = 0;
#pragma unroll
        for (int k = 0; k < V; k++) {
            val[g][k] = conv(val[g][k]);
            cnt[g] += val[g][k] != -1;
        }
        sum += cnt[g];
    }
    return sum;
}

/* Stores a thread's G groups of V outputs, group g at entry
 * base + (g * threads + thread) * V.  (A __syncwarp() before them, to keep
 * the stores after the last gather, made ptxas spill 144 bytes.) */
template <int G, int V, int TOPK>
__device__ __forceinline__ void ic_store_all(int *__restrict__ o, int base,
                                             int threads, int thread,
                                             const int (&val)[G][V])
{
#pragma unroll
    for (int g = 0; g < G; g++)
        ic_store<V, TOPK>(o, base + (g * threads + thread) * V, val[g]);
}

/* Converts one row; returns its count of outputs != -1 (when !COMPACT, the
 * calling thread's part of it).  V is 4 when the row pointers are 16-byte
 * aligned (and TOPK % 4 == 0), else 1. */
template <int THREADS, int G, int V, int TOPK, bool COMPACT, class Conv>
__device__ __forceinline__ int ic_row(const Conv &conv,
                                      const int *__restrict__ in,
                                      int *__restrict__ o, int *sm_scan,
                                      int *stage)
{
    constexpr int CH = THREADS * V * G;
    int run = 0; /* outputs != -1 so far; the write cursor when COMPACT */
    for (int base = 0; base < TOPK; base += CH) {
        int val[G][V], cnt[G];
#pragma unroll
        for (int g = 0; g < G; g++)
            ic_load<V, TOPK>(in, base + (g * THREADS + (int)threadIdx.x) * V,
                             val[g]);
        const int mine = ic_conv_all<G, V>(conv, val, cnt);
        if constexpr (!COMPACT)
            ic_store_all<G, V, TOPK>(o, base, THREADS, threadIdx.x, val);
        if constexpr (COMPACT) {
            int excl[G];
            int total = ic_block_scan<THREADS, G>(cnt, excl, sm_scan);
#pragma unroll
            for (int g = 0; g < G; g++)
#pragma unroll
                for (int k = 0; k < V; k++)
                    if (val[g][k] != -1)
                        stage[excl[g]++] = val[g][k];
            __syncthreads();
            for (int i = threadIdx.x; i < total; i += THREADS)
                o[run + i] = stage[i];
            run += total; /* the next scan's barrier guards stage[]; the
                             one above guards sm_scan */
        } else {
            run += mine; /* per thread here; summed by the caller */
        }
    }
    if constexpr (COMPACT) {
        for (int i = run + (int)threadIdx.x; i < TOPK; i += THREADS)
            o[i] = -1;
    }
    return run;
}

/* Exclusive warp-wide prefix sums of G per-lane counts, g-major like
 * ic_block_scan.  Counts are at most 4 (one vector), so four of them
 * travel packed in the bytes of one int: a lane's byte sum over the warp
 * stays <= 128 and never carries.  Returns the warp's total. */
template <int G>
__device__ __forceinline__ int ic_warp_scan(const int (&v)[G], int (&excl)[G])
{
    const int lane = threadIdx.x & 31;
    int run = 0;
#pragma unroll
    for (int g0 = 0; g0 < G; g0 += 4) {
        unsigned pk = 0;
#pragma unroll
        for (int g = g0; g < G && g < g0 + 4; g++)
            pk |= (unsigned)v[g] << (8 * (g - g0));
        unsigned x = pk;
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            unsigned y = __shfl_up_sync(0xffffffffu, x, off);
            x += lane >= off ? y : 0u;
        }
        const unsigned tot = __shfl_sync(0xffffffffu, x, 31), ex = x - pk;
#pragma unroll
        for (int g = g0; g < G && g < g0 + 4; g++) {
            excl[g] = run + (int)((ex >> (8 * (g - g0))) & 255u);
            run += (int)((tot >> (8 * (g - g0))) & 255u);
        }
    }
    return run;
}

/* Writes a compacted row from its warp's stage: stage[0, total), then -1. */
template <int V, int TOPK>
__device__ __forceinline__ void ic_flush(const int *stage, int total,
                                         int *__restrict__ o)
{
    const int lane = threadIdx.x & 31;
    if constexpr (V == 4) {
        for (int i = 4 * lane; i < TOPK; i += 128) {
            int4 q = *(const int4 *)(stage + i);
            q.x = i < total ? q.x : -1;
            q.y = i + 1 < total ? q.y : -1;
            q.z = i + 2 < total ? q.z : -1;
            q.w = i + 3 < total ? q.w : -1;
            *(int4 *)(o + i) = q;
        }
    } else {
        for (int i = lane; i < TOPK; i += 32)
            o[i] = i < total ? stage[i] : -1;
    }
}

/* Converts one row with one warp; returns its count of outputs != -1 (when
 * !COMPACT, the calling lane's part of it).  Every load of the row is
 * issued before the first conversion.  stage holds TOPK ints of this
 * warp's own (COMPACT only). */
template <int V, int TOPK, bool COMPACT, class Conv>
__device__ __forceinline__ int ic_row_warp(const Conv &conv,
                                           const int *__restrict__ in,
                                           int *__restrict__ o, int *stage)
{
    constexpr int G = (TOPK + 32 * V - 1) / (32 * V);
    const int lane = threadIdx.x & 31;
    int val[G][V], cnt[G];
#pragma unroll
    for (int g = 0; g < G; g++)
        ic_load<V, TOPK>(in, (g * 32 + lane) * V, val[g]);
    const int mine = ic_conv_all<G, V>(conv, val, cnt);
    if constexpr (!COMPACT) {
        ic_store_all<G, V, TOPK>(o, 0, 32, lane, val);
        return mine;
    }
    int excl[G];
    const int total = ic_warp_scan<G>(cnt, excl);
#pragma unroll
    for (int g = 0; g < G; g++)
#pragma unroll
        for (int k = 0; k < V; k++)
            if (val[g][k] != -1)
                stage[excl[g]++] = val[g][k];
    __syncwarp();
    ic_flush<V, TOPK>(stage, total, o);
    __syncwarp(); /* stage is refilled by the warp's next row */
    return total;
}

/* Converts one row with one warp and writes it compacted without shared
 * memory; returns its count of outputs != -1.  Lane l holds entries
 * 32 j + l, so a ballot per j places that step's survivors in consecutive
 * outputs, stored straight from registers (one contiguous span per step,
 * predicated stores).  On the H200 at DeepSeek-V4-Flash size this took the
 * W=1 variant without a prefill workspace from 95.5 to 94.2 us (0.66 ->
 * 0.67 of copy); where fewer entries survive (W=8, prefill rows) the staged
 * ic_row_warp was faster (77.6 vs 86.1 and 89.5 vs 92.3 us), so only
 * GATHERS_ALL rows go here. */
template <int TOPK, class Conv>
__device__ __forceinline__ int ic_row_warp_ballot(const Conv &conv,
                                                  const int *__restrict__ in,
                                                  int *__restrict__ o)
{
    constexpr int J = (TOPK + 31) / 32;
    const int lane = threadIdx.x & 31;
    const unsigned below = (1u << lane) - 1u;
    int val[J];
#pragma unroll
    for (int j = 0; j < J; j++)
        val[j] = 32 * j + lane < TOPK ? __ldg(in + 32 * j + lane) : -1;
    __syncwarp(); /* as in ic_conv_all */
#pragma unroll
    for (int j = 0; j < J; j++)
        val[j] = conv(val[j]);
    int run = 0;
#pragma unroll
    for (int j = 0; j < J; j++) {
        const unsigned m = __ballot_sync(0xffffffffu, val[j] != -1);
        ic_st_if(val[j] != -1, o + run + __popc(m & below), val[j]);
        run += __popc(m);
    }
    for (int i = run + lane; i < TOPK; i += 32)
        o[i] = -1;
    return run;
}

/* The kernel's parameters, passed on to the row walkers. */
struct ic_args {
    const int *__restrict__ req_id;
    const int *__restrict__ block_table;
    const int *__restrict__ topk_pos;
    const int *__restrict__ prefill_req;
    const int *__restrict__ workspace_start;
    int num_rows, num_reqs, num_prefill, width, ws_stride;
    int *__restrict__ out;
    int *__restrict__ valid_count;
};

template <class Conv>
__device__ __forceinline__ Conv ic_conv_of(const ic_args &a, int row)
{
    return Conv::of_row(row, a.req_id, a.block_table, a.prefill_req,
                        a.workspace_start, a.num_reqs, a.num_prefill, a.width,
                        a.ws_stride);
}

/* One row per warp, NUM_WARPS rows per block, grid-strided. */
template <int NUM_WARPS, bool COUNT, bool COMPACT, int TOPK, class Conv>
__device__ __forceinline__ void ic_by_warp(const ic_args &a)
{
    constexpr int V = TOPK % 4 == 0 ? 4 : 1;
    constexpr bool BALLOT = COMPACT && Conv::GATHERS_ALL;
    constexpr bool STAGE = COMPACT && !BALLOT;
    __shared__ __align__(16) int stage[STAGE ? NUM_WARPS * TOPK : 4];
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
    int *st = stage + (STAGE ? warp * TOPK : 0);
    for (long long row = (long long)blockIdx.x * NUM_WARPS + warp;
         row < a.num_rows; row += (long long)gridDim.x * NUM_WARPS) {
        const int *in = a.topk_pos + row * TOPK;
        int *o = a.out + row * TOPK;
        const Conv conv = ic_conv_of<Conv>(a, (int)row);
        int valid;
        if constexpr (BALLOT)
            valid = ic_row_warp_ballot<TOPK>(conv, in, o);
        else if (V == 4 &&
                 (((unsigned long long)in | (unsigned long long)o) & 15) == 0)
            valid = ic_row_warp<V, TOPK, COMPACT>(conv, in, o, st);
        else
            valid = ic_row_warp<1, TOPK, COMPACT>(conv, in, o, st);
        if constexpr (!COUNT)
            continue;
        if constexpr (!COMPACT) /* valid is per lane: sum the warp */
#pragma unroll
            for (int off = 16; off > 0; off >>= 1)
                valid += __shfl_xor_sync(0xffffffffu, valid, off);
        if (lane == 0)
            a.valid_count[row] = valid;
    }
}

/* One row per block, walked in chunks, grid-strided. */
template <int NUM_WARPS, int BLOCK_N, bool SINGLE_TILE, bool COUNT,
          bool COMPACT, int TOPK, class Conv>
__device__ __forceinline__ void ic_by_block(const ic_args &a)
{
    constexpr int THREADS = NUM_WARPS * 32;
    constexpr int V = TOPK % 4 == 0 ? 4 : 1;
    /* Vectors a thread holds per chunk: a single tile wants the whole row
     * in one chunk (one scan), capped so registers and stage[] stay small
     * (stage <= 8192 ints; THREADS * V <= 4096 keeps the cap >= 2). */
    constexpr int GW = SINGLE_TILE ? (BLOCK_N + THREADS * V - 1) / (THREADS * V)
                                   : 2;
    constexpr int GCAP = 8192 / (THREADS * V) > 4 ? 4 : 8192 / (THREADS * V);
    constexpr int G = GW < 1 ? 1 : (GW > GCAP ? GCAP : GW);
    __shared__ int sm_scan[G * NUM_WARPS];
    __shared__ int stage[COMPACT ? THREADS * V * G : 1];
    for (int row = blockIdx.x; row < a.num_rows; row += gridDim.x) {
        const Conv conv = ic_conv_of<Conv>(a, row);
        const int *in = a.topk_pos + (long long)row * TOPK;
        int *o = a.out + (long long)row * TOPK;
        const unsigned long long addr_bits =
            (unsigned long long)in | (unsigned long long)o;
        int valid;
        if (V == 4 && (addr_bits & 15) == 0)
            valid = ic_row<THREADS, G, V, TOPK, COMPACT>(conv, in, o, sm_scan,
                                                        stage);
        else
            valid = ic_row<THREADS, G, 1, TOPK, COMPACT>(conv, in, o, sm_scan,
                                                        stage);
        if constexpr (!COUNT)
            continue;
        if constexpr (!COMPACT) { /* valid is per thread: sum the block */
            int one[1] = {valid}, ex[1];
            valid = ic_block_scan<THREADS, 1>(one, ex, sm_scan);
            __syncthreads(); /* sm_scan is reused by the next row */
        }
        if (threadIdx.x == 0)
            a.valid_count[row] = valid;
    }
}

/* Minimum blocks per SM for __launch_bounds__.  Row per block: without
 * compaction the kernel needs few registers, and asking for a full SM of
 * blocks (no spills) measured 89% -> 93% of copy bandwidth; the compacting
 * variant spills under that bound and got slower, so it keeps the
 * compiler's choice (0 sets no bound).  Row per warp: a full SM leaves 32
 * registers and spills; three quarters of one (40 registers) does not. */
template <int THREADS, bool COMPACT, int TOPK>
__host__ __device__ constexpr int ic_min_blocks()
{
    const int n = TOPK <= IC_WARP_TOPK ? 1536 / THREADS
                                       : (COMPACT ? 0 : 2048 / THREADS);
    return n > 32 ? 32 : n; /* an SM holds at most 32 blocks */
}

template <int BS, int STRIDE, int BLOCK_N, bool SINGLE_TILE, int NUM_WARPS,
          bool HAS_WS, bool COUNT, bool COMPACT, int W, int R, int IL,
          int TOPK, int BT_REP>
__global__ void __launch_bounds__(NUM_WARPS * 32,
                                  ic_min_blocks<NUM_WARPS * 32, COMPACT, TOPK>())
    kw_k_index_conversion(
    const int *__restrict__ req_id, const int *__restrict__ block_table,
    const int *__restrict__ topk_pos, const int *__restrict__ prefill_req,
    const int *__restrict__ workspace_start, int num_rows, int num_reqs,
    int num_prefill, int width, int workspace_rank_stride,
    int *__restrict__ out, int *__restrict__ valid_count)
{
    static_assert(BS >= 1 && W >= 1 && R >= 0 && R < W && IL >= 1 &&
                      TOPK >= 1 && NUM_WARPS >= 1 && NUM_WARPS <= 32,
                  "invalid index_conversion key");
    using Conv = ic_conv<BS, STRIDE, W, R, IL, HAS_WS>;
    const ic_args a = {req_id, block_table, topk_pos, prefill_req,
                       workspace_start, num_rows, num_reqs, num_prefill,
                       kw_k_rep<BT_REP>(width), workspace_rank_stride, out,
                       valid_count};
    if constexpr (TOPK <= IC_WARP_TOPK)
        ic_by_warp<NUM_WARPS, COUNT, COMPACT, TOPK, Conv>(a);
    else
        ic_by_block<NUM_WARPS, BLOCK_N, SINGLE_TILE, COUNT, COMPACT, TOPK,
                    Conv>(a);
}
