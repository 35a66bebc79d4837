/* kw_launch.h: the launch contract of the kernel families (prefix
 * kw_launch_).
 *
 * One description per family of what a caller needs to run its kernel:
 * the key's fields (names, kinds, the checks every key passes), the
 * threads, dynamic shared memory and grid of a launch, the arguments a
 * call takes (device pointers and runtime sizes, named as in
 * docs/spec/kernels.md), the dispatch from a call's sizes and the
 * deployment to the key that serves it (the specialisation classes of
 * docs/spec/warmup-keys.md §3), the checks of a call against its key,
 * and the kernel parameters laid out for cuLaunchKernel.
 *
 * This is a leaf: pure C, no CUDA header, no allocation, no I/O, no
 * state.  kernels/ (the check harness), jit/ (the key registry) and
 * libkwarm (client/kw_ops.h, which serving processes call) all read it,
 * so key derivation and dispatch read the same classes.  Every function
 * is thread-safe; returned strings are static.
 *
 * Families are numbered in registry order (spec/warmup-keys.md §4.1 .. §4.7:
 * 0 prefill_chunk_metadata .. 6 indexer_topk).  An *op* is one way to call a
 * family: indexer_logits has two (prefill, and paged decode), every
 * other family one, so there are eight ops.
 *
 * docs/spec/launch.md is the contract in prose.
 */
#ifndef KW_LAUNCH_H
#define KW_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------
 * Families and their key fields.
 * ---------------------------------------------------------------------- */

/* Number of families. */
#define KW_LAUNCH_NFAMILIES 7
/* Most key fields any family has (index_conversion's 13). */
#define KW_LAUNCH_MAX_FIELDS 13

/* How a field's value is checked and rendered. */
typedef enum kw_launch_kind {
    KW_LAUNCH_F_REP = 0, /* specialisation class: 1, 2 or 16 */
    KW_LAUNCH_F_BOOL,    /* 0 or 1 (true/false in JSON and templates) */
    KW_LAUNCH_F_POS,     /* exact, in [1, 2^31) */
    KW_LAUNCH_F_NONNEG,  /* exact, in [0, 2^31) (a rank: < its world) */
    KW_LAUNCH_F_THREADS, /* threads per block: a multiple of 32, <= 1024 */
    KW_LAUNCH_F_WARPS,   /* warps per block: [1, 32] */
    KW_LAUNCH_F_HEADS,   /* indexer heads: [1, 256] */
    KW_LAUNCH_F_HDIM,    /* indexer head_dim: a multiple of 32, [32, 512] */
    KW_LAUNCH_F_NEXTN,   /* decode queries per request: [1, 8] */
    KW_LAUNCH_F_TOPK     /* indexer top-k: [1, 2^20] */
} kw_launch_kind;

/* The family's spec name ("index_conversion"); NULL when fam is not one. */
const char *kw_launch_family_name(int fam);

/* The family named name, or -1. */
int kw_launch_family_from_name(const char *name);

/* Key fields of fam (0 for an unknown family). */
size_t kw_launch_nfields(int fam);

/* Name and kind of field i of fam; NULL / KW_LAUNCH_F_REP past the end. */
const char *kw_launch_field_name(int fam, size_t i);
kw_launch_kind kw_launch_field_kind(int fam, size_t i);

/* 0 when fields (kw_launch_nfields(fam) values) name a kernel that
 * compiles and launches: each field within its kind, a rank below its
 * world, and indexer_logits' prefill keys with page_rows 0 and next_n 1.
 * KW_EINVAL otherwise, KW_ENOFAMILY for fam. */
int kw_launch_fields_check(int fam, const int64_t *fields);

/* Threads per block of the key's kernel; 0 when the fields fail the
 * check.  A launch with another block size is wrong (indexer_logits
 * traps). */
unsigned kw_launch_threads(int fam, const int64_t *fields);

/* Dynamic shared memory bytes of a launch of the key (the same on every
 * arch); 0 when it takes none or the fields fail the check. */
unsigned kw_launch_shmem(int fam, const int64_t *fields);

/* Queries one indexer_logits block scores at once (prefill: consecutive
 * rows; decode: queries of one request); 0 for another family. */
unsigned kw_launch_logits_queries(int fam, const int64_t *fields);

/* The specialisation class of §3: 1 for 1, 16 for a multiple of 16 (0
 * included), else 2. */
int64_t kw_launch_rep(int64_t v);

/* ------------------------------------------------------------------------
 * Ops and their arguments.
 * ---------------------------------------------------------------------- */

