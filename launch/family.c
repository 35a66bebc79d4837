/* family.c: the families' key fields, their checks, and the threads and
 * shared memory of a launch (kw_launch.h).  kernels/family.c holds what
 * only the compiler and the check harness need (sources, key loops,
 * references) and reads the rest from here. */
#include "kw_launch.h"

#include "kw_err.h"

#include <string.h>

typedef struct field_desc {
    const char *name;
    kw_launch_kind kind;
    const char *setting; /* kw_launch_field_setting() */
} field_desc;

typedef struct family_desc {
    const char *name;
    size_t nfields;
    field_desc fields[KW_LAUNCH_MAX_FIELDS];
    int world, rank; /* indices of (world, rank) to cross-check, or -1 */
    unsigned (*threads)(const int64_t *f);
    unsigned (*shmem)(const int64_t *f); /* NULL: none */
    int (*extra_check)(const int64_t *f); /* NULL: none */
} family_desc;

static unsigned threads_pcm(const int64_t *f) { return (unsigned)f[5]; }
static unsigned threads_csm(const int64_t *f) { return (unsigned)f[1]; }
static unsigned threads_ic(const int64_t *f) { return (unsigned)f[4] * 32u; }
static unsigned threads_pack(const int64_t *f) { return (unsigned)f[5]; }

/* kw_k_topk_threads() in dcp_stable_topk.cu. */
static unsigned threads_stable(const int64_t *f)
{
    return f[1] > 4096 ? 1024u : 512u;
}

/* IT_THREADS in indexer_topk.cu. */
static unsigned threads_512(const int64_t *f)
{
    (void)f;
    return 512u;
}

/* IT_SMEM in indexer_topk.cu: a 2048-bin histogram and two 4096-key
 * buffers. */
static unsigned shmem_itopk(const int64_t *f)
{
    (void)f;
    return 2048u * 4u + 2u * 4096u * 8u;
}

/* The formulas of indexer_logits.cu (il_hp, il_cols, il_stages, il_nwg,
 * il_qb, il_smem_bytes): heads padded to a power of two >= 16, queries per
 * block filling 128 GEMM columns (256 for 256 heads) per warpgroup for
 * prefill (4 warpgroups where 128 columns each leave room for 2 stages,
 * else 2), per block for decode, 1-4 stages of 128-row K tiles and their
 * scales under 212 KiB. */
static int pow2ceil(int x)
{
    int p = 1;
    while (p < x)
        p <<= 1;
    return p;
}

static int logits_stages(int nq, int d)
{
    int s = (217088 - nq * d - nq * 4) / (128 * (d + 4));
    return s < 1 ? 1 : s > 4 ? 4 : s;
}

/* Warpgroups per block (il_nwg). */
static int logits_nwg(const int64_t *f)
{
    int hp = pow2ceil(f[0] < 16 ? 16 : (int)f[0]);
    return !f[2] && hp < 256 && logits_stages(512, (int)f[1]) >= 2 ? 4 : 2;
}

static unsigned threads_logits(const int64_t *f)
{
    return 128u * (unsigned)logits_nwg(f);
}

static int logits_queries(const int64_t *f)
{
    int hp = pow2ceil(f[0] < 16 ? 16 : (int)f[0]);
    int cols = hp >= 256 ? 256 : 128;
    if (!f[2])
        return logits_nwg(f) * cols / hp; /* each warpgroup its own cols */
    int nn = 1;
    while (nn * 2 <= f[4])
        nn *= 2;
    return nn < cols / hp ? nn : cols / hp;
}

static unsigned shmem_logits(const int64_t *f)
{
    int hp = pow2ceil(f[0] < 16 ? 16 : (int)f[0]);
    int nq = logits_queries(f) * hp, d = (int)f[1];
    int s = logits_stages(nq, d);
    return (unsigned)(nq * d + s * 128 * (d + 4) + nq * 4);
}

