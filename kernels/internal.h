/* internal.h: shared between kernels/ .c files; not API (kw__k_ prefix). */
#ifndef KW__K_INTERNAL_H
#define KW__K_INTERNAL_H

#include "kw_kernels.h"

#include <stdint.h>

/* DCP striping (spec/kernels.md, "Notation") in the kernels' arithmetic:
 * unsigned 32-bit, wrapping, for non-negative t, l and n. */
static inline uint32_t kw__k_dcp_owner(uint32_t t, uint32_t w, uint32_t il)
{
    return (t / il) % w;
}

static inline uint32_t kw__k_dcp_local(uint32_t t, uint32_t w, uint32_t il)
{
    return (t / (w * il)) * il + t % il;
}

static inline uint32_t kw__k_dcp_global(uint32_t l, uint32_t r, uint32_t w,
                                        uint32_t il)
{
    return (l / il) * (w * il) + r * il + l % il;
}

/* Rank r's share of n: base + clamp(rem - r*il, 0, il). */
static inline uint32_t kw__k_dcp_share(uint32_t n, uint32_t r, uint32_t w,
                                       uint32_t il)
{
    uint32_t base = n / il / w * il;
    int64_t rem = (int64_t)(n - base * w) - (int64_t)r * il;
    if (rem < 0)
        rem = 0;
    if (rem > il)
        rem = il;
    return base + (uint32_t)rem;
}

/* Two's-complement narrowing, spelled out (the C conversion of an
 * out-of-range value is implementation-defined). */
static inline int32_t kw__k_i32(uint32_t v)
{
    if (v <= INT32_MAX)
        return (int32_t)v;
    return (int32_t)(v - 2147483648u) - INT32_MAX - 1;
}

/* Reads a kernel parameter from cuLaunchKernel-style args: pointers are
 * stored as uint64_t device addresses, scalars as int. */
static inline void *kw__k_arg_ptr(void **args, int i)
{
    return (void *)(uintptr_t)*(const uint64_t *)args[i];
}

static inline int32_t kw__k_arg_int(void **args, int i)
{
    return *(const int32_t *)args[i];
}


/* ---- check harness (case.c, gen.c) ---- */

#include <stdbool.h>
#include <stddef.h>

#define KW__K_MAX_BUFS 8
#define KW__K_MAX_ARGS 16

typedef enum kw__k_elem { KW__K_I32, KW__K_I64, KW__K_F32, KW__K_U8 } kw__k_elem;

/* One kernel array: host copy, reference result and device allocation. */
typedef struct kw__k_buf {
    const char *name;
    kw__k_elem type;
    size_t count;    /* elements; 0: the kernel gets a null pointer */
    size_t misalign; /* bytes the device pointer sits past its allocation */
    bool output;
    void *host;      /* inputs: the data; outputs: poison, then download */
    void *expect;    /* outputs: the reference's result, once computed */
    double *tol;     /* F32 outputs: allowed |got - expect| per element
                        (infinities and NaN stay bit-exact); NULL: exact */
    uint64_t base, dptr;
} kw__k_buf;

/* A kernel parameter: bufs[buf], or the int val when buf < 0. */
typedef struct kw__k_arg {
    int buf;
    int32_t val;
} kw__k_arg;

struct kw_k_case {
    kw_k_family fam;
    int64_t fields[KW_K_MAX_FIELDS];
    kw__k_buf bufs[KW__K_MAX_BUFS];
    size_t nbufs;
    kw__k_arg args[KW__K_MAX_ARGS]; /* in the kernel's parameter order */
    size_t nargs;
    unsigned grid[3], block[3];
    unsigned shmem; /* dynamic shared memory bytes */
    size_t bytes; /* kw_k_case_bytes() */
    bool upload_tried, uploaded, have_expect;
};

/* Appends an array parameter of count elements (zeroed host memory in
 * *host, NULL when count is 0).  KW_ENOMEM / KW_EINVAL (too many). */
int kw__k_case_buf(kw_k_case *c, const char *name, kw__k_elem type,
                   size_t count, bool output, void **host);

/* Appends an int parameter; returns its index in c->args (for late
 * values) or -1 when the table is full (a programmer error). */
int kw__k_case_int(kw_k_case *c, int32_t val);

/* splitmix64: tiny, seedable, good enough for test data. */
typedef struct kw__k_rng {
    uint64_t s;
} kw__k_rng;

static inline uint64_t kw__k_rand(kw__k_rng *r)
{
    uint64_t z = (r->s += 0x9e3779b97f4a7c15ull);
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    return z ^ (z >> 31);
}

/* Uniform in [lo, hi] (lo <= hi). */
static inline int64_t kw__k_rand_in(kw__k_rng *r, int64_t lo, int64_t hi)
{
    return lo + (int64_t)(kw__k_rand(r) % ((uint64_t)(hi - lo) + 1));
}

/* True with probability per_mille / 1000. */
static inline bool kw__k_chance(kw__k_rng *r, unsigned per_mille)
{
    return kw__k_rand(r) % 1000 < per_mille;
}

/* Per-family input generators (gen.c, gen_dcp.c, gen_indexer.c): add the
 * kernel's parameters in order, set grid, block, shmem and bytes.  They
 * are reached through the family table (family.c). */
typedef int (*kw__k_gen_fn)(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g);
int kw__k_gen_pcm(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g);
int kw__k_gen_csm(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g);
int kw__k_gen_ic(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g);
int kw__k_gen_pack(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g);
int kw__k_gen_topk(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g);
int kw__k_gen_logits(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g);
int kw__k_gen_itopk(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g);

/* Runs c's family generator (family.c's table). */
int kw__k_family_gen(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g);

/* Per-family CPU launches (cpu.c): the reference on kernel parameters. */
typedef int (*kw__k_cpu_fn)(const int64_t *fields, void **args);
int kw__k_cpu_pcm(const int64_t *fields, void **args);
int kw__k_cpu_csm(const int64_t *fields, void **args);
int kw__k_cpu_ic(const int64_t *fields, void **args);
int kw__k_cpu_pack(const int64_t *fields, void **args);
int kw__k_cpu_topk(const int64_t *fields, void **args);
int kw__k_cpu_logits(const int64_t *fields, void **args);
int kw__k_cpu_itopk(const int64_t *fields, void **args);

/* Per-family key loops (derive.c), reached through the family table. */
typedef void (*kw__k_derive_fn)(const kw_k_derive_in *in, kw_k_add_fn add,
                                void *ctx);
void kw__k_derive_pcm(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx);
void kw__k_derive_csm(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx);
void kw__k_derive_ic(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx);
void kw__k_derive_pack(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx);
void kw__k_derive_topk(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx);
void kw__k_derive_logits(const kw_k_derive_in *in, kw_k_add_fn add,
                         void *ctx);
void kw__k_derive_itopk(const kw_k_derive_in *in, kw_k_add_fn add, void *ctx);

/* indexer_logits' reference with the absolute-value sums (mag, laid out
 * as the logits; NULL: none), for the harness's tolerance. */
int kw__k_cpu_logits_mag(const int64_t *fields, void **args, double *mag);

/* A value of specialisation class rep (1, 2 or 16) in [lo, hi], or -1
 * when the class has none there. */
int64_t kw__k_rep_pick(kw__k_rng *g, int64_t rep, int64_t lo, int64_t hi);

#endif /* KW__K_INTERNAL_H */
