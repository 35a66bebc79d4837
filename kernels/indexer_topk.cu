/* indexer_topk.cu: the indexer's per-row top-k (spec/kernels.md,
 * indexer_topk).  Device code only.
 *
 * Template parameters are the key's fields: TOPK and WINDOWED.
 *
 * Launch: 512 threads (two blocks per SM: one sorts while the other
 * streams), kw_k_shmem_bytes() (IT_SMEM) of dynamic shared
 * memory; any grid (blocks stride over rows).
 *
 * Each element of a window becomes the 64-bit key (mono(score) << 32) |
 * (0xffffffff - position), where mono() maps a float to an unsigned that
 * orders as the spec ranks scores (NaN lowest, -0.0 folded onto +0.0).
 * Keys are unique, larger is better, and sorting them descending gives
 * exactly the spec's order, ties by lower position included.
 *
 * Fast path (TOPK <= IT_CAP): one pass builds a histogram of the top 11
 * bits of mono(score); the bin holding the TOPK-th best is the boundary
 * (found by all threads, it_find_all).  A second pass, last chunk first,
 * places the keys above it (fewer than TOPK) into sel and those in it
 * (when at most IT_CAP) into cand, one shared atomic per warp and 512
 * elements (it_place); a radix select in shared memory bounds the best
 * TOPK - above of the boundary keys, which join the winners; the winners
 * are sorted by bucket (it_sort_bucket) and written.  Two reads of the
 * window.  When the boundary bin overflows (mass ties: ReLU plateaus of
 * exact 0.0) and TOPK <= IT_TIES, the tie path refines the boundary to
 * one exact score v with two more histogram passes (the next 11, then
 * the last 10 bits of mono(score), counted once per warp and bin),
 * gathers the keys above v, and takes the tied keys of v in position
 * order, chunk by chunk, until enough are held: the lowest positions win
 * the tie, as the keys order them.  Otherwise (TOPK > IT_CAP) the slow
 * path emits the output in chunks of IT_CAP ranks, each bounded by an
 * exact radix select of the 64-bit keys (eight 8-bit passes over the
 * window): slower, for any window up to 2^31.  Every step's result is a
 * function of the window alone (slots taken by atomics are resolved by
 * exact keys before anything is written), so replays agree bit for bit.
 */

typedef unsigned long long kw_u64;

/* IT_THREADS, IT_MINB (blocks an SM) and IT_CAP (keys of each shared
 * buffer) may be overridden for experiments (bench_indexer DIR -D...,
 * with kernels.json's threads and shmem patched to match); launch/
 * (family.c) launches the defaults.  IT_BACK 1 (the default) makes the
 * gather read the window last chunk first: the chunks the histogram read
 * last, some still in L2 (6% less time on the H200's indexer logits than
 * IT_BACK 0, first chunk first). */
#ifndef IT_THREADS
#define IT_THREADS 512
#endif
#ifndef IT_MINB
#define IT_MINB 2
#endif
#ifndef IT_CAP
#define IT_CAP 4096
#endif
#ifndef IT_BACK
#define IT_BACK 1
#endif
/* IT_VU: 16-byte loads in flight per thread in it_visit (the histogram
 * passes). */
#ifndef IT_VU
#define IT_VU 4
#endif
/* IT_BUCKET 1 (the default): the winners are sorted by bucket
 * (it_sort_bucket); 0: by the bitonic network alone. */
#ifndef IT_BUCKET
#define IT_BUCKET 1
#endif
#define IT_BINS 2048
/* The tie path holds fewer than TOPK + 4 IT_THREADS tied keys in cand. */
#define IT_TIES (IT_CAP - 4 * IT_THREADS)
/* hist[IT_BINS] u32, sel[IT_CAP] u64, cand[IT_CAP] u64 */
#define IT_SMEM (IT_BINS * 4 + 2 * IT_CAP * 8)

