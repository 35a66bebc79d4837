/* keys.c: deriving the compile keys of §4 and the sizes of §5.
 *
 * Each family's loops are written as in the spec, for one rank at a time,
 * in kernels/derive.c (the family table); kw_keys_derive() runs them for
 * every rank the deployment names, keeps the first of equal keys (a hash
 * index over the fields), then crosses the result with every arch and
 * digests each key, or packs it (kw_keys_derive_packed: keypack.c).
 */
#include "kw_keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "internal.h"
#include "kw_err.h"

/* Keys of one family under construction, de-duplicated on insert.  A
 * row is kept as its fields' zigzag varints (kw__keys_put_fields), not as
 * int64s: the largest family's table is the derivation's peak, and its
 * fields are mostly one or two bytes.  Equal rows encode to equal bytes,
 * so rows are hashed and compared encoded, and decoded only to emit. */
typedef struct keyvec {
    kw_k_family family;
    size_t nfields;
    uint8_t *bytes;  /* the rows' encodings, back to back */
    size_t len, bcap;
    uint32_t *off;   /* row i is bytes[off[i], off[i + 1]); cap + 1 */
    size_t n, cap;
    uint32_t *index; /* open addressing: row number + 1, 0 = empty */
    size_t icap;     /* power of two, at least 2 * cap */
    int rc;          /* first error; later adds are no-ops */
} keyvec;

static uint64_t row_hash(const uint8_t *row, size_t len)
{
    static const unsigned char key[crypto_shorthash_KEYBYTES] = {0};
    uint8_t h[crypto_shorthash_BYTES];
    crypto_shorthash(h, row, len, key);
    uint64_t v = 0;
    memcpy(&v, h, sizeof v);
    return v;
}

/* The slot of kv's index where the row of len bytes at row is, or the
 * empty slot where it would go. */
static size_t keyvec_slot(const keyvec *kv, const uint8_t *row, size_t len)
{
    size_t h = row_hash(row, len) & (kv->icap - 1);
    for (; kv->index[h] != 0; h = (h + 1) & (kv->icap - 1)) {
        size_t i = kv->index[h] - 1;
        if (kv->off[i + 1] - kv->off[i] == len &&
            memcmp(kv->bytes + kv->off[i], row, len) == 0)
            break;
    }
    return h;
}

/* Decodes row i of kv into fields (kv->nfields of them). */
static void row_get(const keyvec *kv, size_t i, int64_t *fields)
{
    kw__keys_get_fields(kv->bytes + kv->off[i], fields, kv->nfields);
}

/* Doubles the row count kv holds (offsets and index) and rebuilds the
 * index. */
static int keyvec_grow(keyvec *kv)
{
    size_t cap = kv->cap ? kv->cap * 2 : 64;
    if (cap > KW_KEYS_MAX)
        return KW_E2BIG;
    uint32_t *off = realloc(kv->off, (cap + 1) * sizeof *off);
    if (off == NULL)
        return KW_ENOMEM;
    kv->off = off;
    if (kv->cap == 0)
        kv->off[0] = 0; /* where row 0 starts; the others end rows */
    uint32_t *idx = calloc(cap * 2, sizeof *idx);
    if (idx == NULL)
        return KW_ENOMEM;
    free(kv->index);
    kv->index = idx;
    kv->cap = cap;
    kv->icap = cap * 2;
    for (size_t i = 0; i < kv->n; i++) { /* distinct: each finds a gap */
        size_t len = kv->off[i + 1] - kv->off[i];
        kv->index[keyvec_slot(kv, kv->bytes + kv->off[i], len)] =
            (uint32_t)(i + 1);
    }
    return 0;
}

/* Makes room for len more bytes of rows.  KW_KEYS_MAX rows of at most
 * KW__KEYS_ROW_MAX bytes fit the 32-bit offsets. */
static int keyvec_reserve(keyvec *kv, size_t len)
{
    if (kv->len + len <= kv->bcap)
        return 0;
    size_t bcap = kv->bcap ? kv->bcap * 2 : 4096;
    while (bcap < kv->len + len)
        bcap *= 2;
    uint8_t *bytes = realloc(kv->bytes, bcap);
    if (bytes == NULL)
        return KW_ENOMEM;
    kv->bytes = bytes;
    kv->bcap = bcap;
    return 0;
}

/* Adds one key's fields unless an equal key is already there. */
static void keyvec_add(keyvec *kv, const int64_t *row)
{
    uint8_t enc[KW__KEYS_ROW_MAX];
    if (kv->rc < 0)
        return;
    if (kv->n == kv->cap && (kv->rc = keyvec_grow(kv)) < 0)
        return;
    size_t len = kw__keys_put_fields(enc, row, kv->nfields);
    size_t h = keyvec_slot(kv, enc, len);
    if (kv->index[h] != 0 || (kv->rc = keyvec_reserve(kv, len)) < 0)
        return;
    memcpy(kv->bytes + kv->len, enc, len);
    kv->len += len;
    kv->off[kv->n + 1] = (uint32_t)kv->len;
    kv->index[h] = (uint32_t)(++kv->n);
}