typedef enum kw_launch_op {
    KW_LAUNCH_PREFILL_CHUNK_METADATA = 0,
    KW_LAUNCH_COMPRESSED_SLOT_MAPPING = 1,
    KW_LAUNCH_INDEX_CONVERSION = 2,
    KW_LAUNCH_DCP_PACK_TOPK_CANDIDATES = 3,
    KW_LAUNCH_DCP_STABLE_TOPK = 4,
    KW_LAUNCH_INDEXER_LOGITS = 5,       /* prefill (paged false) */
    KW_LAUNCH_INDEXER_TOPK = 6,
    KW_LAUNCH_INDEXER_LOGITS_PAGED = 7, /* decode (paged true) */
    KW_LAUNCH_NOPS = 8
} kw_launch_op;

/* Most arguments any op takes. */
#define KW_LAUNCH_MAX_ARGS 20

/* What an argument is.  Pointers are device addresses; a NULL (0)
 * optional pointer means "not used" and may change the key (index_
 * conversion's valid_count sets count_valid, for example). */
typedef enum kw_launch_arg_kind {
    KW_LAUNCH_IN = 0,  /* device pointer read */
    KW_LAUNCH_OUT,     /* device pointer written */
    KW_LAUNCH_OPT_IN,  /* optional device pointer read (0: not used) */
    KW_LAUNCH_OPT_OUT, /* optional device pointer written (0: not used) */
    KW_LAUNCH_SIZE,    /* a runtime size or scalar */
    KW_LAUNCH_FLAG     /* 0 or 1: chooses the key, not passed on */
} kw_launch_arg_kind;

/* One call's arguments, in the op's order (kw_launch_arg_name()): device
 * pointers cast to int64, sizes and flags as values.  Unused slots are
 * ignored. */
typedef struct kw_launch_call {
    int64_t a[KW_LAUNCH_MAX_ARGS];
} kw_launch_call;

/* Argument indices of each op, in kw_launch_call.a[] (the order of
 * kw_launch_arg_name()).  C callers fill a call by these names:
 *     kw_launch_call c = {0};
 *     c.a[KW_LAUNCH_TOPK_LOGITS] = (int64_t)logits_dptr; ... */
enum { /* prefill_chunk_metadata */
    KW_LAUNCH_PCM_QUERY_START_LOC, KW_LAUNCH_PCM_SEQ_LENS, KW_LAUNCH_PCM_CU_K,
    KW_LAUNCH_PCM_NUM_REQS, KW_LAUNCH_PCM_SLICE_START,
    KW_LAUNCH_PCM_SLICE_STOP, KW_LAUNCH_PCM_TOTAL_K, KW_LAUNCH_PCM_KS,
    KW_LAUNCH_PCM_KE, KW_LAUNCH_PCM_TOKEN_TO_SEQ,
    KW_LAUNCH_PCM_COMPRESS_RATIO, KW_LAUNCH_PCM_DCP_LOCAL
};
enum { /* compressed_slot_mapping */
    KW_LAUNCH_CSM_SLOT_MAPPING, KW_LAUNCH_CSM_QUERY_START_LOC,
    KW_LAUNCH_CSM_SEQ_LENS, KW_LAUNCH_CSM_BLOCK_TABLE,
    KW_LAUNCH_CSM_NUM_TOKENS, KW_LAUNCH_CSM_NUM_REQS, KW_LAUNCH_CSM_WIDTH,
    KW_LAUNCH_CSM_BLOCK_SIZE, KW_LAUNCH_CSM_OUT,
    KW_LAUNCH_CSM_COMPRESS_RATIO, KW_LAUNCH_CSM_DCP_LOCAL
};
enum { /* index_conversion */
    KW_LAUNCH_IC_REQ_ID, KW_LAUNCH_IC_BLOCK_TABLE, KW_LAUNCH_IC_TOPK_POS,
    KW_LAUNCH_IC_PREFILL_REQ, KW_LAUNCH_IC_WORKSPACE_START,
    KW_LAUNCH_IC_NUM_ROWS, KW_LAUNCH_IC_NUM_REQS, KW_LAUNCH_IC_NUM_PREFILL,
    KW_LAUNCH_IC_WIDTH, KW_LAUNCH_IC_WORKSPACE_RANK_STRIDE, KW_LAUNCH_IC_OUT,
    KW_LAUNCH_IC_VALID_COUNT, KW_LAUNCH_IC_COMPACT_TO_FRONT,
    KW_LAUNCH_IC_DCP_LOCAL
};
enum { /* dcp_pack_topk_candidates */
    KW_LAUNCH_PACK_LOGITS, KW_LAUNCH_PACK_TOPK_LOCAL,
    KW_LAUNCH_PACK_ROW_STARTS, KW_LAUNCH_PACK_NUM_ROWS, KW_LAUNCH_PACK_COLS,
    KW_LAUNCH_PACK_PACKED
};
enum { /* dcp_stable_topk */
    KW_LAUNCH_STABLE_GATHERED, KW_LAUNCH_STABLE_NUM_ROWS,
    KW_LAUNCH_STABLE_OUT
};
enum { /* indexer_logits (prefill) */
    KW_LAUNCH_LOGITS_Q, KW_LAUNCH_LOGITS_W, KW_LAUNCH_LOGITS_K,
    KW_LAUNCH_LOGITS_K_SCALE, KW_LAUNCH_LOGITS_KS, KW_LAUNCH_LOGITS_KE,
    KW_LAUNCH_LOGITS_NUM_ROWS, KW_LAUNCH_LOGITS_NUM_K,
    KW_LAUNCH_LOGITS_STRIDE, KW_LAUNCH_LOGITS_LOGITS,
    KW_LAUNCH_LOGITS_HEADS, KW_LAUNCH_LOGITS_HEAD_DIM
};
enum { /* indexer_topk */
    KW_LAUNCH_TOPK_LOGITS, KW_LAUNCH_TOPK_KS, KW_LAUNCH_TOPK_KE,
    KW_LAUNCH_TOPK_NUM_ROWS, KW_LAUNCH_TOPK_STRIDE, KW_LAUNCH_TOPK_TOPK_POS,
    KW_LAUNCH_TOPK_ROW_END
};
enum { /* indexer_logits_paged (decode) */
    KW_LAUNCH_PAGED_Q, KW_LAUNCH_PAGED_W, KW_LAUNCH_PAGED_K_PAGES,
    KW_LAUNCH_PAGED_K_SCALE_PAGES, KW_LAUNCH_PAGED_BLOCK_TABLE,
    KW_LAUNCH_PAGED_ROW_END, KW_LAUNCH_PAGED_NUM_REQS,
    KW_LAUNCH_PAGED_WIDTH, KW_LAUNCH_PAGED_MAX_ROWS,
    KW_LAUNCH_PAGED_LOGITS, KW_LAUNCH_PAGED_PAGE_ROWS,
    KW_LAUNCH_PAGED_NEXT_N, KW_LAUNCH_PAGED_HEADS, KW_LAUNCH_PAGED_HEAD_DIM
};