__device__ __forceinline__ unsigned it_mono(float s)
{
    unsigned u = __float_as_uint(s);
    if (isnan(s))
        return 0u;
    u = u == 0x80000000u ? 0u : u;
    return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ kw_u64 it_key(float s, int pos)
{
    return ((kw_u64)it_mono(s) << 32) | (0xffffffffu - (unsigned)pos);
}

struct it_ctl {
    int bin, above, count; /* a radix step's result */
    int nsel, ncand;
    unsigned placed; /* it_gather's counts, above | in << 16 */
    int wsum[IT_THREADS / 32]; /* it_find_all's per-warp sums */
    kw_u64 red[2][IT_THREADS / 32]; /* it_sort_bucket's key range */
};

/* The inclusive sum of x over the warp's lanes up to this one. */
template <class T>
__device__ __forceinline__ T it_scan(T x)
{
    const int lane = threadIdx.x & 31;
#pragma unroll
    for (int off = 1; off < 32; off <<= 1) {
        const T y = __shfl_up_sync(0xffffffffu, x, off);
        x += lane >= off ? y : (T)0;
    }
    return x;
}

/* it_find's step for the PER bins of slice i (counted from the top of
 * NB), before keys lying in higher bins: the one holding the k-th. */
template <int NB, int PER>
__device__ __forceinline__ void it_claim(const unsigned *hist, int i,
                                         int before, int k, it_ctl *ctl)
{
#pragma unroll
    for (int j = 0; j < PER; j++) {
        const int b = NB - 1 - PER * i - j, h = (int)hist[b];
        if (before < k && k <= before + h) {
            ctl->bin = b;
            ctl->above = before;
            ctl->count = h;
        }
        before += h;
    }
}

/* The sum of the PER bins of slice i, counted from the top of NB. */
template <int NB, int PER>
__device__ __forceinline__ int it_slice(const unsigned *hist, int i)
{
    int s = 0;
#pragma unroll
    for (int j = 0; j < PER; j++)
        s += (int)hist[NB - 1 - PER * i - j];
    return s;
}

/* Warp 0: finds the bin (of NB, counted in hist) holding the k-th largest
 * key (1-based), with the number of keys in higher bins. */
template <int NB>
__device__ __forceinline__ void it_find(const unsigned *hist, int k,
                                        it_ctl *ctl)
{
    constexpr int PER = NB / 32;
    const int lane = threadIdx.x & 31;
    const int s = it_slice<NB, PER>(hist, lane), x = it_scan(s);
    it_claim<NB, PER>(hist, lane, x - s, k, ctl);
}

/* All threads: it_find for NB >= IT_THREADS bins, each thread summing
 * NB / IT_THREADS of them and a block scan placing its sum (one warp
 * summing 2048 bins alone, 64 a lane, left the block idle for it). */
template <int NB>
__device__ __forceinline__ void it_find_all(const unsigned *hist, int k,
                                            it_ctl *ctl)
{
    constexpr int PER = NB / IT_THREADS;
    static_assert(PER >= 1 && NB % IT_THREADS == 0, "it_find_all: bins");
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    const int s = it_slice<NB, PER>(hist, t), x = it_scan(s);
    if (lane == 31)
        ctl->wsum[warp] = x;
    __syncthreads();
    int before = x - s;
    for (int w = 0; w < warp; w++)
        before += ctl->wsum[w];
    it_claim<NB, PER>(hist, t, before, k, ctl);
}

/* Calls f(score, position, valid) for every element of a window, with
 * 16-byte loads, IT_VU (4) in flight per thread, between a scalar head (up to
 * the first 16-byte boundary) and a scalar tail: a block has enough bytes
 * in flight to stream the row at the memory's rate.  Every thread makes
 * the same number of calls in the same order (valid false past the end),
 * so f may use whole-warp ballots, and a thread sees the same elements on
 * every visit of the same window. */
template <class F>
__device__ __forceinline__ void it_visit(const float *__restrict__ row,
                                         int len, F &f)
{
    int head = (int)((16 - ((unsigned long long)row & 15)) & 15) / 4;
    head = head < len ? head : len;
    if (head > 0) { /* fewer than 4 elements: one round */
        int i = threadIdx.x;
        f(i < head ? __ldg(row + i) : 0.0f, i, i < head);
    }
    const float4 *v = (const float4 *)(row + head);
    const int nv = (len - head) / 4;
    for (int j0 = 0; j0 < nv; j0 += IT_VU * IT_THREADS) {
        float4 x[IT_VU];
#pragma unroll
        for (int u = 0; u < IT_VU; u++) {
            int j = j0 + u * IT_THREADS + threadIdx.x;
            x[u] = j < nv ? __ldg(v + j) : make_float4(0, 0, 0, 0);
        }
#pragma unroll
        for (int u = 0; u < IT_VU; u++) {
            int j = j0 + u * IT_THREADS + threadIdx.x;
            int p = head + 4 * j;
            bool ok = j < nv;
            f(x[u].x, p, ok);
            f(x[u].y, p + 1, ok);
            f(x[u].z, p + 2, ok);
            f(x[u].w, p + 3, ok);
        }
    }
    for (int i0 = head + 4 * nv; i0 < len; i0 += IT_THREADS) {
        int i = i0 + threadIdx.x;
        f(i < len ? __ldg(row + i) : 0.0f, i, i < len);
    }
}

/* Histogram step of the fast path: the top 11 bits of mono(score). */
struct it_hist {
    unsigned *hist;

    __device__ __forceinline__ void operator()(float s, int, bool ok) const
    {
        if (ok)
            atomicAdd(&hist[it_mono(s) >> 21], 1u);
    }
};

/* The gather step: the window's keys above the boundary bin go to sel,
 * those in it to cand, in one read.  A thread classifies the N elements
 * it holds, a warp scan of (above | in << 16) places them, and one shared
 * atomic per warp and N x 32 elements (the two counts packed: both stay
 * below 2^16) reserves the warp's slots: no per-element counter (one
 * counter hit by every warp for every element was the gather's
 * bottleneck once) and no counting pass before it.  The slots' order
 * varies from run to run; sel and cand are sets, resolved by exact keys
 * and sorted after. */
struct it_place {
    int bin;
    kw_u64 *sel, *cand;
    unsigned *count; /* above | in << 16 */

    /* Element u V + c of s is at position p[u] + c, valid if ok[u]. */
    template <int U, int V>
    __device__ __forceinline__ void take(const float (&s)[U * V],
                                         const int (&p)[U],
                                         const bool (&ok)[U]) const
    {
        constexpr int N = U * V;
        const int lane = threadIdx.x & 31;
        unsigned gm = 0, em = 0;
#pragma unroll
        for (int e = 0; e < N; e++) {
            const int b = (int)(it_mono(s[e]) >> 21);
            gm |= (unsigned)(ok[e / V] && b > bin) << e;
            em |= (unsigned)(ok[e / V] && b == bin) << e;
        }
        const unsigned mine = __popc(gm) | ((unsigned)__popc(em) << 16);
        const unsigned x = it_scan(mine);
        const unsigned tot = __shfl_sync(0xffffffffu, x, 31);
        if (tot == 0)
            return;
        unsigned base = 0;
        if (lane == 31)
            base = atomicAdd(count, tot);
        base = __shfl_sync(0xffffffffu, base, 31) + x - mine;
        int og = (int)(base & 0xffffu), oe = (int)(base >> 16);
#pragma unroll
        for (int e = 0; e < N; e++) {
            if ((gm >> e) & 1u)
                sel[og++] = it_key(s[e], p[e / V] + e % V);
            if ((em >> e) & 1u)
                cand[oe++] = it_key(s[e], p[e / V] + e % V);
        }
    }
};

/* As it_visit, but f.take<N>() sees all N elements a thread holds at
 * once: 16 of the body's loads, one of the head's or the tail's. */
template <class F>
__device__ __forceinline__ void it_visit_n(const float *__restrict__ row,
                                           int len, const F &f)
{
    int head = (int)((16 - ((unsigned long long)row & 15)) & 15) / 4;
    head = head < len ? head : len;
    if (head > 0) {
        const int i = threadIdx.x;
        const float s[1] = {i < head ? __ldg(row + i) : 0.0f};
        const int p[1] = {i};
        const bool ok[1] = {i < head};
        f.template take<1, 1>(s, p, ok);
    }
    const float4 *v = (const float4 *)(row + head);
    const int nv = (len - head) / 4;
    const int last = nv > 0 ? (nv - 1) / (4 * IT_THREADS) * (4 * IT_THREADS) : 0;
    for (int jj = 0; jj < nv; jj += 4 * IT_THREADS) {
        const int j0 = IT_BACK ? last - jj : jj;
        float s[16];
        int p[4];
        bool ok[4];
#pragma unroll
        for (int u = 0; u < 4; u++) {
            const int j = j0 + u * IT_THREADS + threadIdx.x;
            const float4 x = j < nv ? __ldg(v + j) : make_float4(0, 0, 0, 0);
            s[4 * u] = x.x;
            s[4 * u + 1] = x.y;
            s[4 * u + 2] = x.z;
            s[4 * u + 3] = x.w;
            p[u] = head + 4 * j;
            ok[u] = j < nv;
        }
        f.template take<4, 4>(s, p, ok);
    }
    for (int i0 = head + 4 * nv; i0 < len; i0 += IT_THREADS) {
        const int i = i0 + threadIdx.x;
        const float s[1] = {i < len ? __ldg(row + i) : 0.0f};
        const int p[1] = {i};
        const bool ok[1] = {i < len};
        f.template take<1, 1>(s, p, ok);
    }
}

/* Places the window's keys above and in the boundary bin (one read of
 * the window); *count must be 0. */
__device__ void it_gather(const float *__restrict__ row, int len, int bin,
                          kw_u64 *sel, kw_u64 *cand, unsigned *count)
{
    const it_place pl = {bin, sel, cand, count};
    it_visit_n(row, len, pl);
    __syncthreads();
}

/* Appends key to buf at *count when want, one shared atomic per warp
 * (the lanes calling together) instead of one per key. */
__device__ __forceinline__ void it_append(bool want, kw_u64 key, kw_u64 *buf,
                                          int *count)
{
    const unsigned act = __activemask(), lane = threadIdx.x & 31;
    const unsigned bal = __ballot_sync(act, want);
    if (bal == 0)
        return;
    const int leader = __ffs(bal) - 1;
    int base = 0;
    if ((int)lane == leader)
        base = atomicAdd(count, __popc(bal));
    base = __shfl_sync(act, base, leader);
    if (want)
        buf[base + __popc(bal & ((1u << lane) - 1))] = key;
}

/* The exact key of the k-th largest (1-based, k <= n) of the n keys in
 * shared memory a, which share their top 8 bits (one boundary bin):
 * 8-bit radix passes over a, no global memory, until the bin of the k-th
 * is wanted whole.  Returns a bound b: the k best are the keys >= b. */
__device__ kw_u64 it_select_smem(const kw_u64 *a, int n, int k,
                                 unsigned *hist, it_ctl *ctl)
{
    kw_u64 prefix = a[0] & 0xff00000000000000ull;
    for (int shift = 48; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += IT_THREADS)
            hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < n; i += IT_THREADS)
            if ((a[i] >> (shift + 8)) == (prefix >> (shift + 8)))
                atomicAdd(&hist[(a[i] >> shift) & 255], 1u);
        __syncthreads();
        if (threadIdx.x < 32)
            it_find<256>(hist, k, ctl);
        __syncthreads();
        k -= ctl->above;
        prefix |= (kw_u64)ctl->bin << shift;
        /* Every key of the bin is wanted: its lowest possible key is as
         * good a bound as the exact k-th (no key lies between them). */
        const bool all = ctl->count == k;
        __syncthreads();
        if (all)
            return prefix;
    }
    return prefix;
}

