/* keys.c: deriving the compile keys of §4 and the sizes of §5.
 *
 * Each family's loops are written as in the spec, for one rank at a time;
 * kw_keys_derive() runs them for every rank the deployment names, keeps the
 * first of equal keys (a hash index over the fields), then crosses the
 * result with every arch and digests each key.
 */
#include "kw_keys.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <sodium.h>

#include "internal.h"
#include "kw_err.h"

/* Keys of one family under construction, de-duplicated on insert. */
typedef struct keyvec {
    kw_k_family family;
    size_t nfields;
    int64_t (*rows)[KW_KEYS_MAX_FIELDS];
    size_t n, cap;
    uint32_t *index; /* open addressing: row number + 1, 0 = empty */
    size_t icap;     /* power of two, at least 2 * cap */
    int rc;          /* first error; later adds are no-ops */
} keyvec;

/* Specialization class of §3, as Triton specializes integer arguments. */
static int64_t rep(int64_t v)
{
    if (v == 1)
        return 1;
    return v % 16 == 0 ? 16 : 2;
}

static uint64_t row_hash(const int64_t *row, size_t n)
{
    static const unsigned char key[crypto_shorthash_KEYBYTES] = {0};
    uint8_t h[crypto_shorthash_BYTES];
    crypto_shorthash(h, (const unsigned char *)row, n * sizeof *row, key);
    uint64_t v = 0;
    memcpy(&v, h, sizeof v);
    return v;
}

/* Doubles the row store and rebuilds the index. */
static int keyvec_grow(keyvec *kv)
{
    size_t cap = kv->cap ? kv->cap * 2 : 64;
    if (cap > KW_KEYS_MAX)
        return KW_E2BIG;
    void *rows = realloc(kv->rows, cap * sizeof *kv->rows);
    if (rows == NULL)
        return KW_ENOMEM;
    kv->rows = rows;
    uint32_t *idx = calloc(cap * 2, sizeof *idx);
    if (idx == NULL)
        return KW_ENOMEM;
    free(kv->index);
    kv->index = idx;
    kv->cap = cap;
    kv->icap = cap * 2;
    for (size_t i = 0; i < kv->n; i++) {
        size_t h = row_hash(kv->rows[i], kv->nfields) & (kv->icap - 1);
        while (kv->index[h] != 0)
            h = (h + 1) & (kv->icap - 1);
        kv->index[h] = (uint32_t)(i + 1);
    }
    return 0;
}

/* Adds one key's fields unless an equal key is already there. */
static void keyvec_add(keyvec *kv, const int64_t *row)
{
    if (kv->rc < 0)
        return;
    if (kv->n == kv->cap && (kv->rc = keyvec_grow(kv)) < 0)
        return;
    size_t bytes = kv->nfields * sizeof *row;
    size_t h = row_hash(row, kv->nfields) & (kv->icap - 1);
    for (; kv->index[h] != 0; h = (h + 1) & (kv->icap - 1))
        if (memcmp(kv->rows[kv->index[h] - 1], row, bytes) == 0)
            return;
    memcpy(kv->rows[kv->n], row, bytes);
    kv->index[h] = (uint32_t)(++kv->n);
}

static void keyvec_destroy(keyvec *kv)
{
    free(kv->rows);
    free(kv->index);
}

/* What one rank's derivation reads: the resolved deployment with R fixed. */
typedef struct derive_in {
    const kw_config_model *m;
    const kw_config_deploy *d;
    int64_t rank;
    const int64_t *ratios_p, *ratios_s;
    size_t nratios_p, nratios_s;
} derive_in;

/* §4.1 prefill_chunk_metadata. */
static void derive_prefill(const derive_in *in, keyvec *kv)
{
    const kw_config_deploy *d = in->d;
    int64_t mt = d->max_num_batched_tokens < 8 ? d->max_num_batched_tokens : 8;
    int64_t m = mt > 1 ? mt : 1;
    int64_t starts[3] = {0, 1, 2}, stops[3] = {1, 2 * m - 1, 2 * m};
    int64_t geo[2][3] = {{d->dcp_world > 1 ? in->rank : 0, d->dcp_world,
                          d->dcp_interleave}, {0, 1, 1}};
    size_t ngeo = d->pcp > 1 ? 2 : 1;
    for (int a = 0; a < 3; a++)
        for (int b = 0; b < 3; b++)
            for (size_t g = 0; g < ngeo; g++)
                for (size_t r = 0; r < in->nratios_p; r++)
                    for (int al = 1; al >= 0; al--) {
                        int64_t row[KW_KEYS_MAX_FIELDS] = {
                            rep(starts[a]), rep(stops[b]), rep(geo[g][0]),
                            rep(geo[g][1]), rep(geo[g][2]), 1024,
                            in->ratios_p[r], al};
                        keyvec_add(kv, row);
                    }
}

