/* dcp_stable_topk.cu: the gather-side global top-k over every rank's packed
 * (score, id) candidates (spec/kernels.md).  Device code only.
 *
 * Template parameters are the key's fields: TOPK and NUM_CANDIDATES.
 *
 * Launch: kw_k_topk_threads(N) threads (1024 when N > 4096, else 512), one
 * block per row (any grid: rows are grid-strided), no dynamic shared
 * memory (the static part stays under 48 KiB).
 *
 * Each candidate becomes one 64-bit key that orders exactly as the spec
 * ranks candidates: high word the score's bits made monotone (NaN lowest,
 * -0.0 folded onto +0.0), low word 0xffffffff - id (lower id ranks
 * higher); invalid candidates get key 0, below every valid key.  Equal
 * keys are equal (score, id) pairs, so the position tie-break can never
 * change the output ids and needs no bits.  A radix select over the keys
 * (8-bit digits, held in registers for N <= 16 * threads, else re-read
 * from global memory each pass) finds the top-k boundary; the winners are
 * gathered into shared memory and bitonic-sorted, best first.  Up to 4096
 * winners are sorted at once; a larger topk is emitted in chunks of 4096
 * ranks, each bounded by two exact selects (slow but correct).
 */

typedef unsigned long long kw_u64;

#define KW_K_TK_DIGIT 8
#define KW_K_TK_BINS (1 << KW_K_TK_DIGIT)
#define KW_K_TK_CHUNK 4096

/* Threads per block for n candidates (kw_k_block_threads() on the host). */
__host__ __device__ constexpr int kw_k_topk_threads(int n)
{
    return n > 4096 ? 1024 : 512;
}

__host__ __device__ constexpr int tk_pow2(int x)
{
    int p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

/* The candidate (s, f)'s key; 0 when f is not an integral id in [0, 2^31)
 * (ids must fit the int32 output). */
__device__ __forceinline__ kw_u64 tk_key(float s, float f)
{
    if (!(f >= 0.0f && f < 2147483648.0f && f == truncf(f)))
        return 0;
    unsigned u = __float_as_uint(s);
    unsigned hi;
    if (isnan(s)) {
        hi = 0;
    } else {
        u = u == 0x80000000u ? 0u : u;
        hi = (u & 0x80000000u) ? ~u : (u | 0x80000000u);
    }
    return ((kw_u64)hi << 32) | (0xffffffffu - (unsigned)f);
}

/* Key of candidate i of a row; 0 past the end (padding sorts with the
 * invalid candidates, whose outputs are -1 alike). */
template <int N>
__device__ __forceinline__ kw_u64 tk_load(const float *__restrict__ row, int i,
                                          bool al8)
{
    if (i >= N)
        return 0;
    if (al8) {
        float2 c = __ldg((const float2 *)row + i);
        return tk_key(c.x, c.y);
    }
    const float *c = row + 2 * (long long)i;
    return tk_key(__ldg(c), __ldg(c + 1));
}

template <int CAP>
struct tk_smem {
    kw_u64 buf[CAP];
    unsigned hist[KW_K_TK_BINS];
    int ctl[3]; /* chosen digit, keys above its bucket, keys in it */
    unsigned fill;
};

/* The m best keys are every key >= lb plus `need` copies of lb - 1.  From
 * an exact select, lb - 1 is the key of rank m - 1, gt counts the keys
 * above it and eq the keys equal to it. */
struct tk_sel {
    kw_u64 lb;
    int need, gt, eq;
};

/* Warp 0: the digit whose bucket holds the k-th largest (1-based) of the
 * keys counted in hist; lane L scans digits 255-8L down to 248-8L. */
template <class Smem>
__device__ __forceinline__ void tk_find_bucket(Smem &sm, int k)
{
    constexpr int PER = KW_K_TK_BINS / 32;
    const int lane = threadIdx.x & 31;
    int h[PER], s = 0;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        h[j] = (int)sm.hist[KW_K_TK_BINS - 1 - PER * lane - j];
        s += h[j];
    }
    int x = s;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        int y = __shfl_up_sync(0xffffffffu, x, off);
        x += lane >= off ? y : 0;
    }
    int before = x - s;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        if (before < k && k <= before + h[j]) {
            sm.ctl[0] = KW_K_TK_BINS - 1 - PER * lane - j;
            sm.ctl[1] = before;
            sm.ctl[2] = h[j];
        }
        before += h[j];
    }
}