/* The exact key of the k-th largest (1-based, k <= len) element. */
__device__ kw_u64 it_select(const float *__restrict__ row, int len, int k,
                            unsigned *hist, it_ctl *ctl)
{
    kw_u64 prefix = 0;
    for (int shift = 56; shift >= 0; shift -= 8) {
        for (int i = threadIdx.x; i < 256; i += IT_THREADS)
            hist[i] = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < len; i += IT_THREADS) {
            kw_u64 key = it_key(__ldg(row + i), i);
            if (shift == 56 || (key >> (shift + 8)) == (prefix >> (shift + 8)))
                atomicAdd(&hist[(key >> shift) & 255], 1u);
        }
        __syncthreads();
        if (threadIdx.x < 32)
            it_find<256>(hist, k, ctl);
        __syncthreads();
        k -= ctl->above;
        prefix |= (kw_u64)ctl->bin << shift;
        __syncthreads();
    }
    return prefix;
}

#include "kw_k_it_sort.cuh"

/* Any k and window: chunks of IT_CAP ranks between exact selects. */
__device__ void it_slow(const float *__restrict__ row, int len, int k,
                        int *out, unsigned *hist, kw_u64 *sel, it_ctl *ctl)
{
    kw_u64 upper = 0; /* exclusive bound; unused for the first chunk */
    for (int r0 = 0; r0 < k; r0 += IT_CAP) {
        int r1 = min(k, r0 + IT_CAP);
        kw_u64 lower = it_select(row, len, r1, hist, ctl);
        if (threadIdx.x == 0)
            ctl->nsel = 0;
        __syncthreads();
        for (int i = threadIdx.x; i < len; i += IT_THREADS) {
            kw_u64 key = it_key(__ldg(row + i), i);
            if (key >= lower && (r0 == 0 || key < upper))
                sel[atomicAdd(&ctl->nsel, 1)] = key;
        }
        __syncthreads();
        it_sort(sel, r1 - r0);
        it_emit(sel, r1 - r0, out + r0);
        upper = lower;
        __syncthreads();
    }
}

