/* kw_k_it_sort.cuh: indexer_topk.cu's sorts of its winners (the 64-bit
 * keys of spec order, larger is better): a bitonic network in shared
 * memory (it_sort) or in registers (it_sort_emit), and the bucket sort
 * (it_sort_bucket) that it_finish takes first.  Included by
 * indexer_topk.cu after IT_THREADS, IT_BINS and it_ctl. */

/* Sorts a[0..n) descending (bitonic over the next power of two, padded
 * with 0, which is below every key: no position is 0xffffffff). */
__device__ void it_sort(kw_u64 *a, int n)
{
    int p = 1;
    while (p < n)
        p <<= 1;
    for (int i = n + threadIdx.x; i < p; i += IT_THREADS)
        a[i] = 0;
    __syncthreads();
    for (int k = 2; k <= p; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            for (int i = threadIdx.x; i < p; i += IT_THREADS) {
                int ixj = i ^ j;
                if (ixj > i) {
                    kw_u64 x = a[i], y = a[ixj];
                    bool desc = (i & k) == 0;
                    if (desc ? x < y : x > y) {
                        a[i] = y;
                        a[ixj] = x;
                    }
                }
            }
            __syncthreads();
        }
}

/* One compare-exchange of the bitonic network, seen from index i: its
 * new key, given its partner's key y (partner i ^ j, stage (k, j)). */
__device__ __forceinline__ kw_u64 it_pick(kw_u64 x, kw_u64 y, int i, int j,
                                          int k)
{
    const bool keep_max = ((i & j) == 0) == ((i & k) == 0);
    return keep_max ? (x > y ? x : y) : (x < y ? x : y);
}

/* In-thread stages (partner in the same thread's registers). */
template <int E, int J>
__device__ __forceinline__ void it_step_reg(kw_u64 *x, int k)
{
    kw_u64 y[E];
#pragma unroll
    for (int e = 0; e < E; e++)
        y[e] = x[e ^ J];
#pragma unroll
    for (int e = 0; e < E; e++)
        x[e] = it_pick(x[e], y[e], (int)threadIdx.x * E + e, J, k);
}

/* Sorts a[0..n) descending and writes the positions to out[0..n): a
 * bitonic network over E * IT_THREADS slots (padding 0) held E per thread
 * in registers; stages whose partner is in the same warp use shuffles,
 * only those across warps go through shared memory (10 of 66 for 2048
 * keys), so the sort costs a few dozen barriers instead of 66 x 2. */
template <int E>
__device__ void it_sort_emit(kw_u64 *a, int n, int *out)
{
    constexpr int P = E * IT_THREADS;
    const int t = threadIdx.x;
    kw_u64 x[E];
#pragma unroll
    for (int e = 0; e < E; e++)
        x[e] = t * E + e < n ? a[t * E + e] : 0;
    for (int k = 2; k <= P; k <<= 1)
        for (int j = k >> 1; j > 0; j >>= 1) {
            if (j >= 32 * E) {
                __syncthreads();
#pragma unroll
                for (int e = 0; e < E; e++)
                    a[t * E + e] = x[e];
                __syncthreads();
#pragma unroll
                for (int e = 0; e < E; e++)
                    x[e] = it_pick(x[e], a[(t * E + e) ^ j], t * E + e, j, k);
            } else if (j >= E) {
#pragma unroll
                for (int e = 0; e < E; e++) {
                    kw_u64 y = __shfl_xor_sync(0xffffffffu, x[e], j / E);
                    x[e] = it_pick(x[e], y, t * E + e, j, k);
                }
            } else if (j == 1) {
                it_step_reg<E, 1>(x, k);
            } else if (E > 2 && j == 2) {
                it_step_reg<E, (E > 2 ? 2 : 1)>(x, k);
            } else if (E > 4 && j == 4) {
                it_step_reg<E, (E > 4 ? 4 : 1)>(x, k);
            }
        }
#pragma unroll
    for (int e = 0; e < E; e++)
        if (t * E + e < n)
            out[t * E + e] = (int)(0xffffffffu - (unsigned)x[e]);
    __syncthreads();
}

/* Writes the positions of sorted keys a[0..n) to out[r0..r0+n). */
__device__ __forceinline__ void it_emit(const kw_u64 *a, int n, int *out)
{
    for (int i = threadIdx.x; i < n; i += IT_THREADS)
        out[i] = (int)(0xffffffffu - (unsigned)a[i]);
}

/* Sorts the n <= TOPK winners in sel by bucket and writes their
 * positions to out; false (sel untouched, nothing written) when a bucket
 * holds more than IT_BKT keys.  The keys' range [lo, hi] is cut into
 * 2048 buckets by their bits below the range's top 11 (bucket = (key -
 * lo) >> shift, monotonic in the key); the buckets are laid out best
 * first from a scan of their counts, each key lands in its bucket at the
 * slot its count's atomic gave it, and finds its rank by comparing with
 * its bucket's keys (at most IT_BKT).  About seven barriers in all,
 * where the bitonic network had 66 stages: on the H200 the sort had
 * taken a third of the kernel's time (docs/perf.md).  Mass ties of one
 * score put their keys in one bucket and take the network, as do winners
 * whose range an outlier (an infinity) stretches over many octaves.  Not inlined:
 * its own register allocation spills less (ptxas -v). */