/* NVRTC compiles no lambdas in device code (it takes them for host
 * functions), so the per-key steps are function objects. */

/* Histogram step of a radix pass: counts the digit at shift of every key
 * whose bits above it equal prefix's.  Plain shared atomics: on sm_90
 * they measured faster than aggregating equal digits per warp with
 * __match_any_sync (83 vs 97 us at 256 x 16384), and faster than 11-bit
 * digits (112 us).  Warps with no key in play skip the pass. */
struct tk_count {
    kw_u64 prefix;
    int shift, above;
    unsigned *hist;

    __device__ __forceinline__ void operator()(kw_u64 key) const
    {
        bool in = above >= 64 || ((key ^ prefix) >> above) == 0;
        unsigned d = (unsigned)(key >> shift) & (KW_K_TK_BINS - 1);
        if (__ballot_sync(0xffffffffu, in) == 0)
            return;
        if (in)
            atomicAdd(&hist[d], 1u);
    }
};

/* Gather step: appends keys in [lo, hi) (hi == 0: no upper bound) to buf,
 * one atomic on the fill cursor per warp. */
struct tk_append {
    kw_u64 lo, hi;
    unsigned lane;
    kw_u64 *buf;
    unsigned *fill;

    __device__ __forceinline__ void operator()(kw_u64 key) const
    {
        bool take = key >= lo && (hi == 0 || key < hi);
        unsigned mask = __ballot_sync(0xffffffffu, take);
        if (mask == 0)
            return;
        const int leader = __ffs(mask) - 1;
        unsigned base = 0;
        if ((int)lane == leader)
            base = atomicAdd(fill, (unsigned)__popc(mask));
        base = __shfl_sync(0xffffffffu, base, leader);
        if (take)
            buf[base + __popc(mask & ((1u << lane) - 1))] = key;
    }
};

/* Key sources: visit(f) calls f(key) for every key of the row, the same
 * number of times in every lane of a warp (f uses warp-wide votes). */

/* Keys held in registers: item j of thread t is candidate j*THREADS + t. */
template <int ITEMS>
struct tk_regs {
    kw_u64 keys[ITEMS];

    template <class F>
    __device__ __forceinline__ void operator()(const F &f) const
    {
#pragma unroll
        for (int j = 0; j < ITEMS; j++)
            f(keys[j]);
    }
};

/* Keys re-read from global memory on every visit. */
template <int N, int THREADS>
struct tk_stream {
    const float *row;
    bool al8;

    template <class F>
    __device__ __forceinline__ void operator()(const F &f) const
    {
        for (int b = 0; b < N; b += THREADS)
            f(tk_load<N>(row, b + (int)threadIdx.x, al8));
    }
};

/* Radix select of the m best keys (1 <= m <= keys visited).  Unless EXACT,
 * stops as soon as a bucket is taken whole. */
template <int THREADS, bool EXACT, class Visit, class Smem>
__device__ tk_sel tk_select(const Visit &visit, int m, Smem &sm)
{
    kw_u64 prefix = 0;
    int k = m, gt = 0;
    for (int shift = 64 - KW_K_TK_DIGIT;; shift -= KW_K_TK_DIGIT) {
        for (int i = threadIdx.x; i < KW_K_TK_BINS; i += THREADS)
            sm.hist[i] = 0;
        __syncthreads();
        const int above = shift + KW_K_TK_DIGIT;
        visit(tk_count{prefix, shift, above, sm.hist});
        __syncthreads();
        if (threadIdx.x < 32)
            tk_find_bucket(sm, k);
        __syncthreads();
        const int cnt = sm.ctl[2];
        prefix |= (kw_u64)sm.ctl[0] << shift;
        k -= sm.ctl[1];
        gt += sm.ctl[1];
        if (shift == 0)
            return tk_sel{prefix + 1, k, gt, cnt};
        if (!EXACT && cnt == k)
            return tk_sel{prefix, 0, gt + cnt, 0};
    }
}