/* Prefill keys have page_rows 0 and next_n 1; decode keys page_rows >= 1. */
static int check_logits(const int64_t *f)
{
    if (f[2])
        return f[3] >= 1 ? 0 : KW_EINVAL;
    return f[3] == 0 && f[4] == 1 ? 0 : KW_EINVAL;
}

#define REP KW_LAUNCH_F_REP
#define BOOL KW_LAUNCH_F_BOOL
#define POS KW_LAUNCH_F_POS
#define NONNEG KW_LAUNCH_F_NONNEG
#define THREADS KW_LAUNCH_F_THREADS

/* Field lists in the order of spec/warmup-keys.md §4 ("Fields:"), which is
 * also the kernels' template parameter order; beside each, the setting
 * that chooses it (for the message of a key that was not warmed). */
static const family_desc families[KW_LAUNCH_NFAMILIES] = {
    {"prefill_chunk_metadata", 8,
     {{"query_slice_start", REP, "max_num_batched_tokens"},
      {"query_slice_stop", REP, "max_num_batched_tokens"},
      {"dcp_rank", REP, "dcp_rank"}, {"dcp_world", REP, "dcp_world"},
      {"dcp_interleave", REP, "dcp_interleave"},
      {"block_size", THREADS, ""},
      {"compress_ratio", POS, "compress_ratios"},
      {"uncompressed_seq_lens_aligned", BOOL, ""}},
     -1, -1, threads_pcm, NULL, NULL},
    {"compressed_slot_mapping", 6,
     {{"compress_ratio", POS, "compress_ratios"},
      {"triton_block_size", THREADS, ""},
      {"block_size", REP, "block_size"},
      {"dcp_world_size", POS, "dcp_world"}, {"dcp_rank", NONNEG, "dcp_rank"},
      {"cp_kv_cache_interleave_size", POS, "dcp_interleave"}},
     3, 4, threads_csm, NULL, NULL},
    {"index_conversion", 13,
     {{"block_size", POS, "block_size"},
      {"block_stride_rows", POS, "block_stride_rows"},
      {"block_n", POS, "index_topk"}, {"single_tile", BOOL, "index_topk"},
      {"num_warps", KW_LAUNCH_F_WARPS, "index_topk"},
      {"has_prefill_workspace", BOOL, "pcp"}, {"count_valid", BOOL, ""},
      {"compact_to_front", BOOL, "dcp_world"}, {"dcp_size", POS, "dcp_world"},
      {"dcp_rank", NONNEG, "dcp_rank"},
      {"dcp_interleave", POS, "dcp_interleave"},
      {"num_topk_tokens", POS, "index_topk"},
      {"block_table_stride", REP, "max_model_len"}},
     8, 9, threads_ic, NULL, NULL},
    {"dcp_pack_topk_candidates", 6,
     {{"dcp_rank", NONNEG, "dcp_rank"}, {"dcp_world_size", POS, "dcp_world"},
      {"cp_interleave", POS, "dcp_interleave"},
      {"has_row_starts", BOOL, ""}, {"topk", POS, "index_topk"},
      {"block_size", THREADS, ""}},
     1, 0, threads_pack, NULL, NULL},
    {"dcp_stable_topk", 2,
     {{"topk", POS, "index_topk"}, {"num_candidates", POS, "dcp_world"}},
     -1, -1, threads_stable, NULL, NULL},
    {"indexer_logits", 5,
     {{"heads", KW_LAUNCH_F_HEADS, "index_n_heads"},
      {"head_dim", KW_LAUNCH_F_HDIM, "index_head_dim"},
      {"paged", BOOL, ""}, {"page_rows", NONNEG, "block_size"},
      {"next_n", KW_LAUNCH_F_NEXTN, "num_speculative_tokens"}},
     -1, -1, threads_logits, shmem_logits, check_logits},
    {"indexer_topk", 2,
     {{"topk", KW_LAUNCH_F_TOPK, "index_topk"}, {"windowed", BOOL, ""}},
     -1, -1, threads_512, shmem_itopk, NULL},
};