#define IT_BKT 32
template <int TOPK>
__device__ __noinline__ bool it_sort_bucket(kw_u64 *sel, int n, int *out,
                                            unsigned *hist, kw_u64 *tmp,
                                            it_ctl *ctl)
{
    constexpr int PT = (TOPK + IT_THREADS - 1) / IT_THREADS;
    constexpr int PER = IT_BINS / IT_THREADS, W = IT_THREADS / 32;
    const int t = threadIdx.x, lane = t & 31, warp = t >> 5;
    kw_u64 key[PT], lo = ~0ull, hi = 0;
#pragma unroll
    for (int p = 0; p < PT; p++) {
        const int i = t + p * IT_THREADS;
        key[p] = i < n ? sel[i] : 0;
        lo = i < n && key[p] < lo ? key[p] : lo;
        hi = i < n && key[p] > hi ? key[p] : hi;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
        const kw_u64 a = __shfl_xor_sync(0xffffffffu, lo, off);
        const kw_u64 b = __shfl_xor_sync(0xffffffffu, hi, off);
        lo = a < lo ? a : lo;
        hi = b > hi ? b : hi;
    }
    if (lane == 0) {
        ctl->red[0][warp] = lo;
        ctl->red[1][warp] = hi;
    }
    for (int i = t; i < IT_BINS; i += IT_THREADS)
        hist[i] = 0;
    __syncthreads();
    for (int w = 0; w < W; w++) {
        lo = ctl->red[0][w] < lo ? ctl->red[0][w] : lo;
        hi = ctl->red[1][w] > hi ? ctl->red[1][w] : hi;
    }
    const kw_u64 range = hi - lo;
    const int bits = range ? 64 - __clzll((long long)range) : 0;
    const int shift = bits > 11 ? bits - 11 : 0;
    /* A key's bucket, recomputed where needed (fewer live registers). */
    auto bucket = [&](kw_u64 k) { return (int)((k - lo) >> shift); };
    unsigned slot[PT];
#pragma unroll
    for (int p = 0; p < PT; p++)
        if (t + p * IT_THREADS < n)
            slot[p] = atomicAdd(&hist[bucket(key[p])], 1u);
    __syncthreads();
    /* Offsets, best bucket first: thread t scans bins from the top. */
    unsigned c[PER], sum = 0, most = 0;
#pragma unroll
    for (int j = 0; j < PER; j++) {
        c[j] = hist[IT_BINS - 1 - PER * t - j];
        sum += c[j];
        most = c[j] > most ? c[j] : most;
    }
    const unsigned x = it_scan(sum);
    if (lane == 31)
        ctl->wsum[warp] = (int)x;
    if (__syncthreads_or(most > IT_BKT))
        return false;
    unsigned before = x - sum;
    for (int w = 0; w < warp; w++)
        before += (unsigned)ctl->wsum[w];
#pragma unroll
    for (int j = 0; j < PER; j++) {
        hist[IT_BINS - 1 - PER * t - j] = before; /* its own bins only */
        before += c[j];
    }
    __syncthreads();
#pragma unroll
    for (int p = 0; p < PT; p++)
        if (t + p * IT_THREADS < n)
            tmp[hist[bucket(key[p])] + slot[p]] = key[p];
    __syncthreads();
    int *rank = (int *)sel; /* the keys are in registers now */
#pragma unroll
    for (int p = 0; p < PT; p++)
        if (t + p * IT_THREADS < n) {
            const int d = bucket(key[p]), b0 = (int)hist[d];
            const int e = d == 0 ? n : (int)hist[d - 1];
            int r = 0;
            for (int q = b0; q < e; q++)
                r += tmp[q] > key[p];
            rank[b0 + r] = (int)(0xffffffffu - (unsigned)key[p]);
        }
    __syncthreads();
    for (int i = t; i < n; i += IT_THREADS)
        out[i] = rank[i];
    __syncthreads();
    return true;
}

/* Sorts the n <= TOPK winners in sel and writes their positions to out:
 * by bucket, or when a bucket overflows (mass ties) by a bitonic network,
 * in registers from 1025 keys.  hist and tmp (IT_CAP keys) are free. */
template <int TOPK>
__device__ __forceinline__ void it_finish(kw_u64 *sel, int n, int *out,
                                          unsigned *hist, kw_u64 *tmp,
                                          it_ctl *ctl)
{
    if (IT_BUCKET && it_sort_bucket<TOPK>(sel, n, out, hist, tmp, ctl))
        return;
    if (n > 4 * IT_THREADS)
        it_sort_emit<8>(sel, n, out);
    else if (n > 2 * IT_THREADS)
        it_sort_emit<4>(sel, n, out);
    else if (n > 1024)
        it_sort_emit<2>(sel, n, out);
    else {
        it_sort(sel, n);
        it_emit(sel, n, out);
    }
}