/* Tie path, refinement step: counts, per warp and bin, the next B bits
 * (below bit SH) of mono(score) for the scores whose bits above SH are
 * pre. */
template <int SH, int B>
struct it_hist_in {
    unsigned *hist;
    unsigned pre;

    __device__ __forceinline__ void operator()(float s, int, bool ok) const
    {
        const unsigned u = it_mono(s);
        const bool in = ok && (u >> SH) == pre;
        const unsigned b = in ? (u >> (SH - B)) & ((1u << B) - 1) : ~0u;
        const unsigned peers = __match_any_sync(0xffffffffu, b);
        if (in && (threadIdx.x & 31) == __ffs(peers) - 1)
            atomicAdd(&hist[b], (unsigned)__popc(peers));
    }
};

/* Tie path, gather step: the keys of scores above v go to sel. */
struct it_above {
    unsigned v;
    kw_u64 *sel;
    int *count;

    __device__ __forceinline__ void operator()(float s, int i, bool ok) const
    {
        const bool g = ok && it_mono(s) > v;
        it_append(g, it_key(s, i), sel, count);
    }
};

/* One refinement pass: the bin of the next B bits below SH holding the
 * k-th largest of the scores with prefix pre; returns k within it. */
template <int SH, int B>
__device__ int it_refine(const float *__restrict__ row, int len, int k,
                         unsigned *pre, unsigned *hist, it_ctl *ctl)
{
    for (int i = threadIdx.x; i < (1 << B); i += IT_THREADS)
        hist[i] = 0;
    __syncthreads();
    it_hist_in<SH, B> h = {hist, *pre};
    it_visit(row, len, h);
    __syncthreads();
    it_find_all<(1 << B)>(hist, k, ctl);
    __syncthreads();
    *pre = (*pre << B) | (unsigned)ctl->bin;
    k -= ctl->above;
    __syncthreads();
    return k;
}