static void keyvec_destroy(keyvec *kv)
{
    free(kv->bytes);
    free(kv->off);
    free(kv->index);
}

/* What a derivation reads: kernels/' inputs (the resolved deployment),
 * whose rank derive_family() sets for each rank it runs. */
typedef struct derive_in {
    kw_k_derive_in k;
    const kw_config_deploy *d;
} derive_in;

/* kw_k_add_fn over a keyvec. */
static void add_row(void *ctx, const int64_t *fields)
{
    keyvec_add(ctx, fields);
}

/* Runs one family's loops (kernels/derive.c) over every rank of the
 * deployment.  Ranks whose keys cannot differ from an earlier rank's are
 * skipped: a family that sees the rank only through rep(R) needs at most
 * three ranks, one that does not see it, one. */
static int derive_family(derive_in *in, kw_k_family f, keyvec *kv)
{
    const kw_config_deploy *d = in->d;
    bool all = d->dcp_rank == KW_CONFIG_RANK_ALL;
    int64_t first = all ? 0 : d->dcp_rank, last = all ? d->dcp_world - 1 : first;
    kw_k_rank_use use = kw_k_family_rank_use(f);
    bool seen[3] = {false, false, false};
    kv->family = f;
    kv->nfields = kw_keys_nfields(f);
    if (use == KW_K_RANK_NONE)
        last = first;
    for (int64_t r = first; r <= last && kv->rc == 0; r++) {
        if (use == KW_K_RANK_REP) {
            int cls = r == 1 ? 0 : r % 16 == 0 ? 2 : 1; /* rep(r) of §3 */
            if (seen[cls])
                continue;
            seen[cls] = true;
        }
        in->k.rank = r;
        int rc = kw_k_derive(f, &in->k, add_row, kv);
        if (rc < 0)
            return rc;
    }
    return kv->rc;
}

/* Where a derivation's keys go: a set of whole keys (digested), or a
 * packed set (not digested: a reader digests each key it reads). */
typedef struct sink {
    kw_keys_set *set;
    kw_keys_packed *pk;
    int64_t *workspace_rows, *workspace_bytes;
} sink;

/* §5: the chunked-prefill workspace.  Computed in 128 bits, so absurd but
 * valid deployments report an overflow instead of wrapping. */
static int workspace(const kw_config_model *m, const kw_config_deploy *d,
                     sink *out, char *err, size_t errlen)
{
    typedef __int128 i128;
    i128 mml = d->max_model_len, bs = d->block_size, W = d->dcp_world;
    i128 a = 8 * mml, b = 4 * (i128)d->max_num_seqs * bs;
    i128 ws = a > b ? a : b;
    i128 cap = (i128)d->max_num_seqs * m->index_topk;
    if (ws > 65536)
        ws = 65536;
    if (ws > cap)
        ws = cap;
    if (ws < bs)
        ws = bs;
    if (W > 1)
        ws = (ws + bs * W - 1) / (bs * W) * (bs * W);
    i128 bytes = (ws + (W > 1 ? ws / W : 0)) *
                 (m->kv_lora_rank + m->qk_rope_head_dim) * m->element_size;
    if (ws > INT64_MAX || bytes > INT64_MAX) {
        kw__config_errf(err, errlen, "--block-size: workspace of block_size "
                        "%lld x dcp_world %lld overflows 64 bits",
                        (long long)d->block_size, (long long)d->dcp_world);
        return KW_EDEPLOY;
    }
    *out->workspace_rows = (int64_t)ws;
    *out->workspace_bytes = (int64_t)bytes;
    return 0;
}

static size_t sink_n(const sink *s)
{
    return s->set != NULL ? s->set->nkeys : s->pk->n;
}

/* Crosses one family's keys with every arch into s's packed set: one
 * entry a row, standing for the row on each of p->archs (d's archs, in
 * d's order: the order emit() gives the keys). */
static int emit_packed(const keyvec *kv, sink *s)
{
    int64_t row[KW_KEYS_MAX_FIELDS];
    for (size_t i = 0; i < kv->n; i++) {
        row_get(kv, i, row);
        int rc = kw__keys_pack_add(s->pk, kv->family, KW__KEYS_ARCH_ALL, row);
        if (rc < 0)
            return rc;
    }
    return 0;
}

/* Crosses one family's keys with every arch and digests them into s. */
static int emit(const keyvec *kv, const kw_config_deploy *d,
                const kw__keys_digest_ctx *ctx, sink *s)
{
    size_t add = kv->n * d->narch;
    if (sink_n(s) + add > KW_KEYS_MAX)
        return KW_E2BIG;
    if (s->pk != NULL)
        return emit_packed(kv, s);
    kw_keys_set *out = s->set;
    kw_keys_key *keys = realloc(out->keys, (out->nkeys + add) * sizeof *keys);
    if (keys == NULL && out->nkeys + add > 0)
        return KW_ENOMEM;
    out->keys = keys;
    for (size_t i = 0; i < kv->n; i++)
        for (size_t a = 0; a < d->narch; a++) {
            kw_keys_key *k = &out->keys[out->nkeys++];
            memset(k, 0, sizeof *k);
            k->family = kv->family;
            row_get(kv, i, k->fields);
            memcpy(k->arch, d->arch[a], sizeof k->arch);
            kw__keys_digest_with(ctx, k, k->digest);
        }
    return 0;
}