/* §4.2 compressed_slot_mapping. */
static void derive_slot_mapping(const derive_in *in, keyvec *kv)
{
    const kw_config_deploy *d = in->d;
    int64_t geo[2][3] = {{1, 0, 1},
                         {d->dcp_world, in->rank, d->dcp_interleave}};
    size_t ngeo = d->dcp_world > 1 ? 2 : 1;
    for (size_t r = 0; r < in->nratios_s; r++)
        for (size_t g = 0; g < ngeo; g++) {
            int64_t ratio = in->ratios_s[r];
            int64_t row[KW_KEYS_MAX_FIELDS] = {
                ratio, 1024, rep(d->block_size / ratio), geo[g][0], geo[g][1],
                geo[g][2]};
            keyvec_add(kv, row);
        }
}

/* vLLM's block-table width (§4.3): blocks for max_model_len over the DCP
 * world, rounded up to a multiple of 128 / gcd(128, block_size). */
static int64_t block_table_width(const kw_config_deploy *d)
{
    int64_t per = d->block_size * d->dcp_world; /* < 2^62 */
    int64_t n = (d->max_model_len + per - 1) / per;
    int64_t g = 128, b = d->block_size;
    while (b != 0) {
        int64_t t = g % b;
        g = b;
        b = t;
    }
    int64_t mult = 128 / g;
    return (n + mult - 1) / mult * mult;
}

/* §4.3 index_conversion. */
static void derive_index_conversion(const derive_in *in, keyvec *kv)
{
    const kw_config_deploy *d = in->d;
    int64_t topk = in->m->index_topk, W = d->dcp_world, R = in->rank;
    int64_t I = d->dcp_interleave;
    bool pow2 = (topk & (topk - 1)) == 0;
    int64_t rows[6][6] = {
        {0, 0, 0, 1, 0, 1}, {0, 1, 1, 1, 0, 1}, {1, 1, 1, 1, 0, 1},
        {0, 1, 0, W, R, I}, {0, 1, W > 1, W, R, I}, {1, 1, 1, W, R, I}};
    size_t nrows = d->pcp > 1 && W > 1 ? 6 : 5;
    int64_t width = rep(block_table_width(d));
    for (size_t i = 0; i < nrows; i++) {
        bool single = rows[i][1] && pow2;
        int64_t row[KW_KEYS_MAX_FIELDS] = {
            d->block_size, d->block_stride_rows, single ? topk : 128, single,
            single ? 8 : 4, rows[i][0], rows[i][1], rows[i][2], rows[i][3],
            rows[i][4], rows[i][5], topk, width};
        keyvec_add(kv, row);
    }
}

/* §4.4 dcp_pack_topk_candidates. */
static void derive_pack(const derive_in *in, keyvec *kv)
{
    const kw_config_deploy *d = in->d;
    if (d->dcp_world <= 1)
        return;
    for (int hrs = 0; hrs < 2; hrs++) {
        int64_t row[KW_KEYS_MAX_FIELDS] = {
            in->rank, d->dcp_world, d->dcp_interleave, hrs,
            in->m->index_topk, 512};
        keyvec_add(kv, row);
    }
}

/* §4.5 dcp_stable_topk. */
static void derive_stable_topk(const derive_in *in, keyvec *kv)
{
    if (in->d->dcp_world <= 1)
        return;
    int64_t row[KW_KEYS_MAX_FIELDS] = {
        in->m->index_topk, in->m->index_topk * in->d->dcp_world};
    keyvec_add(kv, row);
}

/* §4.6 indexer_logits: one prefill key, one decode key per ratio. */
static void derive_logits(const derive_in *in, keyvec *kv)
{
    const kw_config_model *m = in->m;
    if (!m->has_index_n_heads || !m->has_index_head_dim)
        return;
    int64_t pre[KW_KEYS_MAX_FIELDS] = {m->index_n_heads, m->index_head_dim,
                                       0, 0, 1};
    keyvec_add(kv, pre);
    for (size_t r = 0; r < in->nratios_p; r++) {
        int64_t row[KW_KEYS_MAX_FIELDS] = {
            m->index_n_heads, m->index_head_dim, 1,
            in->d->block_size / in->ratios_p[r],
            1 + in->d->num_speculative_tokens};
        keyvec_add(kv, row);
    }
}

/* §4.7 indexer_topk. */
static void derive_indexer_topk(const derive_in *in, keyvec *kv)
{
    for (int win = 1; win >= 0; win--) {
        int64_t row[KW_KEYS_MAX_FIELDS] = {in->m->index_topk, win};
        keyvec_add(kv, row);
    }
}

typedef void (*derive_fn)(const derive_in *, keyvec *);

static const derive_fn derivers[KW_K_NFAMILIES] = {
    [KW_K_PREFILL_CHUNK_METADATA] = derive_prefill,
    [KW_K_COMPRESSED_SLOT_MAPPING] = derive_slot_mapping,
    [KW_K_INDEX_CONVERSION] = derive_index_conversion,
    [KW_K_DCP_PACK_TOPK_CANDIDATES] = derive_pack,
    [KW_K_DCP_STABLE_TOPK] = derive_stable_topk,
    [KW_K_INDEXER_LOGITS] = derive_logits,
    [KW_K_INDEXER_TOPK] = derive_indexer_topk,
};