/* The mass-tie case of it_fast (bin: the boundary of the top 11 bits,
 * with above keys in higher bins): refines the boundary to the exact
 * score v, gathers the keys above v into sel, then the tied keys of v
 * chunk by chunk in position order into cand until m are held (fewer
 * than m + 4 IT_THREADS), and keeps their m best (lowest positions). */
template <int TOPK>
__device__ void it_ties(const float *__restrict__ row, int len, int bin,
                        int above, int *out, unsigned *hist, kw_u64 *sel,
                        kw_u64 *cand, it_ctl *ctl)
{
    unsigned v = (unsigned)bin;
    int m = it_refine<21, 11>(row, len, TOPK - above, &v, hist, ctl);
    m = it_refine<10, 10>(row, len, m, &v, hist, ctl);
    if (threadIdx.x == 0)
        ctl->nsel = ctl->ncand = 0;
    __syncthreads();
    it_above g = {v, sel, &ctl->nsel};
    it_visit(row, len, g);
    for (int c0 = 0; c0 < len; c0 += 4 * IT_THREADS) {
#pragma unroll
        for (int e = 0; e < 4; e++) {
            const int i = c0 + 4 * (int)threadIdx.x + e;
            const float x = i < len ? __ldg(row + i) : 0.0f;
            it_append(i < len && it_mono(x) == v, it_key(x, i), cand,
                      &ctl->ncand);
        }
        __syncthreads();
        const int got = ctl->ncand;
        __syncthreads(); /* all have read it before the next appends */
        if (got >= m)
            break;
    }
    const kw_u64 thr = it_select_smem(cand, ctl->ncand, m, hist, ctl);
    const int nc = ctl->ncand;
    for (int i0 = 0; i0 < nc; i0 += IT_THREADS) {
        const int i = i0 + threadIdx.x;
        it_append(i < nc && cand[i] >= thr, i < nc ? cand[i] : 0, sel,
                  &ctl->nsel);
    }
    __syncthreads();
    it_finish<TOPK>(sel, TOPK, out, hist, cand, ctl);
}

