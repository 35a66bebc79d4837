/* registry.c: the kernel family registry and the key digest (§6).
 *
 * A family is its kernels/ entry (name, fields and their kinds in the
 * spec's order, the embedded source kernels/<name>.cu plus the headers it
 * includes, the arch it builds for) and its key derivation (keys.c).
 */
#include "kw_keys.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "internal.h"
#include "kw_bytes.h"
#include "kw_err.h"
#include "kw_jit.h"

_Static_assert(KW_KEYS_MAX_FIELDS >= KW_K_MAX_FIELDS,
               "a key holds every field of every family");

const char *kw_keys_family_name(kw_k_family f)
{
    const char *n = kw_k_family_name(f);
    return n != NULL ? n : "?";
}

int kw_keys_family_from_name(const char *name, kw_k_family *out)
{
    return kw_k_family_from_name(name, out);
}

size_t kw_keys_nfields(kw_k_family f)
{
    return kw_k_nfields(f);
}

const char *kw_keys_field_name(kw_k_family f, size_t i)
{
    const char *n = kw_k_field_name(f, i);
    return n != NULL ? n : "?";
}

bool kw_keys_field_is_bool(kw_k_family f, size_t i)
{
    return kw_k_field_is_bool(f, i);
}

/* The canonical encoding: every variable-size item is length-prefixed
 * (u32 little-endian), integers are i64 little-endian, so no two distinct
 * keys share a byte string. */
static void put_u64(crypto_generichash_state *st, uint64_t v)
{
    uint8_t b[8];
    kw_le64_put(b, v);
    crypto_generichash_update(st, b, 8);
}

static void put_str(crypto_generichash_state *st, const char *s, size_t n)
{
    put_u64(st, n);
    crypto_generichash_update(st, (const uint8_t *)s, n);
}

/* Digest of a family's device source: kernels/<name>.cu and the headers
 * it includes (kw_k_source_uses), name and text, in the embedded (sorted)
 * order.  A family whose source is not built yet hashes as the empty
 * source.  KW_ENOSPC when the build embedded more than KW_K_MAX_FILES. */
static int source_digest(kw_k_family f, uint8_t out[KW_KEYS_DIGEST_LEN])
{
    bool use[KW_K_MAX_FILES];
    if (kw_k_nfiles > KW_K_MAX_FILES)
        return KW_ENOSPC;
    if (kw_k_source_uses(kw_k_files, kw_k_nfiles, kw_k_source_name(f), use) < 0)
        memset(use, 0, sizeof use);
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, KW_KEYS_DIGEST_LEN);
    for (size_t i = 0; i < kw_k_nfiles; i++) {
        if (!use[i])
            continue;
        put_str(&st, kw_k_files[i].name, strlen(kw_k_files[i].name));
        put_str(&st, kw_k_files[i].text, kw_k_files[i].len);
    }
    crypto_generichash_final(&st, out, KW_KEYS_DIGEST_LEN);
    return 0;
}

/* The context, computed once per process: the embedded sources and the
 * NVRTC loaded do not change while it runs, and recomputing it cost every
 * kw_keys_digest() call (kwarmd's get by fields among them) about 140 us
 * of hashing, 170 us once headers were followed by include. */
static kw__keys_digest_ctx g_ctx;
static int g_ctx_rc;
static pthread_once_t g_ctx_once = PTHREAD_ONCE_INIT;

static void ctx_init_once(void)
{
    int rc = kw_jit_version(&g_ctx.nvrtc_major, &g_ctx.nvrtc_minor);
    if (rc == 0 && sodium_init() < 0)
        rc = KW_ENOMEM;
    for (int f = 0; f < KW_K_NFAMILIES && rc == 0; f++)
        rc = source_digest((kw_k_family)f, g_ctx.source[f]);
    g_ctx_rc = rc;
}

int kw__keys_digest_init(kw__keys_digest_ctx *ctx)
{
    pthread_once(&g_ctx_once, ctx_init_once);
    if (g_ctx_rc == 0)
        *ctx = g_ctx;
    return g_ctx_rc;
}

void kw__keys_digest_with(const kw__keys_digest_ctx *ctx, const kw_keys_key *k,
                          uint8_t out[KW_KEYS_DIGEST_LEN])
{
    const char *name = kw_keys_family_name(k->family);
    crypto_generichash_state st;
    crypto_generichash_init(&st, NULL, 0, KW_KEYS_DIGEST_LEN);
    put_str(&st, "kwarm-key", 9);
    put_u64(&st, KW_KEYS_SCHEMA);
    put_str(&st, name, strlen(name));
    size_t nf = kw_keys_nfields(k->family);
    put_u64(&st, nf);
    for (size_t i = 0; i < nf; i++) {
        const char *field = kw_keys_field_name(k->family, i);
        put_str(&st, field, strlen(field));
        put_u64(&st, (uint64_t)k->fields[i]);
    }
    put_str(&st, k->arch, strlen(k->arch));
    crypto_generichash_update(&st, ctx->source[k->family], KW_KEYS_DIGEST_LEN);
    put_u64(&st, (uint64_t)ctx->nvrtc_major);
    put_u64(&st, (uint64_t)ctx->nvrtc_minor);
    /* The options NVRTC will be given, arch option included: the compile
     * arch (sm_90a for an sm_90 indexer_logits key), which equals k->arch
     * for every other key, so their digests did not change. */
    char arch[KW_CONFIG_ARCH_LEN + 1];
    if (kw_k_compile_arch(k->family, k->arch, arch, sizeof arch) < 0)
        snprintf(arch, sizeof arch, "%s", k->arch);
    const char *opts[32];
    size_t nopts = kw_jit_default_opts(arch, opts, 32);
    put_u64(&st, nopts);
    for (size_t i = 0; i < nopts && i < 32; i++)
        put_str(&st, opts[i], strlen(opts[i]));
    crypto_generichash_final(&st, out, KW_KEYS_DIGEST_LEN);
}

int kw_keys_digest(const kw_keys_key *k, uint8_t out[KW_KEYS_DIGEST_LEN])
{
    kw__keys_digest_ctx ctx;
    if ((unsigned)k->family >= KW_K_NFAMILIES)
        return KW_ENOFAMILY;
    int rc = kw__keys_digest_init(&ctx);
    if (rc == 0)
        kw__keys_digest_with(&ctx, k, out);
    return rc;
}

void kw_keys_hex(const uint8_t digest[KW_KEYS_DIGEST_LEN], char *hex)
{
    sodium_bin2hex(hex, KW_KEYS_HEX_LEN, digest, KW_KEYS_DIGEST_LEN);
}

int kw_keys_sources_digest(uint8_t out[KW_KEYS_DIGEST_LEN])
{
    kw__keys_digest_ctx ctx;
    crypto_generichash_state st;
    int rc = kw__keys_digest_init(&ctx);
    if (rc < 0)
        return rc;
    crypto_generichash_init(&st, NULL, 0, KW_KEYS_DIGEST_LEN);
    for (int f = 0; f < KW_K_NFAMILIES; f++)
        crypto_generichash_update(&st, ctx.source[f], KW_KEYS_DIGEST_LEN);
    crypto_generichash_final(&st, out, KW_KEYS_DIGEST_LEN);
    return 0;
}
