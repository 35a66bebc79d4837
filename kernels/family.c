/* family.c: the kernel families' names, key fields and NVRTC entry points. */
#include "kw_kernels.h"

#include "internal.h"
#include "kw_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* How a field's value is checked and rendered in the name expression. */
enum field_kind {
    F_REP,     /* specialisation class: 1, 2 or 16 */
    F_BOOL,    /* 0 or 1, rendered true/false */
    F_POS,     /* exact, >= 1 */
    F_NONNEG,  /* exact, >= 0 (a rank; checked against the world too) */
    F_THREADS, /* exact threads per block: multiple of 32 in [32, 1024] */
    F_WARPS,   /* exact warps per block: [1, 32] */
    F_HEADS,   /* indexer heads: [1, 256] */
    F_HDIM,    /* indexer head_dim: a multiple of 32 in [32, 512] */
    F_NEXTN,   /* decode queries per request: [1, 8] */
    F_TOPK     /* indexer top-k: [1, 2^20] */
};

typedef struct field_desc {
    const char *name;
    enum field_kind kind;
} field_desc;

/* Everything kernels/, jit/ and the check harness know about a family, in
 * one row: names, fields, launch geometry, key loops, CPU reference, case
 * builder and shape presets.  jit/ reads the names, fields, kinds and key
 * loops from here (registry.c, keys.c); the harness (case.c) reads gen,
 * cpu and presets. */
