/* test_keys.c: key derivation (spec/warmup-keys.md §3-§5) and the worked
 * examples of §7, plus digest stability and sensitivity (§6). */
#include <criterion/criterion.h>
#include <stdio.h>
#include <string.h>

#include "kw_config.h"
#include "kw_err.h"
#include "kw_keys.h"

/* A model and deployment built from inline JSON and deployment flags. */
typedef struct fixture {
    kw_config_model m;
    kw_config_deploy d;
    kw_keys_set s;
} fixture;

/* Loads the config at path, or json when it is set, applies flags (name,
 * value pairs; NULL-terminated), resolves and derives.  Fails the test on
 * any error. */
static void derive_from(fixture *fx, const char *path, const char *json,
                        const char *const *flags)
{
    char err[KW_CONFIG_ERRLEN] = "";
    memset(fx, 0, sizeof *fx);
    kw_config_deploy_init(&fx->d);
    for (size_t i = 0; flags != NULL && flags[i] != NULL; i += 2) {
        int f = kw_config_flag_field(flags[i]);
        cr_assert_geq(f, 0, "bad flag %s in test", flags[i]);
        cr_assert_eq(kw_config_deploy_set_flag(&fx->d, (kw_config_field)f,
                                               flags[i + 1], err, sizeof err),
                     0, "%s", err);
    }
    int rc = json != NULL
                 ? kw_config_load_buffer(&fx->m, "t.json", json, strlen(json),
                                         fx->d.text_config, err, sizeof err)
                 : kw_config_load(&fx->m, path, fx->d.text_config, err,
                                  sizeof err);
    cr_assert_eq(rc, 0, "%s", err);
    cr_assert_eq(kw_config_resolve(&fx->d, &fx->m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kw_keys_derive(&fx->m, &fx->d, &fx->s, err, sizeof err), 0,
                 "%s", err);
}

/* derive_from() on inline JSON. */
static void derive(fixture *fx, const char *json, const char *const *flags)
{
    derive_from(fx, NULL, json, flags);
}

static void release(fixture *fx)
{
    kw_keys_set_destroy(&fx->s);
    kw_config_model_destroy(&fx->m);
    kw_config_deploy_destroy(&fx->d);
}

static size_t count(const fixture *fx, kw_k_family f)
{
    size_t n = 0;
    for (size_t i = 0; i < fx->s.nkeys; i++)
        n += fx->s.keys[i].family == f;
    return n;
}

/* Index of a field by name, failing the test when absent. */
static size_t field(kw_k_family f, const char *name)
{
    for (size_t i = 0; i < kw_keys_nfields(f); i++)
        if (strcmp(kw_keys_field_name(f, i), name) == 0)
            return i;
    cr_assert_fail("no field %s", name);
    return 0;
}

/* Collects the distinct values of one field of a family into out. */
static size_t distinct(const fixture *fx, kw_k_family f, const char *name,
                       int64_t *out, size_t cap)
{
    size_t n = 0, fi = field(f, name);
    for (size_t i = 0; i < fx->s.nkeys; i++) {
        if (fx->s.keys[i].family != f)
            continue;
        int64_t v = fx->s.keys[i].fields[fi];
        size_t j = 0;
        while (j < n && out[j] != v)
            j++;
        if (j == n && n < cap)
            out[n++] = v;
    }
    return n;
}

static bool has(const int64_t *v, size_t n, int64_t x)
{
    for (size_t i = 0; i < n; i++)
        if (v[i] == x)
            return true;
    return false;
}

#define TOPK2048 "\"index_topk\": 2048, \"max_position_embeddings\": 163840"

/* §7 example 1: compress_ratios [0,0,4,128,0], kpool 32, 8 batched tokens. */
Test(keys, prefill_ratios_and_slices_follow_example_one)
{
    fixture fx;
    const char *flags[] = {"--max-num-batched-tokens", "8", NULL};
    derive(&fx, "{" TOPK2048 ", \"compress_ratios\": [0,0,4,128,0],"
                " \"index_kpool\": 32}", flags);
    int64_t v[16];
    size_t n = distinct(&fx, KW_K_PREFILL_CHUNK_METADATA, "compress_ratio", v, 16);
    cr_assert_eq(n, 4);
    cr_assert(has(v, n, 1) && has(v, n, 4) && has(v, n, 128) && has(v, n, 32));
    n = distinct(&fx, KW_K_PREFILL_CHUNK_METADATA, "query_slice_start", v, 16);
    cr_assert(n == 3 && has(v, n, 1) && has(v, n, 2) && has(v, n, 16));
    n = distinct(&fx, KW_K_PREFILL_CHUNK_METADATA, "query_slice_stop", v, 16);
    cr_assert(n == 3 && has(v, n, 1) && has(v, n, 2) && has(v, n, 16));
    /* 3 starts x 3 stops x 4 ratios x 2 alignments, one geometry. */
    cr_assert_eq(count(&fx, KW_K_PREFILL_CHUNK_METADATA), 72);
    release(&fx);
}

/* §7 example 2: W = 4, P = 4, R = 2 gives exactly {(2,2), (16,1)}. */
Test(keys, prefill_geometry_pairs_follow_example_two)
{
    fixture fx;
    const char *flags[] = {"--dcp-world", "4", "--pcp", "4", "--dcp-rank", "2", NULL};
    derive(&fx, "{" TOPK2048 "}", flags);
    size_t fr = field(KW_K_PREFILL_CHUNK_METADATA, "dcp_rank");
    size_t fw = field(KW_K_PREFILL_CHUNK_METADATA, "dcp_world");
    bool seen22 = false, seen161 = false;
    for (size_t i = 0; i < fx.s.nkeys; i++) {
        const kw_keys_key *k = &fx.s.keys[i];
        if (k->family != KW_K_PREFILL_CHUNK_METADATA)
            continue;
        bool a = k->fields[fr] == 2 && k->fields[fw] == 2;
        bool b = k->fields[fr] == 16 && k->fields[fw] == 1;
        cr_assert(a || b, "unexpected pair (%lld, %lld)",
                  (long long)k->fields[fr], (long long)k->fields[fw]);
        seen22 |= a;
        seen161 |= b;
    }
    cr_assert(seen22 && seen161);
    release(&fx);
}

/* §7 example 3: kpool 32 alone, block_size 256: (32, rep(8) = 2) only. */
Test(keys, slot_mapping_kpool_only_follows_example_three)
{
    fixture fx;
    const char *flags[] = {"--block-size", "256", NULL};
    derive(&fx, "{" TOPK2048 ", \"index_kpool\": 32}", flags);
    cr_assert_eq(count(&fx, KW_K_COMPRESSED_SLOT_MAPPING), 1);
    size_t fr = field(KW_K_COMPRESSED_SLOT_MAPPING, "compress_ratio");
    size_t fb = field(KW_K_COMPRESSED_SLOT_MAPPING, "block_size");
    for (size_t i = 0; i < fx.s.nkeys; i++)
        if (fx.s.keys[i].family == KW_K_COMPRESSED_SLOT_MAPPING) {
            cr_assert_eq(fx.s.keys[i].fields[fr], 32);
            cr_assert_eq(fx.s.keys[i].fields[fb], 2);
        }
    release(&fx);
}

/* §7 example 4: block_stride_rows 4096 reaches every index_conversion key,
 * and W = 1 gives four of them. */
Test(keys, index_conversion_stride_follows_example_four)
{
    fixture fx;
    const char *flags[] = {"--block-stride-rows", "4096", NULL};
    derive(&fx, "{" TOPK2048 "}", flags);
    cr_assert_eq(count(&fx, KW_K_INDEX_CONVERSION), 4);
    int64_t v[8];
    size_t n = distinct(&fx, KW_K_INDEX_CONVERSION, "block_stride_rows", v, 8);
    cr_assert(n == 1 && v[0] == 4096);
    release(&fx);
}

/* §7 example 5: ratios {4, 128} raise block_size to 128 and give slot
 * mapping block sizes rep(32) = 16 and rep(1) = 1. */
Test(keys, v4_flash_block_size_follows_example_five)
{
    fixture fx;
    derive(&fx, "{\"index_topk\": 512, \"max_position_embeddings\": 1048576,"
                " \"compress_ratios\": [0, 0, 4, 128, 4, 128, 4, 0]}", NULL);
    cr_assert_eq(fx.d.block_size, 128);
    int64_t v[8];
    size_t n = distinct(&fx, KW_K_COMPRESSED_SLOT_MAPPING, "block_size", v, 8);
    cr_assert(n == 2 && has(v, n, 16) && has(v, n, 1));
    release(&fx);
}

/* §7 example 6: DeepSeek-V3.2 defaults: 18 + 0 + 4 + 0 + 0 keys and a
 * 65536-row workspace. */
Test(keys, deepseek_v32_defaults_follow_example_six)
{
    fixture fx;
    derive(&fx, "{" TOPK2048 ", \"kv_lora_rank\": 512, \"qk_rope_head_dim\": 64}",
           NULL);
    cr_assert_eq(count(&fx, KW_K_PREFILL_CHUNK_METADATA), 18);
    cr_assert_eq(count(&fx, KW_K_COMPRESSED_SLOT_MAPPING), 0);
    cr_assert_eq(count(&fx, KW_K_INDEX_CONVERSION), 4);
    cr_assert_eq(count(&fx, KW_K_DCP_PACK_TOPK_CANDIDATES), 0);
    cr_assert_eq(count(&fx, KW_K_DCP_STABLE_TOPK), 0);
    cr_assert_eq(fx.s.workspace_rows, 65536);
    cr_assert_eq(fx.s.workspace_bytes, 65536LL * 576 * 2);
    release(&fx);
}

/* §4.4, §4.5: W = 2 over all ranks: two pack keys per rank, one top-k key
 * whose candidates are topk x W. */
Test(keys, dcp_families_cover_every_rank)
{
    fixture fx;
    const char *flags[] = {"--dcp-world", "2", NULL};
    derive(&fx, "{" TOPK2048 "}", flags);
    cr_assert_eq(count(&fx, KW_K_DCP_PACK_TOPK_CANDIDATES), 4);
    cr_assert_eq(count(&fx, KW_K_DCP_STABLE_TOPK), 1);
    int64_t v[4];
    cr_assert_eq(distinct(&fx, KW_K_DCP_STABLE_TOPK, "num_candidates", v, 4), 1);
    cr_assert_eq(v[0], 4096);
    release(&fx);
}

/* §4: every key is crossed with every arch, without duplicates. */
Test(keys, keys_are_crossed_with_every_arch_without_duplicates)
{
    fixture one, two;
    const char *a1[] = {"--arch", "sm_90", NULL};
    const char *a2[] = {"--arch", "sm_90,sm_100,sm_90", NULL};
    derive(&one, "{" TOPK2048 "}", a1);
    derive(&two, "{" TOPK2048 "}", a2);
    cr_assert_eq(two.s.nkeys, 2 * one.s.nkeys);
    for (size_t i = 0; i < two.s.nkeys; i++)
        for (size_t j = i + 1; j < two.s.nkeys; j++)
            cr_assert_neq(memcmp(two.s.keys[i].digest, two.s.keys[j].digest,
                                 KW_KEYS_DIGEST_LEN), 0);
    release(&one);
    release(&two);
}

/* §4.3: a topk that is not a power of two never uses the single tile. */
Test(keys, index_conversion_tiles_non_power_of_two_topk)
{
    fixture fx;
    derive(&fx, "{\"index_topk\": 1000, \"max_position_embeddings\": 4096}", NULL);
    size_t fs = field(KW_K_INDEX_CONVERSION, "single_tile");
    size_t fb = field(KW_K_INDEX_CONVERSION, "block_n");
    size_t fw = field(KW_K_INDEX_CONVERSION, "num_warps");
    for (size_t i = 0; i < fx.s.nkeys; i++)
        if (fx.s.keys[i].family == KW_K_INDEX_CONVERSION) {
            cr_assert_eq(fx.s.keys[i].fields[fs], 0);
            cr_assert_eq(fx.s.keys[i].fields[fb], 128);
            cr_assert_eq(fx.s.keys[i].fields[fw], 4);
        }
    release(&fx);
}

/* §4.3: block-table width: ceil(4096 / (64 * 1)) = 64 blocks, rounded up
 * to a multiple of 128 / gcd(128, 64) = 2: 64, rep 16.  With block_size 48
 * and 1000 tokens: 21 blocks, multiple of 128/16 = 8: 24, rep 2. */
Test(keys, index_conversion_block_table_stride_is_rep_of_width)
{
    fixture a, b;
    const char *fa[] = {"--max-model-len", "4096", NULL};
    const char *fb[] = {"--max-model-len", "1000", "--block-size", "48", NULL};
    derive(&a, "{\"index_topk\": 64}", fa);
    derive(&b, "{\"index_topk\": 64}", fb);
    int64_t v[4];
    cr_assert_eq(distinct(&a, KW_K_INDEX_CONVERSION, "block_table_stride", v, 4), 1);
    cr_assert_eq(v[0], 16);
    cr_assert_eq(distinct(&b, KW_K_INDEX_CONVERSION, "block_table_stride", v, 4), 1);
    cr_assert_eq(v[0], 2);
    release(&a);
    release(&b);
}

/* §5 under DCP: ws = min(max(8*4096, 4*256*64), 65536, 256*64) = 16384,
 * rounded to a multiple of 64*3 = 192: 16512 rows; bytes add ws / W. */
Test(keys, workspace_rounds_to_block_times_world_under_dcp)
{
    fixture fx;
    const char *flags[] = {"--dcp-world", "3", "--max-model-len", "4096", NULL};
    derive(&fx, "{\"index_topk\": 64, \"kv_lora_rank\": 512,"
                " \"qk_rope_head_dim\": 64, \"torch_dtype\": \"float32\"}", flags);
    cr_assert_eq(fx.s.workspace_rows, 16512);
    cr_assert_eq(fx.s.workspace_bytes, (16512LL + 16512 / 3) * 576 * 4);
    release(&fx);
}

/* §6: equal inputs, equal digests; any change of field, arch or family
 * changes the digest. */
Test(keys, digest_is_stable_and_sensitive_to_every_input)
{
    kw_keys_key k = {.family = KW_K_DCP_STABLE_TOPK, .fields = {2048, 4096}};
    memcpy(k.arch, "sm_90", 6);
    uint8_t d0[32], d1[32];
    cr_assert_eq(kw_keys_digest(&k, d0), 0);
    cr_assert_eq(kw_keys_digest(&k, d1), 0);
    cr_assert_eq(memcmp(d0, d1, 32), 0);
    kw_keys_key v = k;
    v.fields[1] = 4097;
    cr_assert_eq(kw_keys_digest(&v, d1), 0);
    cr_assert_neq(memcmp(d0, d1, 32), 0);
    v = k;
    memcpy(v.arch, "sm_100", 7);
    cr_assert_eq(kw_keys_digest(&v, d1), 0);
    cr_assert_neq(memcmp(d0, d1, 32), 0);
    v = k;
    v.family = KW_K_DCP_PACK_TOPK_CANDIDATES; /* same leading field values */
    cr_assert_eq(kw_keys_digest(&v, d1), 0);
    cr_assert_neq(memcmp(d0, d1, 32), 0);
}

/* Registry: names round-trip, unknown names are refused. */
Test(keys, family_names_round_trip)
{
    for (int f = 0; f < KW_K_NFAMILIES; f++) {
        kw_k_family g;
        cr_assert_eq(kw_keys_family_from_name(kw_keys_family_name((kw_k_family)f), &g), 0);
        cr_assert_eq((int)g, f);
    }
    kw_k_family g;
    cr_assert_eq(kw_keys_family_from_name("flash_attention", &g), KW_ENOFAMILY);
}

/* A rank sweep that cannot fit in KW_KEYS_MAX is refused up front, not
 * attempted. */
Test(keys, refuses_rank_sweep_beyond_key_limit)
{
    char err[KW_CONFIG_ERRLEN] = "";
    kw_config_model m;
    kw_config_deploy d;
    kw_keys_set s;
    const char *json = "{\"index_topk\": 64, \"max_position_embeddings\": 4096}";
    kw_config_deploy_init(&d);
    cr_assert_eq(kw_config_deploy_set_flag(&d, KW_CONFIG_DCP_WORLD, "2000000",
                                           err, sizeof err), 0);
    cr_assert_eq(kw_config_load_buffer(&m, "t.json", json, strlen(json), NULL,
                                       err, sizeof err), 0);
    cr_assert_eq(kw_config_resolve(&d, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kw_keys_derive(&m, &d, &s, err, sizeof err), KW_EDEPLOY);
    cr_assert(strstr(err, "--dcp-rank") != NULL, "%s", err);
    kw_config_model_destroy(&m);
    kw_config_deploy_destroy(&d);
}

/* ---- issue 15: the indexer families (§4.6, §4.7, §7 example six) ---- */

#define V32 "{" TOPK2048 ", \"index_n_heads\": 64, \"index_head_dim\": 128}"

/* The key of family f whose field `name` is v; fails when absent. */
static const kw_keys_key *find(const fixture *fx, kw_k_family f,
                               const char *name, int64_t v)
{
    size_t fi = field(f, name);
    for (size_t i = 0; i < fx->s.nkeys; i++)
        if (fx->s.keys[i].family == f && fx->s.keys[i].fields[fi] == v)
            return &fx->s.keys[i];
    cr_assert_fail("no %s key with %s = %lld", kw_keys_family_name(f), name,
                   (long long)v);
    return NULL;
}

Test(keys, deepseek_v32_indexer_keys_follow_example_six)
{
    fixture fx;
    derive(&fx, V32, NULL);
    cr_assert_eq(fx.s.nkeys, 26);
    cr_assert_eq(count(&fx, KW_K_INDEXER_LOGITS), 2);
    cr_assert_eq(count(&fx, KW_K_INDEXER_TOPK), 2);
    const kw_keys_key *pre = find(&fx, KW_K_INDEXER_LOGITS, "paged", 0);
    const int64_t want_pre[5] = {64, 128, 0, 0, 1};
    cr_assert_arr_eq(pre->fields, want_pre, sizeof want_pre);
    const kw_keys_key *dec = find(&fx, KW_K_INDEXER_LOGITS, "paged", 1);
    const int64_t want_dec[5] = {64, 128, 1, 64, 1};
    cr_assert_arr_eq(dec->fields, want_dec, sizeof want_dec);
    cr_assert_eq(find(&fx, KW_K_INDEXER_TOPK, "windowed", 1)->fields[0], 2048);
    cr_assert_eq(find(&fx, KW_K_INDEXER_TOPK, "windowed", 0)->fields[0], 2048);
    release(&fx);
}

Test(keys, speculative_tokens_set_decode_next_n)
{
    static const char *const flags[] = {"--num-speculative-tokens", "1", NULL};
    fixture fx;
    derive(&fx, V32, flags);
    cr_assert_eq(find(&fx, KW_K_INDEXER_LOGITS, "paged", 1)->fields[4], 2);
    /* The prefill key always scores one query per row. */
    cr_assert_eq(find(&fx, KW_K_INDEXER_LOGITS, "paged", 0)->fields[4], 1);
    release(&fx);
}

/* One decode key per ratio of ratios_p, page_rows = block_size / r. */
Test(keys, decode_logits_keys_follow_ratios)
{
    fixture fx;
    derive(&fx, "{" TOPK2048 ", \"index_n_heads\": 32, \"index_head_dim\": "
           "128, \"compress_ratios\": [4, 128], \"index_kpool\": 2}", NULL);
    int64_t pr[8];
    cr_assert_eq(fx.d.block_size, 128);
    cr_assert_eq(count(&fx, KW_K_INDEXER_LOGITS), 4);
    size_t n = distinct(&fx, KW_K_INDEXER_LOGITS, "page_rows", pr, 8);
    cr_assert_eq(n, 4);
    cr_assert(has(pr, n, 0) && has(pr, n, 32) && has(pr, n, 1) &&
              has(pr, n, 64));
    release(&fx);
}

Test(keys, no_logits_keys_without_indexer_shape)
{
    fixture fx;
    derive(&fx, "{" TOPK2048 ", \"index_n_heads\": 64}", NULL);
    cr_assert_eq(count(&fx, KW_K_INDEXER_LOGITS), 0);
    cr_assert_eq(count(&fx, KW_K_INDEXER_TOPK), 2);
    release(&fx);
    derive(&fx, "{" TOPK2048 ", \"index_head_dim\": 128}", NULL);
    cr_assert_eq(count(&fx, KW_K_INDEXER_LOGITS), 0);
    release(&fx);
}

/* Independent of the DCP geometry: the same keys on every rank. */
Test(keys, indexer_keys_do_not_depend_on_dcp)
{
    static const char *const flags[] = {"--dcp-world", "8", "--dcp-interleave",
                                        "16", NULL};
    fixture fx;
    derive(&fx, V32, flags);
    cr_assert_eq(count(&fx, KW_K_INDEXER_LOGITS), 2);
    cr_assert_eq(count(&fx, KW_K_INDEXER_TOPK), 2);
    release(&fx);
}

/* sm_90 indexer_logits keys build for sm_90a, which enters their digest;
 * every other key builds for its own arch. */
Test(keys, sm90_logits_keys_compile_for_sm90a)
{
    char buf[16];
    cr_assert_eq(kw_k_compile_arch(KW_K_INDEXER_LOGITS, "sm_90", buf,
                                   sizeof buf), 0);
    cr_assert_str_eq(buf, "sm_90a");
    cr_assert_eq(kw_k_compile_arch(KW_K_INDEXER_LOGITS, "sm_100", buf,
                                   sizeof buf), 0);
    cr_assert_str_eq(buf, "sm_100");
    cr_assert_eq(kw_k_compile_arch(KW_K_INDEXER_TOPK, "sm_90", buf,
                                   sizeof buf), 0);
    cr_assert_str_eq(buf, "sm_90");
    cr_assert_eq(kw_k_compile_arch(KW_K_DCP_STABLE_TOPK, "sm_90", buf,
                                   sizeof buf), 0);
    cr_assert_str_eq(buf, "sm_90");
    cr_assert_eq(kw_k_compile_arch(KW_K_INDEXER_LOGITS, "sm_90", buf, 6),
                 KW_ENOSPC);
    kw_keys_key k = {.family = KW_K_INDEXER_LOGITS,
                     .fields = {64, 128, 0, 0, 1}};
    kw_keys_build b;
    kw_jit_req req;
    memcpy(k.arch, "sm_90", 6);
    cr_assert_eq(kw_keys_jit_req(&k, &b, &req), 0);
    cr_assert_str_eq(req.arch, "sm_90a");
    cr_assert_str_eq(k.arch, "sm_90"); /* stored under the key's arch */
}

Test(keys, indexer_fields_print_booleans)
{
    cr_assert(kw_keys_field_is_bool(KW_K_INDEXER_LOGITS, 2));
    cr_assert(!kw_keys_field_is_bool(KW_K_INDEXER_LOGITS, 3));
    cr_assert(kw_keys_field_is_bool(KW_K_INDEXER_TOPK, 1));
    cr_assert(!kw_keys_field_is_bool(KW_K_INDEXER_TOPK, 0));
}

/* The packed form (kw_keys_derive_packed, kw_keys_pack): the same keys in
 * the same order, digests included, at a few bytes a key. */
static void expect_same_keys(const kw_keys_packed *p, const kw_keys_set *s)
{
    kw_keys_cursor cur = {0};
    kw_keys_key k;
    size_t i = 0;
    cr_assert_eq(p->n, s->nkeys);
    for (; kw_keys_pack_next(p, &cur, &k); i++) {
        const kw_keys_key *e = &s->keys[i];
        cr_assert(k.family == e->family && strcmp(k.arch, e->arch) == 0 &&
                      memcmp(k.fields, e->fields, sizeof k.fields) == 0 &&
                      memcmp(k.digest, e->digest, KW_KEYS_DIGEST_LEN) == 0,
                  "key %zu differs once packed", i);
    }
    cr_assert_eq(i, s->nkeys, "the cursor read every key");
}

Test(keys, packed_derivation_gives_the_same_keys_in_a_few_bytes_each)
{
    fixture fx;
    const char *flags[] = {"--dcp-world", "64", "--arch", "sm_90,sm_100", NULL};
    derive(&fx, "{" TOPK2048 "}", flags);
    char err[KW_CONFIG_ERRLEN] = "";
    kw_keys_packed p, q;
    cr_assert_eq(kw_keys_derive_packed(&fx.m, &fx.d, &p, err, sizeof err), 0,
                 "%s", err);
    cr_assert_gt(p.n, 500, "%zu keys", p.n);
    cr_expect_null(p.keys, "every derived key packs");
    cr_expect_lt(kw_keys_pack_bytes(&p), p.n * 4, "%zu bytes for %zu keys",
                 kw_keys_pack_bytes(&p), p.n);
    cr_expect_eq(p.workspace_rows, fx.s.workspace_rows);
    cr_expect_eq(p.workspace_bytes, fx.s.workspace_bytes);
    expect_same_keys(&p, &fx.s);
    kw_keys_cursor cur = {0};
    kw_keys_key k;
    static const uint8_t zeros[KW_KEYS_DIGEST_LEN];
    cr_assert(kw_keys_pack_read(&p, &cur, &k, false));
    cr_expect(k.family == fx.s.keys[0].family &&
                  memcmp(k.fields, fx.s.keys[0].fields, sizeof k.fields) == 0 &&
                  memcmp(k.digest, zeros, sizeof zeros) == 0,
              "a read without the digest: the key, no digest");
    cr_assert_eq(kw_keys_pack(&q, fx.s.keys, fx.s.nkeys), 0);
    cr_expect_eq(q.len, p.len, "packing a set packs it as the derivation does");
    expect_same_keys(&q, &fx.s);
    kw_keys_pack_destroy(&p);
    kw_keys_pack_destroy(&q);
    release(&fx);
}

/* A set of more archs than a packed set's table holds is kept whole, and
 * read back the same. */
Test(keys, a_set_that_does_not_pack_is_kept_whole)
{
    kw_keys_key keys[KW_CONFIG_MAX_ARCH + 1];
    memset(keys, 0, sizeof keys);
    for (size_t i = 0; i <= KW_CONFIG_MAX_ARCH; i++) {
        snprintf(keys[i].arch, sizeof keys[i].arch, "sm_%zu", 10 + i);
        keys[i].fields[0] = (int64_t)i - 3;
        cr_assert_eq(kw_keys_digest(&keys[i], keys[i].digest), 0);
    }
    kw_keys_set s = {.keys = keys, .nkeys = KW_CONFIG_MAX_ARCH + 1};
    kw_keys_packed p;
    cr_assert_eq(kw_keys_pack(&p, keys, s.nkeys), 0);
    cr_expect_not_null(p.keys, "17 archs: kept whole");
    expect_same_keys(&p, &s);
    kw_keys_pack_destroy(&p);
    cr_assert_eq(kw_keys_pack(&p, keys, KW_CONFIG_MAX_ARCH), 0);
    cr_expect_null(p.keys, "16 archs: packed");
    s.nkeys = KW_CONFIG_MAX_ARCH;
    expect_same_keys(&p, &s);
    kw_keys_pack_destroy(&p);
}

/* ---- issue 23: entries that change only some fields, one entry for a
 * key on every arch ---- */

/* Field values that stress the deltas: both ends of int64 (whose
 * differences wrap), signs, and one- and many-byte magnitudes. */
static const int64_t edge_values[] = {0, -1, 1, INT64_MIN, INT64_MAX, 63, -64,
                                      INT64_MIN + 1, 1LL << 40, -(1LL << 40)};
#define NEDGE (sizeof edge_values / sizeof edge_values[0])

/* One key of a packing script: family f with the fields of row, on the
 * arches of archs[] named by the digits of order ("012": every arch in
 * table order, a run that packs as one entry; "10", "01": keys that do
 * not). */
typedef struct pack_step {
    kw_k_family f;
    unsigned row;
    const char *order;
} pack_step;

/* Appends the keys of step to keys[*n..]; odd fields change every third
 * row only, so an entry changes some fields and not others. */
static void add_step(kw_keys_key *keys, size_t *n, const pack_step *step,
                     const char *const *archs)
{
    for (const char *o = step->order; *o != '\0'; o++) {
        kw_keys_key *k = &keys[(*n)++];
        memset(k, 0, sizeof *k);
        k->family = step->f;
        for (size_t i = 0; i < kw_keys_nfields(step->f); i++) {
            unsigned r = i % 2 ? step->row / 3 : step->row;
            k->fields[i] = edge_values[(r * 7 + i * 3) % NEDGE];
        }
        snprintf(k->arch, sizeof k->arch, "%s", archs[*o - '0']);
        cr_assert_eq(kw_keys_digest(k, k->digest), 0);
    }
}

/* Packs the keys of steps[0..nsteps) and reads every one back. */
static void pack_script(const pack_step *steps, size_t nsteps,
                        const char *const *archs)
{
    kw_keys_key keys[64];
    size_t n = 0;
    for (size_t i = 0; i < nsteps; i++) {
        cr_assert_leq(n + strlen(steps[i].order), 64, "script too long");
        add_step(keys, &n, &steps[i], archs);
    }
    kw_keys_set s = {.keys = keys, .nkeys = n};
    kw_keys_packed p;
    cr_assert_eq(kw_keys_pack(&p, keys, n), 0);
    cr_expect_null(p.keys, "the script packs");
    expect_same_keys(&p, &s);
    kw_keys_pack_destroy(&p);
}

Test(keys, a_packed_set_reads_back_every_field_and_arch_in_order)
{
    static const char *const archs[] = {"sm_90", "sm_100", "sm_120"};
    const kw_k_family ic = KW_K_INDEX_CONVERSION, tk = KW_K_DCP_STABLE_TOPK,
                      pf = KW_K_PREFILL_CHUNK_METADATA;
    const pack_step three[] = {
        {ic, 0, "012"}, {ic, 1, "012"}, {tk, 2, "012"}, {ic, 3, "102"},
        {ic, 3, "01"},  {tk, 4, "0"},   {ic, 5, "012"}, {tk, 6, "2"},
        {pf, 7, "012"}, {pf, 7, "012"}, {ic, 8, "0120"}, {pf, 9, "21"},
        {ic, 3, "012"}, {tk, 10, "01"}};
    pack_script(three, sizeof three / sizeof three[0], archs);
    const pack_step one[] = {
        {tk, 0, "0"}, {tk, 1, "0"}, {ic, 2, "00"}, {tk, 3, "0"},
        {pf, 4, "0"}, {ic, 5, "0"}, {ic, 6, "0"},  {ic, 9, "0"}};
    pack_script(one, sizeof one / sizeof one[0], archs);
}

/* The case of the issue: DeepSeek-V4-Flash over every rank of a large
 * DCP world on two archs, in about 3 bytes a key. */
Test(keys, a_packed_derivation_of_a_large_world_reads_back_every_key)
{
    fixture fx;
    const char *flags[] = {"--dcp-world", "40000", "--dcp-rank", "all",
                           "--arch", "sm_90,sm_100", NULL};
    derive_from(&fx, KW_FIXTURES "/deepseek-v4-flash.json", NULL, flags);
    char err[KW_CONFIG_ERRLEN] = "";
    kw_keys_packed p;
    cr_assert_eq(kw_keys_derive_packed(&fx.m, &fx.d, &p, err, sizeof err), 0,
                 "%s", err);
    cr_assert_gt(p.n, 400000, "%zu keys", p.n);
    cr_expect_lt(kw_keys_pack_bytes(&p), p.n * 3, "%zu bytes for %zu keys",
                 kw_keys_pack_bytes(&p), p.n);
    expect_same_keys(&p, &fx.s);
    kw_keys_pack_destroy(&p);
    release(&fx);
}