/* One compare-exchange of a descending bitonic sort, seen from element i
 * holding a whose partner (index i ^ j) holds b: the pair's lower index
 * keeps the larger key in blocks sorted descending ((i & k) == 0). */
__device__ __forceinline__ kw_u64 tk_cx(kw_u64 a, kw_u64 b, int i, int j,
                                        int k)
{
    bool keep_max = ((i & k) == 0) == ((i & j) == 0);
    return keep_max ? (a > b ? a : b) : (a < b ? a : b);
}

/* Bitonic stages (k, j) for k in [k_lo, k_hi] and j < min(k, 64), done in
 * registers: a warp takes 64-element segments, lane L holding elements
 * 2L and 2L+1, so partners are the same thread (j == 1) or lane L ^ j/2.
 * No barriers inside; the caller syncs before and after. */
template <int THREADS>
__device__ __forceinline__ void tk_bitonic_warp(kw_u64 *buf, int n, int k_lo,
                                                int k_hi)
{
    const int lane = threadIdx.x & 31;
    for (int seg = (int)threadIdx.x / 32; seg < n / 64; seg += THREADS / 32) {
        const int i0 = seg * 64 + 2 * lane;
        kw_u64 v0 = buf[i0], v1 = buf[i0 + 1];
        for (int k = k_lo; k <= k_hi; k <<= 1) {
            for (int j = (k < 64 ? k : 64) >> 1; j > 1; j >>= 1) {
                kw_u64 p0 = __shfl_xor_sync(0xffffffffu, v0, j >> 1);
                kw_u64 p1 = __shfl_xor_sync(0xffffffffu, v1, j >> 1);
                v0 = tk_cx(v0, p0, i0, j, k);
                v1 = tk_cx(v1, p1, i0 + 1, j, k);
            }
            kw_u64 a = v0;
            v0 = tk_cx(v0, v1, i0, 1, k);
            v1 = tk_cx(v1, a, i0 + 1, 1, k);
        }
        buf[i0] = v0;
        buf[i0 + 1] = v1;
    }
}

/* Sorts buf[0, n) descending; n is a power of two.  Stages with j >= 64
 * go through shared memory, one barrier each; all others run in
 * registers (tk_bitonic_warp), which cuts the barriers for n = 2048 from
 * 66 to 20 (the sort measured 40K of a block's 70K cycles before). */
template <int THREADS>
__device__ __forceinline__ void tk_bitonic(kw_u64 *buf, int n)
{
    if (n >= 64) {
        tk_bitonic_warp<THREADS>(buf, n, 2, 64);
        __syncthreads();
    }
    for (int k = n >= 64 ? 128 : 2; k <= n; k <<= 1) {
        for (int j = k >> 1; j > 0 && (n < 64 || j >= 64); j >>= 1) {
            for (int i = threadIdx.x; i < n / 2; i += THREADS) {
                int lo = 2 * i - (i & (j - 1));
                kw_u64 a = buf[lo], b = buf[lo + j];
                if ((a < b) == ((lo & k) == 0)) {
                    buf[lo] = b;
                    buf[lo + j] = a;
                }
            }
            __syncthreads();
        }
        if (n >= 64) {
            tk_bitonic_warp<THREADS>(buf, n, k, k);
            __syncthreads();
        }
    }
}

/* Fills ranks [s, s + c) of the row: gathers that chunk's keys (plus the
 * copies of its boundary keys), sorts them, writes their ids to o[s..]. */
