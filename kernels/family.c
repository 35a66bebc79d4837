/* family.c: the kernel families' names, key fields and NVRTC entry points. */
#include "kw_kernels.h"

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
    F_WARPS    /* exact warps per block: [1, 32] */
};

typedef struct field_desc {
    const char *name;
    enum field_kind kind;
} field_desc;

typedef struct family_desc {
    const char *name;
    const char *source;
    const char *entry;
    size_t nfields;
    field_desc fields[KW_K_MAX_FIELDS];
    /* Indices of (world, rank) to cross-check, or -1. */
    int world, rank;
} family_desc;

/* Field lists in the order of spec/warmup-keys.md §4 ("Fields:"), which is
 * also the kernels' template parameter order. */
static const family_desc families[KW_K_NFAMILIES] = {
    {"prefill_chunk_metadata", "prefill_chunk_metadata.cu",
     "kw_k_prefill_chunk_metadata", 8,
     {{"query_slice_start", F_REP}, {"query_slice_stop", F_REP},
      {"dcp_rank", F_REP}, {"dcp_world", F_REP}, {"dcp_interleave", F_REP},
      {"block_size", F_THREADS}, {"compress_ratio", F_POS},
      {"uncompressed_seq_lens_aligned", F_BOOL}},
     -1, -1},
    {"compressed_slot_mapping", "compressed_slot_mapping.cu",
     "kw_k_compressed_slot_mapping", 6,
     {{"compress_ratio", F_POS}, {"triton_block_size", F_THREADS},
      {"block_size", F_REP}, {"dcp_world_size", F_POS},
      {"dcp_rank", F_NONNEG}, {"cp_kv_cache_interleave_size", F_POS}},
     3, 4},
    {"index_conversion", "index_conversion.cu", "kw_k_index_conversion", 13,
     {{"block_size", F_POS}, {"block_stride_rows", F_POS},
      {"block_n", F_POS}, {"single_tile", F_BOOL}, {"num_warps", F_WARPS},
      {"has_prefill_workspace", F_BOOL}, {"count_valid", F_BOOL},
      {"compact_to_front", F_BOOL}, {"dcp_size", F_POS},
      {"dcp_rank", F_NONNEG}, {"dcp_interleave", F_POS},
      {"num_topk_tokens", F_POS}, {"block_table_stride", F_REP}},
     8, 9},
    {"dcp_pack_topk_candidates", "dcp_pack_topk_candidates.cu",
     "kw_k_dcp_pack_topk_candidates", 6,
     {{"dcp_rank", F_NONNEG}, {"dcp_world_size", F_POS},
      {"cp_interleave", F_POS}, {"has_row_starts", F_BOOL}, {"topk", F_POS},
      {"block_size", F_THREADS}},
     1, 0},
    {"dcp_stable_topk", "dcp_stable_topk.cu", "kw_k_dcp_stable_topk", 2,
     {{"topk", F_POS}, {"num_candidates", F_POS}},
     -1, -1},
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
    return 0;
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
    switch (f) {
    case KW_K_PREFILL_CHUNK_METADATA:
        return (unsigned)fields[5];
    case KW_K_COMPRESSED_SLOT_MAPPING:
        return (unsigned)fields[1];
    case KW_K_INDEX_CONVERSION:
        return (unsigned)fields[4] * 32u;
    case KW_K_DCP_PACK_TOPK_CANDIDATES:
        return (unsigned)fields[5];
    case KW_K_DCP_STABLE_TOPK: /* kw_k_topk_threads() in the source */
        return fields[1] > 4096 ? 1024u : 512u;
    default:
        return 0;
    }
}