/* Runs one family's loops over every rank of the deployment.  Ranks whose
 * keys cannot differ from an earlier rank's are skipped: prefill keys see a
 * rank only through rep(R), so at most three ranks matter there. */
static int derive_family(derive_in *in, kw_k_family f, keyvec *kv)
{
    const kw_config_deploy *d = in->d;
    bool all = d->dcp_rank == KW_CONFIG_RANK_ALL;
    int64_t first = all ? 0 : d->dcp_rank, last = all ? d->dcp_world - 1 : first;
    bool seen[3] = {false, false, false};
    kv->family = f;
    kv->nfields = kw_keys_nfields(f);
    /* The indexer families do not depend on the rank (§4.6, §4.7). */
    if (f == KW_K_INDEXER_LOGITS || f == KW_K_INDEXER_TOPK)
        last = first;
    for (int64_t r = first; r <= last && kv->rc == 0; r++) {
        if (f == KW_K_PREFILL_CHUNK_METADATA) {
            int cls = rep(r) == 1 ? 0 : rep(r) == 2 ? 1 : 2;
            if (seen[cls])
                continue;
            seen[cls] = true;
        }
        in->rank = r;
        derivers[f](in, kv);
    }
    return kv->rc;
}

/* §5: the chunked-prefill workspace.  Computed in 128 bits, so absurd but
 * valid deployments report an overflow instead of wrapping. */
static int workspace(const kw_config_model *m, const kw_config_deploy *d,
                     kw_keys_set *out, char *err, size_t errlen)
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
    out->workspace_rows = (int64_t)ws;
    out->workspace_bytes = (int64_t)bytes;
    return 0;
}

/* Crosses one family's keys with every arch and digests them into out. */
static int emit(const keyvec *kv, const kw_config_deploy *d,
                const kw__keys_digest_ctx *ctx, kw_keys_set *out)
{
    size_t add = kv->n * d->narch;
    if (out->nkeys + add > KW_KEYS_MAX)
        return KW_E2BIG;
    kw_keys_key *keys = realloc(out->keys, (out->nkeys + add) * sizeof *keys);
    if (keys == NULL && out->nkeys + add > 0)
        return KW_ENOMEM;
    out->keys = keys;
    for (size_t i = 0; i < kv->n; i++)
        for (size_t a = 0; a < d->narch; a++) {
            kw_keys_key *k = &out->keys[out->nkeys++];
            memset(k, 0, sizeof *k);
            k->family = kv->family;
            memcpy(k->fields, kv->rows[i], kv->nfields * sizeof k->fields[0]);
            memcpy(k->arch, d->arch[a], sizeof k->arch);
            kw__keys_digest_with(ctx, k, k->digest);
        }
    return 0;
}

/* Fills the ratio lists and refuses a rank sweep that cannot fit. */
static int derive_setup(derive_in *in, int64_t *rp, int64_t *rs,
                        const kw_config_model *m, const kw_config_deploy *d,
                        char *err, size_t errlen)
{
    memset(in, 0, sizeof *in);
    in->m = m;
    in->d = d;
    in->ratios_p = rp;
    in->ratios_s = rs;
    in->nratios_p = kw_config_ratios_p(m, rp);
    in->nratios_s = kw_config_ratios_s(m, rs);
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

int kw_keys_derive(const kw_config_model *m, const kw_config_deploy *d,
                   kw_keys_set *out, char *err, size_t errlen)
{
    int64_t *rp = malloc((KW_CONFIG_MAX_RATIOS + 2) * 2 * sizeof *rp);
    derive_in in;
    kw__keys_digest_ctx ctx;
    memset(out, 0, sizeof *out);
    if (rp == NULL)
        return KW_ENOMEM;
    int rc = derive_setup(&in, rp, rp + KW_CONFIG_MAX_RATIOS + 2, m, d, err,
                          errlen);
    if (rc == 0)
        rc = workspace(m, d, out, err, errlen);
    if (rc == 0 && (rc = kw__keys_digest_init(&ctx)) < 0)
        kw__config_errf(err, errlen, "NVRTC version query failed: %s",
                        kw_strerror(rc));
    for (int f = 0; rc == 0 && f < KW_K_NFAMILIES; f++) {
        keyvec kv = {0};
        rc = derive_family(&in, (kw_k_family)f, &kv);
        if (rc == 0)
            rc = emit(&kv, d, &ctx, out);
        keyvec_destroy(&kv);
    }
    if (rc == KW_E2BIG) {
        kw__config_errf(err, errlen, "%s: derives more than %u keys; narrow "
                        "the deployment (--dcp-rank, --arch)", m->path,
                        KW_KEYS_MAX);
        rc = KW_EDEPLOY;
    }
    free(rp);
    if (rc < 0)
        kw_keys_set_destroy(out);
    return rc;
}

void kw_keys_set_destroy(kw_keys_set *s)
{
    if (s == NULL)
        return;
    free(s->keys);
    memset(s, 0, sizeof *s);
}