/* The op's name ("indexer_logits_paged"); NULL for an unknown op. */
const char *kw_launch_op_name(kw_launch_op op);

/* The op named name, or -1. */
int kw_launch_op_from_name(const char *name);

/* The family op calls (indexer_logits for both of its ops); -1. */
int kw_launch_op_family(kw_launch_op op);

/* Arguments op takes (0 for an unknown op), and the name and kind of
 * argument i (NULL / KW_LAUNCH_SIZE past the end).  The names are those
 * of docs/spec/kernels.md; the order is the kernel's parameter order for
 * pointers and sizes the kernel takes, then what only chooses the key. */
size_t kw_launch_nargs(kw_launch_op op);
const char *kw_launch_arg_name(kw_launch_op op, size_t i);
kw_launch_arg_kind kw_launch_arg_kind_of(kw_launch_op op, size_t i);

/* Index of op's argument named name, or -1. */
int kw_launch_arg_index(kw_launch_op op, const char *name);

/* ------------------------------------------------------------------------
 * The deployment one process serves: the settings dispatch reads.  Fill
 * it from the keys document (client/kw_ops.h does) or by hand.
 * ---------------------------------------------------------------------- */

/* Most compress ratios a deployment may list (ratios_p and ratios_s of
 * spec/warmup-keys.md §4 each). */
#define KW_LAUNCH_MAX_RATIOS 16

typedef struct kw_launch_deploy {
    int64_t index_topk;                    /* >= 1 */
    int64_t index_n_heads, index_head_dim; /* 0: no indexer_logits */
    int64_t dcp_world, dcp_rank, dcp_interleave, pcp; /* one rank */
    int64_t max_num_batched_tokens, max_num_seqs;
    int64_t block_size, block_stride_rows, max_model_len;
    int64_t num_speculative_tokens;
    int64_t ratios_p[KW_LAUNCH_MAX_RATIOS];
    int64_t ratios_s[KW_LAUNCH_MAX_RATIOS];
    size_t nratios_p, nratios_s;
} kw_launch_deploy;

/* 0 when d is a deployment dispatch can read: topk, world, interleave,
 * pcp, block sizes, lengths >= 1, 0 <= rank < world, speculative tokens
 * in [0, 7], ratio counts within KW_LAUNCH_MAX_RATIOS.  Else KW_EINVAL
 * with the setting named in err (errlen bytes, may be NULL). */
