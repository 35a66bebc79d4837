/* kw_k_dcp.cuh: device helpers shared by the kernel families.
 *
 * Device code only; compiled by NVRTC as the named header "kw_k_dcp.cuh"
 * (no host or standard headers, so it builds with nothing but -std=c++17).
 *
 * DCP (decode context parallelism) stripes a request's tokens over W ranks
 * in runs of I tokens (spec/kernels.md, "Notation"):
 *   owner(t)   = (t / I) % W
 *   local(t)   = (t / (W*I))*I + t % I          (index on the owner)
 *   global(l)  = (l / I)*(W*I) + R*I + l % I    (inverse, on rank R)
 *   share(n)   = base + clamp(rem - R*I, 0, I),
 *                base = n/I/W*I, rem = n - base*W
 * Every caller passes non-negative indices, so the math is unsigned: that
 * lets the compiler turn division by a compile-time W or I into shifts or
 * multiplications without the sign fix-ups signed division needs.  Results
 * wrap modulo 2^32, exactly as the CPU references compute them.
 */
#ifndef KW_K_DCP_CUH
#define KW_K_DCP_CUH

__device__ __forceinline__ unsigned kw_k_dcp_owner(unsigned t, unsigned w,
                                                   unsigned il)
{
    return (t / il) % w;
}

__device__ __forceinline__ unsigned kw_k_dcp_local(unsigned t, unsigned w,
                                                   unsigned il)
{
    return (t / (w * il)) * il + t % il;
}

__device__ __forceinline__ unsigned kw_k_dcp_global(unsigned l, unsigned r,
                                                    unsigned w, unsigned il)
{
    return (l / il) * (w * il) + r * il + l % il;
}

/* Rank r's share of n tokens striped in runs of il over w ranks. */
__device__ __forceinline__ unsigned kw_k_dcp_share(unsigned n, unsigned r,
                                                   unsigned w, unsigned il)
{
    unsigned base = n / il / w * il;
    int rem = (int)(n - base * w) - (int)(r * il);
    return base + (unsigned)min(max(rem, 0), (int)il);
}

/* Division of n < 2^31 by a runtime divisor d >= 1 fixed for the launch,
 * as a multiply-high, an add and a shift (Granlund-Montgomery, as in
 * PyTorch's IntDivider): the divisions by block_size in the hot loops
 * would otherwise cost a ~20-instruction sequence each. */
struct kw_k_udiv {
    unsigned m, s;
};

__device__ __forceinline__ kw_k_udiv kw_k_udiv_of(unsigned d)
{
    unsigned s = 0;
    while (s < 32 && (1ull << s) < d)
        s++;
    unsigned long long m = ((1ull << 32) * ((1ull << s) - d)) / d + 1;
    return kw_k_udiv{(unsigned)m, s};
}

__device__ __forceinline__ unsigned kw_k_udiv_q(kw_k_udiv v, unsigned n)
{
    return (__umulhi(n, v.m) + n) >> v.s;
}

/* A runtime integer whose specialisation class (warmup-keys.md §3) the key
 * fixed: class 1 means the value is 1, so the constant replaces it; class
 * 16 means it is a multiple of 16, which the optimiser may exploit; class 2
 * promises nothing. */
template <int REP>
__device__ __forceinline__ int kw_k_rep(int v)
{
    if constexpr (REP == 1)
        return 1;
    if constexpr (REP == 16)
        __builtin_assume(v % 16 == 0);
    return v;
}

/* Largest b in [lo, hi] with starts[b] <= x, for a non-decreasing starts[]
 * and starts[lo] <= x: the request that owns position x when starts[] is a
 * cumulative offset array (empty requests are skipped because a later b
 * with the same start wins).  starts may point to shared or global memory. */
__device__ __forceinline__ int kw_k_find_seg(const int *starts, int lo,
                                             int hi, int x)
{
    while (lo < hi) {
        int mid = (lo + hi + 1) >> 1;
        if (starts[mid] <= x)
            lo = mid;
        else
            hi = mid - 1;
    }
    return lo;
}

/* kw_k_find_seg from a hint: a thread's items ascend, so the request of
 * its previous item (b, with starts[b] <= x) is where the search starts;
 * most items stay in that request and cost one comparison. */
__device__ __forceinline__ int kw_k_find_from(const int *starts, int b, int hi,
                                              int x)
{
    if (b < hi && starts[b + 1] <= x)
        b = kw_k_find_seg(starts, b + 1, hi, x);
    return b;
}

/* This block's contiguous share [*lo, *hi) of n items, in whole tiles.
 * Blocks of the request-indexed kernels walk one range each rather than
 * tiles strided over the grid, so per-block set-up is paid once and each
 * thread's items ascend (see kw_k_find_from). */
__device__ __forceinline__ void kw_k_block_range(int n, int tile, int *lo,
                                                 int *hi)
{
    long long tiles = ((long long)n + tile - 1) / tile;
    long long per = (tiles + gridDim.x - 1) / gridDim.x * tile;
    long long a = blockIdx.x * per;
    *lo = (int)(a < n ? a : n);
    *hi = (int)(a + per < n ? a + per : n);
}

/* Offset arrays of at most this many entries are staged in shared memory. */
#define KW_K_SEG_SMEM 2048

/* Copies starts[0, n) into smem (KW_K_SEG_SMEM ints) when it fits and
 * returns where to search: every thread then runs its own binary search on
 * shared memory, with no serial per-tile step.  Larger arrays stay in
 * global memory (their top levels are cached alike).  Ends with a barrier
 * when it copies; every thread of the block must call it. */
__device__ __forceinline__ const int *kw_k_stage_segs(
    const int *__restrict__ starts, int n, int *smem)
{
    if (n > KW_K_SEG_SMEM)
        return starts;
    for (int i = threadIdx.x; i < n; i += blockDim.x)
        smem[i] = __ldg(starts + i);
    __syncthreads();
    return smem;
}

#endif /* KW_K_DCP_CUH */