template <int THREADS, int CAP, bool EXACT, class Visit, class Smem>
__device__ void tk_chunk(const Visit &visit, int s, int c, int *o, Smem &sm)
{
    tk_sel b = tk_select<THREADS, EXACT>(visit, s + c, sm);
    tk_sel a = {0, 0, 0, 0};
    if (s > 0) /* only in EXACT mode: the key of rank s bounds the chunk */
        a = tk_select<THREADS, true>(visit, s + 1, sm);
    const bool same = s > 0 && a.lb == b.lb;
    if (threadIdx.x == 0)
        sm.fill = 0;
    __syncthreads();
    if (!same)
        visit(tk_append{b.lb, s > 0 ? a.lb - 1 : 0, threadIdx.x & 31,
                        sm.buf, &sm.fill});
    __syncthreads();
    /* Copies: of the chunk's top key when it started in an earlier chunk,
     * of its bottom key for the ranks its select left open. */
    const int front = same ? c : (s > 0 ? a.gt + a.eq - s : 0);
    const int tail = same ? 0 : b.need;
    const int f = (int)sm.fill;
    for (int i = threadIdx.x; i < front + tail; i += THREADS)
        sm.buf[f + i] = i < front ? a.lb - 1 : b.lb - 1;
    const int n = tk_pow2(c);
    for (int i = c + (int)threadIdx.x; i < n; i += THREADS)
        sm.buf[i] = 0;
    __syncthreads();
    tk_bitonic<THREADS>(sm.buf, n);
    for (int i = threadIdx.x; i < c; i += THREADS) {
        kw_u64 key = sm.buf[i];
        o[s + i] = key ? (int)(0xffffffffu - (unsigned)key) : -1;
    }
    __syncthreads(); /* sm.buf is refilled by the next chunk or row */
}

template <int TOPK, int N, int THREADS, class Visit, class Smem>
__device__ __forceinline__ void tk_row(const Visit &visit, int *o, Smem &sm)
{
    constexpr int M = TOPK < N ? TOPK : N; /* ranks a candidate can fill */
    constexpr int CAP = tk_pow2(M) < KW_K_TK_CHUNK ? tk_pow2(M) : KW_K_TK_CHUNK;
    for (int s = 0; s < M; s += CAP)
        tk_chunk<THREADS, CAP, (M > CAP)>(visit, s, min(CAP, M - s), o, sm);
    for (int i = M + (int)threadIdx.x; i < TOPK; i += THREADS)
        o[i] = -1;
}

template <int TOPK, int N>
__global__ void __launch_bounds__(kw_k_topk_threads(N))
    kw_k_dcp_stable_topk(const float *__restrict__ gathered, int num_rows,
                         int *__restrict__ out)
{
    static_assert(TOPK >= 1 && N >= 1, "invalid dcp_stable_topk key");
    constexpr int THREADS = kw_k_topk_threads(N);
    constexpr int M = TOPK < N ? TOPK : N;
    constexpr int CAP = tk_pow2(M) < KW_K_TK_CHUNK ? tk_pow2(M) : KW_K_TK_CHUNK;
    constexpr int ITEMS = (N + THREADS - 1) / THREADS;
    __shared__ tk_smem<CAP> sm;
    for (int row = blockIdx.x; row < num_rows; row += gridDim.x) {
        const float *g = gathered + (long long)row * N * 2;
        int *o = out + (long long)row * TOPK;
        const bool al8 = ((unsigned long long)g & 7) == 0;
        if constexpr (ITEMS <= 16) { /* keys live in registers */
            tk_regs<ITEMS> visit;
#pragma unroll
            for (int j = 0; j < ITEMS; j++)
                visit.keys[j] = tk_load<N>(g, j * THREADS + (int)threadIdx.x,
                                           al8);
            tk_row<TOPK, N, THREADS>(visit, o, sm);
        } else { /* too many to hold: re-read the row on every pass */
            tk_stream<N, THREADS> visit = {g, al8};
            tk_row<TOPK, N, THREADS>(visit, o, sm);
        }
    }
}
