/* family.c: the kernel families' names, key fields and NVRTC entry points. */
#include "kw_kernels.h"

#include "internal.h"
#include "kw_err.h"
#include "kw_launch.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* What kernels/ adds to launch/'s description of a family (kw_launch.h:
 * names, fields, threads, shared memory): its source and entry point, its
 * key loops, its check-harness case builder, CPU runner and shape
 * presets.  jit/ reads the key loops from here (keys.c); the harness
 * (case.c) reads gen, cpu and presets. */
typedef struct family_desc {
    const char *source;
    const char *entry;
    kw__k_derive_fn derive; /* its keys for one rank (§4) */
    kw_k_rank_use rank_use;
    kw__k_gen_fn gen;
    kw__k_cpu_fn cpu;
    /* {rows, batch, cols, max_len} of the edge, medium and production
     * presets (production sizes follow spec/kernels.md "How fast"). */
    kw_k_shape presets[3];
    bool sm90a; /* sm_90 keys build for sm_90a (kw_k_compile_arch) */
} family_desc;

/* kw_k_family and kw_launch.h number the families alike. */
_Static_assert(KW_K_NFAMILIES == KW_LAUNCH_NFAMILIES, "family count");
_Static_assert(KW_K_MAX_FIELDS == KW_LAUNCH_MAX_FIELDS, "field count");

static const family_desc families[KW_K_NFAMILIES] = {
    {"prefill_chunk_metadata.cu", "kw_k_prefill_chunk_metadata",
     kw__k_derive_pcm, KW_K_RANK_REP, kw__k_gen_pcm, kw__k_cpu_pcm,
     {{37, 5, 0, 300}, {3000, 40, 0, 20000}, {8192, 256, 0, 163840}}, false},
    {"compressed_slot_mapping.cu", "kw_k_compressed_slot_mapping",
     kw__k_derive_csm, KW_K_RANK_EXACT, kw__k_gen_csm, kw__k_cpu_csm,
     {{70, 5, 0, 600}, {20000, 40, 0, 40000}, {16777216, 256, 0, 131072}},
     false},
    {"index_conversion.cu", "kw_k_index_conversion", kw__k_derive_ic,
     KW_K_RANK_EXACT, kw__k_gen_ic, kw__k_cpu_ic,
     {{9, 3, 0, 4096}, {300, 16, 0, 65536}, {65536, 256, 0, 163840}}, false},
    {"dcp_pack_topk_candidates.cu", "kw_k_dcp_pack_topk_candidates",
     kw__k_derive_pack, KW_K_RANK_EXACT, kw__k_gen_pack, kw__k_cpu_pack,
     {{5, 0, 300, 0}, {200, 0, 5000, 0}, {16384, 0, 4096, 0}}, false},
    {"dcp_stable_topk.cu", "kw_k_dcp_stable_topk", kw__k_derive_topk,
     KW_K_RANK_EXACT, kw__k_gen_topk, kw__k_cpu_topk,
     {{6, 0, 0, 0}, {64, 0, 0, 0}, {256, 0, 0, 0}}, false},
    /* rows: queries (prefill) or requests (decode); cols: K rows (prefill)
     * or max_rows (decode). */
    {"indexer_logits.cu", "kw_k_indexer_logits", kw__k_derive_logits,
     KW_K_RANK_NONE, kw__k_gen_logits, kw__k_cpu_logits,
     {{13, 3, 300, 0}, {40, 4, 1500, 0}, {4096, 128, 65536, 0}}, true},
    /* rows x cols of logits; windows inside the row. */
    {"indexer_topk.cu", "kw_k_indexer_topk", kw__k_derive_itopk,
     KW_K_RANK_NONE, kw__k_gen_itopk, kw__k_cpu_itopk,
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
    return kw_launch_family_name((int)f);
}

int kw_k_family_from_name(const char *name, kw_k_family *out)
{
    if (!name || !out)
        return KW_EINVAL;
    int f = kw_launch_family_from_name(name);
    if (f < 0)
        return KW_ENOFAMILY;
    *out = (kw_k_family)f;
    return 0;
}

size_t kw_k_nfields(kw_k_family f)
{
    return kw_launch_nfields((int)f);
}

const char *kw_k_field_name(kw_k_family f, size_t i)
{
    return kw_launch_field_name((int)f, i);
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

int kw_k_fields_check(kw_k_family f, const int64_t *fields)
{
    return kw_launch_fields_check((int)f, fields);
}

bool kw_k_field_is_bool(kw_k_family f, size_t i)
{
    return i < kw_k_nfields(f) &&
           kw_launch_field_kind((int)f, i) == KW_LAUNCH_F_BOOL;
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
    for (size_t i = 0; ok && i < kw_k_nfields(f); i++) {
        const char *sep = i ? "," : "";
        if (kw_k_field_is_bool(f, i))
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
    return kw_launch_threads((int)f, fields);
}

unsigned kw_k_shmem_bytes(kw_k_family f, const int64_t *fields)
{
    return kw_launch_shmem((int)f, fields);
}

unsigned kw_k_logits_queries(kw_k_family f, const int64_t *fields)
{
    return kw_launch_logits_queries((int)f, fields);
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