int kw_launch_deploy_check(const kw_launch_deploy *d, char *err,
                           size_t errlen);

/* The block-table width vLLM allocates for d (spec §4.3): blocks for
 * max_model_len over the DCP world, rounded up to a multiple of 128 /
 * gcd(128, block_size). */
int64_t kw_launch_table_width(const kw_launch_deploy *d);

/* The deployment setting a key field follows ("max_num_batched_tokens"
 * for query_slice_stop, "num_speculative_tokens" for next_n, ...): the
 * setting to change when a call's key was not warmed.  "" for a field no
 * setting chooses (a pointer's alignment). */
const char *kw_launch_field_setting(int fam, size_t i);

/* ------------------------------------------------------------------------
 * Dispatch, checks, geometry and parameters of one call.
 * ---------------------------------------------------------------------- */

/* The key that serves call under d: writes the family's fields (in key
 * order) into fields[KW_LAUNCH_MAX_FIELDS].  Reads the sizes, flags and
 * whether optional pointers are given (and seq_lens' alignment); never
 * dereferences a pointer.  Returns 0, or KW_EINVAL with the argument and
 * its allowed values named in err when no key can serve the call (a
 * compress_ratio the model does not have, a DCP op on a deployment
 * without DCP). */
int kw_launch_dispatch(kw_launch_op op, const kw_launch_deploy *d,
                       const kw_launch_call *call, int64_t *fields,
                       char *err, size_t errlen);

/* Checks call against the key fields: every required pointer given,
 * every size within the spec's bounds and in the class its key field
 * names (a runtime block_size of 16 is not class 1), the sizes the
 * kernel assumes equal (index_conversion's width class, indexer_logits'
 * heads and head_dim, the paged op's page_rows and next_n), and the DCP
 * geometry the key holds against d's (the one the kernel is given).  0,
 * or KW_EINVAL with the argument and the allowed values named in err. */
int kw_launch_check(kw_launch_op op, const kw_launch_deploy *d,
                    const int64_t *fields, const kw_launch_call *call,
                    char *err, size_t errlen);

/* Launch geometry: grid, block and dynamic shared memory. */
typedef struct kw_launch_geo {
    unsigned grid[3], block[3];
    unsigned shmem;
} kw_launch_geo;

/* The geometry of a launch of call with key fields.  sm_count (the
 * device's SMs, 0 when unknown: taken as 132) sizes the paged
 * indexer_logits grid to whole waves.  A call with nothing to do (no
 * rows) gets grid[0] == 0: skip the launch.  0, or KW_EINVAL when the
 * grid would not fit the driver's limits. */
int kw_launch_geometry(kw_launch_op op, const int64_t *fields,
                       const kw_launch_call *call, unsigned sm_count,
                       kw_launch_geo *out);

/* Storage for a launch's kernel parameters: args[i] points into slot[]
 * (64-bit pointers, 32-bit ints), as cuLaunchKernel's kernelParams. */
#define KW_LAUNCH_MAX_PARAMS 16
typedef struct kw_launch_params {
    uint64_t slot[KW_LAUNCH_MAX_PARAMS];
    void *args[KW_LAUNCH_MAX_PARAMS];
    size_t n;
} kw_launch_params;

/* Lays call out as the kernel's parameters (docs/spec/kernels.md's
 * order), with the values the kernel takes from the deployment (the DCP
 * geometry prefill_chunk_metadata gets) from d.  p must not move while
 * p->args is used.  0 or KW_EINVAL (unknown op). */
int kw_launch_params_build(kw_launch_op op, const int64_t *fields,
                           const kw_launch_deploy *d,
                           const kw_launch_call *call, kw_launch_params *p);

/* The inverse of kw_launch_params_build(): the call behind a launch's
 * kernel parameters (params as cuLaunchKernel's kernelParams) of key
 * fields, with what only the key holds (compress_ratio, compact_to_front,
 * page_rows, ...) from fields.  Values the deployment gives the kernel
 * (prefill_chunk_metadata's DCP geometry) are left out; dcp_local is 0.
 * For the check harness, which builds kernel parameters itself and takes
 * its geometry from here.  0 or KW_EINVAL. */
int kw_launch_call_from_params(kw_launch_op op, const int64_t *fields,
                               void *const *params, kw_launch_call *out);

/* The op that launches key (fam, fields): indexer_logits_paged for a
 * paged indexer_logits key, else the family's own. */
kw_launch_op kw_launch_op_of_key(int fam, const int64_t *fields);

#ifdef __cplusplus
}
#endif

#endif /* KW_LAUNCH_H */