/* Fills kernels/' derivation inputs from the model and deployment, and
 * refuses a rank sweep that cannot fit. */
static int derive_setup(derive_in *in, int64_t *rp, int64_t *rs,
                        const kw_config_model *m, const kw_config_deploy *d,
                        char *err, size_t errlen)
{
    memset(in, 0, sizeof *in);
    in->d = d;
    in->k = (kw_k_derive_in){
        .index_topk = m->index_topk,
        .index_n_heads = m->has_index_n_heads ? m->index_n_heads : 0,
        .index_head_dim = m->has_index_head_dim ? m->index_head_dim : 0,
        .ratios_p = rp, .ratios_s = rs,
        .nratios_p = kw_config_ratios_p(m, rp),
        .nratios_s = kw_config_ratios_s(m, rs),
        .dcp_world = d->dcp_world, .dcp_interleave = d->dcp_interleave,
        .pcp = d->pcp, .max_num_batched_tokens = d->max_num_batched_tokens,
        .block_size = d->block_size, .max_model_len = d->max_model_len,
        .block_stride_rows = d->block_stride_rows,
        .num_speculative_tokens = d->num_speculative_tokens};
    /* Every rank adds at least one key of its own (index_conversion). */
    if (d->dcp_rank == KW_CONFIG_RANK_ALL &&
        (uint64_t)d->dcp_world * d->narch > KW_KEYS_MAX) {
        kw__config_errf(err, errlen, "--dcp-rank: 'all' over dcp_world %lld "
                        "on %zu arch%s derives at least %llu keys, over the "
                        "limit of %u keys a request; pass one rank",
                        (long long)d->dcp_world, (size_t)d->narch,
                        d->narch == 1 ? "" : "s",
                        (unsigned long long)d->dcp_world * d->narch, KW_KEYS_MAX);
        return KW_EDEPLOY;
    }
    return 0;
}

/* The derivation of kw_keys_derive() and kw_keys_derive_packed() into
 * s; the caller empties s on error. */
static int derive(const kw_config_model *m, const kw_config_deploy *d, sink *s,
                  char *err, size_t errlen)
{
    int64_t *rp = malloc((KW_CONFIG_MAX_RATIOS + 2) * 2 * sizeof *rp);
    derive_in in;
    kw__keys_digest_ctx ctx;
    if (rp == NULL)
        return KW_ENOMEM;
    int rc = derive_setup(&in, rp, rp + KW_CONFIG_MAX_RATIOS + 2, m, d, err,
                          errlen);
    if (rc == 0)
        rc = workspace(m, d, s, err, errlen);
    /* The packed set digests nothing now, but its readers will. */
    if (rc == 0 && (rc = kw__keys_digest_init(&ctx)) < 0)
        kw__config_errf(err, errlen, "NVRTC version query failed: %s",
                        kw_strerror(rc));
    for (int f = 0; rc == 0 && f < KW_K_NFAMILIES; f++) {
        keyvec kv = {0};
        rc = derive_family(&in, (kw_k_family)f, &kv);
        if (rc == 0)
            rc = emit(&kv, d, &ctx, s);
        keyvec_destroy(&kv);
    }
    if (rc == KW_E2BIG) {
        kw__config_errf(err, errlen, "%s: derives more than %u keys; narrow "
                        "the deployment (--dcp-rank, --arch)", m->path,
                        KW_KEYS_MAX);
        rc = KW_EDEPLOY;
    }
    free(rp);
    return rc;
}

int kw_keys_derive(const kw_config_model *m, const kw_config_deploy *d,
                   kw_keys_set *out, char *err, size_t errlen)
{
    memset(out, 0, sizeof *out);
    sink s = {.set = out, .workspace_rows = &out->workspace_rows,
              .workspace_bytes = &out->workspace_bytes};
    int rc = derive(m, d, &s, err, errlen);
    if (rc < 0)
        kw_keys_set_destroy(out);
    return rc;
}

int kw_keys_derive_packed(const kw_config_model *m, const kw_config_deploy *d,
                          kw_keys_packed *p, char *err, size_t errlen)
{
    kw_keys_pack_init(p);
    p->narchs = d->narch;
    memcpy(p->archs, d->arch, d->narch * sizeof p->archs[0]);
    sink s = {.pk = p, .workspace_rows = &p->workspace_rows,
              .workspace_bytes = &p->workspace_bytes};
    int rc = derive(m, d, &s, err, errlen);
    if (rc < 0)
        kw_keys_pack_destroy(p);
    else
        kw__keys_pack_shrink(p);
    return rc;
}

void kw_keys_set_destroy(kw_keys_set *s)
{
    if (s == NULL)
        return;
    free(s->keys);
    memset(s, 0, sizeof *s);
}