static const family_desc *desc_of(int fam)
{
    return fam >= 0 && fam < KW_LAUNCH_NFAMILIES ? &families[fam] : NULL;
}

const char *kw_launch_family_name(int fam)
{
    const family_desc *d = desc_of(fam);
    return d ? d->name : NULL;
}

int kw_launch_family_from_name(const char *name)
{
    for (int i = 0; name && i < KW_LAUNCH_NFAMILIES; i++)
        if (strcmp(families[i].name, name) == 0)
            return i;
    return -1;
}

size_t kw_launch_nfields(int fam)
{
    const family_desc *d = desc_of(fam);
    return d ? d->nfields : 0;
}

const char *kw_launch_field_name(int fam, size_t i)
{
    const family_desc *d = desc_of(fam);
    return d && i < d->nfields ? d->fields[i].name : NULL;
}

kw_launch_kind kw_launch_field_kind(int fam, size_t i)
{
    const family_desc *d = desc_of(fam);
    return d && i < d->nfields ? d->fields[i].kind : KW_LAUNCH_F_REP;
}

const char *kw_launch_field_setting(int fam, size_t i)
{
    const family_desc *d = desc_of(fam);
    return d && i < d->nfields ? d->fields[i].setting : "";
}

static bool field_ok(kw_launch_kind k, int64_t v)
{
    switch (k) {
    case KW_LAUNCH_F_REP:
        return v == 1 || v == 2 || v == 16;
    case KW_LAUNCH_F_BOOL:
        return v == 0 || v == 1;
    case KW_LAUNCH_F_POS:
        return v >= 1 && v <= INT32_MAX;
    case KW_LAUNCH_F_NONNEG:
        return v >= 0 && v <= INT32_MAX;
    case KW_LAUNCH_F_THREADS:
        return v >= 32 && v <= 1024 && v % 32 == 0;
    case KW_LAUNCH_F_WARPS:
        return v >= 1 && v <= 32;
    case KW_LAUNCH_F_HEADS:
        return v >= 1 && v <= 256;
    case KW_LAUNCH_F_HDIM:
        return v >= 32 && v <= 512 && v % 32 == 0;
    case KW_LAUNCH_F_NEXTN:
        return v >= 1 && v <= 8;
    case KW_LAUNCH_F_TOPK:
        return v >= 1 && v <= (1 << 20);
    }
    return false;
}

int kw_launch_fields_check(int fam, const int64_t *fields)
{
    const family_desc *d = desc_of(fam);
    if (!d)
        return KW_ENOFAMILY;
    if (!fields)
        return KW_EINVAL;
    for (size_t i = 0; i < d->nfields; i++)
        if (!field_ok(d->fields[i].kind, fields[i]))
            return KW_EINVAL;
    if (d->world >= 0 && fields[d->rank] >= fields[d->world])
        return KW_EINVAL;
    return d->extra_check ? d->extra_check(fields) : 0;
}

unsigned kw_launch_threads(int fam, const int64_t *fields)
{
    if (kw_launch_fields_check(fam, fields) < 0)
        return 0;
    return families[fam].threads(fields);
}

unsigned kw_launch_shmem(int fam, const int64_t *fields)
{
    if (kw_launch_fields_check(fam, fields) < 0 || !families[fam].shmem)
        return 0;
    return families[fam].shmem(fields);
}

unsigned kw_launch_logits_queries(int fam, const int64_t *fields)
{
    if (fam != 5 || kw_launch_fields_check(fam, fields) < 0)
        return 0;
    return (unsigned)logits_queries(fields);
}

int64_t kw_launch_rep(int64_t v)
{
    if (v == 1)
        return 1;
    return v % 16 == 0 ? 16 : 2;
}