/* TOPK <= IT_CAP: histogram, gather, sort.  False when the boundary bin
 * holds more than IT_CAP keys and TOPK > IT_TIES (the caller takes the
 * slow path). */
template <int TOPK>
__device__ bool it_fast(const float *__restrict__ row, int len, int *out,
                        unsigned *hist, kw_u64 *sel, kw_u64 *cand,
                        it_ctl *ctl)
{
    const bool all = len <= TOPK;
    if (!all) {
        for (int i = threadIdx.x; i < IT_BINS; i += IT_THREADS)
            hist[i] = 0;
        __syncthreads();
        it_hist h = {hist};
        it_visit(row, len, h);
        __syncthreads();
        it_find_all<IT_BINS>(hist, TOPK, ctl);
    } else if (threadIdx.x == 0) {
        ctl->bin = -1;
        ctl->above = len;
        ctl->count = 0;
    }
    if (threadIdx.x == 0) {
        ctl->nsel = ctl->ncand = 0;
        ctl->placed = 0;
    }
    __syncthreads();
    const int bin = ctl->bin, above = ctl->above;
    if (ctl->count > IT_CAP) {
        if (TOPK > IT_TIES)
            return false;
        it_ties<TOPK>(row, len, bin, above, out, hist, sel, cand, ctl);
        return true;
    }
    it_gather(row, len, bin, sel, cand, &ctl->placed);
    if (threadIdx.x == 0) {
        ctl->nsel = above;
        ctl->ncand = ctl->count;
    }
    __syncthreads();
    const int n = all ? len : TOPK;
    if (!all) {
        /* The TOPK - above best of the boundary bin: keys at or above the
         * exact (TOPK - above)-th, which are unique. */
        kw_u64 thr = it_select_smem(cand, ctl->ncand, TOPK - above, hist, ctl);
        const int nc = ctl->ncand;
        for (int i0 = 0; i0 < nc; i0 += IT_THREADS) {
            int i = i0 + threadIdx.x;
            it_append(i < nc && cand[i] >= thr, i < nc ? cand[i] : 0, sel,
                      &ctl->nsel);
        }
        __syncthreads();
    }
    it_finish<TOPK>(sel, n, out, hist, cand, ctl);
    return true;
}

/* Entry point: (logits, ks or row_end, ke or unused, num_rows, stride,
 * topk_pos); see kw_kernels.h. */
template <int TOPK, bool WINDOWED>
__global__ void __launch_bounds__(IT_THREADS, IT_MINB) kw_k_indexer_topk(
    const float *__restrict__ logits, const int *__restrict__ ks,
    const int *__restrict__ ke, int num_rows, int stride,
    int *__restrict__ topk_pos)
{
    extern __shared__ __align__(16) unsigned char it_smem[];
    __shared__ it_ctl ctl;
    unsigned *hist = (unsigned *)it_smem;
    kw_u64 *sel = (kw_u64 *)(it_smem + IT_BINS * 4);
    kw_u64 *cand = sel + IT_CAP;
    for (int r = blockIdx.x; r < num_rows; r += gridDim.x) {
        const int start = WINDOWED ? ks[r] : 0;
        const int end = WINDOWED ? ke[r] : ks[r];
        const int len = end > start ? end - start : 0;
        const int k = len < TOPK ? len : TOPK;
        const float *row = logits + (long long)r * stride + start;
        int *out = topk_pos + (long long)r * TOPK;
        for (int i = k + threadIdx.x; i < TOPK; i += IT_THREADS)
            out[i] = -1;
        if (k > 0 && !(TOPK <= IT_CAP &&
                       it_fast<TOPK>(row, len, out, hist, sel, cand, &ctl)))
            it_slow(row, len, k, out, hist, sel, &ctl);
        __syncthreads();
    }
}