typedef struct family_desc {
    const char *name;
    const char *source;
    const char *entry;
    size_t nfields;
    field_desc fields[KW_K_MAX_FIELDS];
    /* Indices of (world, rank) to cross-check, or -1. */
    int world, rank;
    unsigned (*threads)(const int64_t *fields);
    unsigned (*shmem)(const int64_t *fields); /* NULL: none */
    int (*extra_check)(const int64_t *fields); /* NULL: none */
    kw__k_derive_fn derive;    /* its keys for one rank (§4) */
    kw_k_rank_use rank_use;
    kw__k_gen_fn gen;
    kw__k_cpu_fn cpu;
    /* {rows, batch, cols, max_len} of the edge, medium and production
     * presets (production sizes follow spec/kernels.md "How fast"). */
    kw_k_shape presets[3];
    bool sm90a; /* sm_90 keys build for sm_90a (kw_k_compile_arch) */
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

/* Field lists in the order of spec/warmup-keys.md §4 ("Fields:"), which is
 * also the kernels' template parameter order. */
static const family_desc families[KW_K_NFAMILIES] = {
    {"prefill_chunk_metadata", "prefill_chunk_metadata.cu",
     "kw_k_prefill_chunk_metadata", 8,
     {{"query_slice_start", F_REP}, {"query_slice_stop", F_REP},
      {"dcp_rank", F_REP}, {"dcp_world", F_REP}, {"dcp_interleave", F_REP},
      {"block_size", F_THREADS}, {"compress_ratio", F_POS},
      {"uncompressed_seq_lens_aligned", F_BOOL}},
     -1, -1, threads_pcm, NULL, NULL, kw__k_derive_pcm, KW_K_RANK_REP,
     kw__k_gen_pcm, kw__k_cpu_pcm,
     {{37, 5, 0, 300}, {3000, 40, 0, 20000}, {8192, 256, 0, 163840}}, false},
    {"compressed_slot_mapping", "compressed_slot_mapping.cu",
     "kw_k_compressed_slot_mapping", 6,
     {{"compress_ratio", F_POS}, {"triton_block_size", F_THREADS},
      {"block_size", F_REP}, {"dcp_world_size", F_POS},
      {"dcp_rank", F_NONNEG}, {"cp_kv_cache_interleave_size", F_POS}},
     3, 4, threads_csm, NULL, NULL, kw__k_derive_csm, KW_K_RANK_EXACT,
     kw__k_gen_csm, kw__k_cpu_csm,
     {{70, 5, 0, 600}, {20000, 40, 0, 40000}, {16777216, 256, 0, 131072}},
     false},
    {"index_conversion", "index_conversion.cu", "kw_k_index_conversion", 13,
     {{"block_size", F_POS}, {"block_stride_rows", F_POS},
      {"block_n", F_POS}, {"single_tile", F_BOOL}, {"num_warps", F_WARPS},
      {"has_prefill_workspace", F_BOOL}, {"count_valid", F_BOOL},
      {"compact_to_front", F_BOOL}, {"dcp_size", F_POS},
      {"dcp_rank", F_NONNEG}, {"dcp_interleave", F_POS},
      {"num_topk_tokens", F_POS}, {"block_table_stride", F_REP}},
     8, 9, threads_ic, NULL, NULL, kw__k_derive_ic, KW_K_RANK_EXACT,
     kw__k_gen_ic, kw__k_cpu_ic,
     {{9, 3, 0, 4096}, {300, 16, 0, 65536}, {65536, 256, 0, 163840}}, false},
    {"dcp_pack_topk_candidates", "dcp_pack_topk_candidates.cu",
     "kw_k_dcp_pack_topk_candidates", 6,
     {{"dcp_rank", F_NONNEG}, {"dcp_world_size", F_POS},
      {"cp_interleave", F_POS}, {"has_row_starts", F_BOOL}, {"topk", F_POS},
      {"block_size", F_THREADS}},
     1, 0, threads_pack, NULL, NULL, kw__k_derive_pack,
     KW_K_RANK_EXACT, kw__k_gen_pack, kw__k_cpu_pack,
     {{5, 0, 300, 0}, {200, 0, 5000, 0}, {16384, 0, 4096, 0}}, false},
    {"dcp_stable_topk", "dcp_stable_topk.cu", "kw_k_dcp_stable_topk", 2,
     {{"topk", F_POS}, {"num_candidates", F_POS}},
     -1, -1, threads_stable, NULL, NULL, kw__k_derive_topk,
     KW_K_RANK_EXACT, kw__k_gen_topk, kw__k_cpu_topk,
     {{6, 0, 0, 0}, {64, 0, 0, 0}, {256, 0, 0, 0}}, false},
    /* rows: queries (prefill) or requests (decode); cols: K rows (prefill)
     * or max_rows (decode). */
    {"indexer_logits", "indexer_logits.cu", "kw_k_indexer_logits", 5,
     {{"heads", F_HEADS}, {"head_dim", F_HDIM}, {"paged", F_BOOL},
      {"page_rows", F_NONNEG}, {"next_n", F_NEXTN}},
     -1, -1, threads_logits, shmem_logits, check_logits,
     kw__k_derive_logits, KW_K_RANK_NONE, kw__k_gen_logits,
     kw__k_cpu_logits,
     {{13, 3, 300, 0}, {40, 4, 1500, 0}, {4096, 128, 65536, 0}}, true},
    /* rows x cols of logits; windows inside the row. */
    {"indexer_topk", "indexer_topk.cu", "kw_k_indexer_topk", 2,
     {{"topk", F_TOPK}, {"windowed", F_BOOL}},
     -1, -1, threads_512, shmem_itopk, NULL, kw__k_derive_itopk,
     KW_K_RANK_NONE, kw__k_gen_itopk,
     kw__k_cpu_itopk,
     {{12, 0, 700, 0}, {64, 0, 20000, 0}, {4096, 0, 65536, 0}}, false},
};

static const family_desc *desc_of(kw_k_family f)
{
    if ((int)f < 0 || f >= KW_K_NFAMILIES)
        return NULL;
    return &families[f];
}

const char *kw_k_family_name(kw_k_family f)
{
    const family_desc *d = desc_of(f);
    return d ? d->name : NULL;
}

int kw_k_family_from_name(const char *name, kw_k_family *out)
{
    if (!name || !out)
        return KW_EINVAL;
    for (int i = 0; i < KW_K_NFAMILIES; i++) {
        if (strcmp(families[i].name, name) == 0) {
            *out = (kw_k_family)i;
            return 0;
        }
    }
    return KW_ENOFAMILY;
}

size_t kw_k_nfields(kw_k_family f)
{
    const family_desc *d = desc_of(f);
    return d ? d->nfields : 0;
}

const char *kw_k_field_name(kw_k_family f, size_t i)
{
    const family_desc *d = desc_of(f);
    return d && i < d->nfields ? d->fields[i].name : NULL;
}

const char *kw_k_source_name(kw_k_family f)
{
    const family_desc *d = desc_of(f);
    return d ? d->source : NULL;
}

const char *kw_k_entry_name(kw_k_family f)
{
    const family_desc *d = desc_of(f);
    return d ? d->entry : NULL;
}

static bool field_ok(enum field_kind k, int64_t v)
{
    switch (k) {
    case F_REP:
        return v == 1 || v == 2 || v == 16;
    case F_BOOL:
        return v == 0 || v == 1;
    case F_POS:
        return v >= 1 && v <= INT32_MAX;
    case F_NONNEG:
        return v >= 0 && v <= INT32_MAX;
    case F_THREADS:
        return v >= 32 && v <= 1024 && v % 32 == 0;
    case F_WARPS:
        return v >= 1 && v <= 32;
    case F_HEADS:
        return v >= 1 && v <= 256;
    case F_HDIM:
        return v >= 32 && v <= 512 && v % 32 == 0;
    case F_NEXTN:
        return v >= 1 && v <= 8;
    case F_TOPK:
        return v >= 1 && v <= (1 << 20);
    }
    return false;
}

int kw_k_fields_check(kw_k_family f, const int64_t *fields)
{
    const family_desc *d = desc_of(f);
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

bool kw_k_field_is_bool(kw_k_family f, size_t i)
{
    const family_desc *d = desc_of(f);
    return d && i < d->nfields && d->fields[i].kind == F_BOOL;
}

/* Formats at buf + *len (*len < cap); false once the text does not fit. */
static bool append(char *buf, size_t cap, size_t *len, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buf + *len, cap - *len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= cap - *len) {
        *len = cap;
        return false;
    }
    *len += (size_t)n;
    return true;
}

int kw_k_name_expr(kw_k_family f, const int64_t *fields, char *buf,
                   size_t cap)
{
    int rc = kw_k_fields_check(f, fields);
    if (rc < 0)
        return rc;
    if (!buf || cap == 0)
        return KW_ENOSPC;
    const family_desc *d = desc_of(f);
    size_t len = 0;
    bool ok = append(buf, cap, &len, "%s<", d->entry);
    for (size_t i = 0; ok && i < d->nfields; i++) {
        const char *sep = i ? "," : "";
        if (d->fields[i].kind == F_BOOL)
            ok = append(buf, cap, &len, "%s%s", sep,
                        fields[i] ? "true" : "false");
        else
            ok = append(buf, cap, &len, "%s%lld", sep, (long long)fields[i]);
    }
    if (ok && append(buf, cap, &len, ">"))
        return 0;
    buf[0] = '\0';
    return KW_ENOSPC;
}

unsigned kw_k_block_threads(kw_k_family f, const int64_t *fields)
{
    if (kw_k_fields_check(f, fields) < 0)
        return 0;
    return families[f].threads(fields);
}

unsigned kw_k_shmem_bytes(kw_k_family f, const int64_t *fields)
{
    if (kw_k_fields_check(f, fields) < 0 || !families[f].shmem)
        return 0;
    return families[f].shmem(fields);
}

unsigned kw_k_logits_queries(kw_k_family f, const int64_t *fields)
{
    if (f != KW_K_INDEXER_LOGITS || kw_k_fields_check(f, fields) < 0)
        return 0;
    return (unsigned)logits_queries(fields);
}

int kw_k_compile_arch(kw_k_family f, const char *arch, char *buf, size_t cap)
{
    const family_desc *d = desc_of(f);
    if (!d || !arch || !buf)
        return KW_EINVAL;
    const char *suffix = d->sm90a && strcmp(arch, "sm_90") == 0 ? "a" : "";
    int n = snprintf(buf, cap, "%s%s", arch, suffix);
    return n < 0 || (size_t)n >= cap ? KW_ENOSPC : 0;
}

int kw_k_derive(kw_k_family f, const kw_k_derive_in *in, kw_k_add_fn add,
                void *ctx)
{
    const family_desc *d = desc_of(f);
    if (!d)
        return KW_ENOFAMILY;
    if (!in || !add || in->dcp_world < 1 || in->rank < 0 ||
        in->rank >= in->dcp_world || in->block_size < 1)
        return KW_EINVAL;
    d->derive(in, add, ctx);
    return 0;
}

kw_k_rank_use kw_k_family_rank_use(kw_k_family f)
{
    const family_desc *d = desc_of(f);
    return d ? d->rank_use : KW_K_RANK_EXACT;
}

int kw__k_family_gen(kw_k_case *c, const kw_k_shape *s, kw__k_rng *g)
{
    return families[c->fam].gen(c, s, g);
}

int kw_k_shape_preset(kw_k_family f, kw_k_preset p, kw_k_shape *out)
{
    if (!out || (int)p < 0 || p > KW_K_PRESET_PRODUCTION)
        return KW_EINVAL;
    const family_desc *d = desc_of(f);
    if (!d)
        return KW_ENOFAMILY;
    *out = d->presets[p];
    return 0;
}

int kw_k_cpu_launch(kw_k_family f, const int64_t *fields, void **args)
{
    int rc = kw_k_fields_check(f, fields);
    if (rc < 0)
        return rc;
    if (!args)
        return KW_EINVAL;
    return families[f].cpu(fields, args);
}
