/* kw_keys.h: compile keys and their digests (prefix kw_keys_).
 *
 * Turns a validated model and resolved deployment into the compile keys of
 * spec/warmup-keys.md §4 (de-duplicated, crossed with every arch), the
 * workspace sizes of §5, and the BLAKE2b-256 digest of §6 for each key.
 *
 * The family registry lives here: each family's name, its fields (in the
 * spec's order, which is also the digest's and the kernel template's), the
 * embedded source it compiles, and the function deriving its keys.
 *
 * Thread-safety: no global state; call from any thread.
 */
#ifndef KW_KEYS_H
#define KW_KEYS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "kw_config.h"
#include "kw_jit.h"
#include "kw_kernels.h"

#define KW_KEYS_SCHEMA 1           /* version of the canonical key encoding */
#define KW_KEYS_MAX_FIELDS 13      /* index_conversion has the most */
#define KW_KEYS_MAX (1u << 20)     /* keys one derivation may produce */
#define KW_KEYS_DIGEST_LEN 32      /* BLAKE2b-256 */
#define KW_KEYS_HEX_LEN 65         /* 64 hex digits + NUL */

/* One compile key: a family instantiation for one arch. */
typedef struct kw_keys_key {
    kw_k_family family;
    int64_t fields[KW_KEYS_MAX_FIELDS]; /* kw_keys_nfields(family) used */
    char arch[KW_CONFIG_ARCH_LEN];
    uint8_t digest[KW_KEYS_DIGEST_LEN];
} kw_keys_key;

/* The result of kw_keys_derive(); owns keys, free with
 * kw_keys_set_destroy(). */
typedef struct kw_keys_set {
    kw_keys_key *keys;
    size_t nkeys;
    int64_t workspace_rows;
    int64_t workspace_bytes;
} kw_keys_set;

/* Derives every key of (m, d) with its digest, and the workspace sizes.
 * d must have been through kw_config_resolve() with m.
 * Returns 0; KW_EDEPLOY when the set would exceed KW_KEYS_MAX keys or the
 * workspace overflows 64 bits (message in err); KW_ENOMEM; or the error of
 * the toolchain query behind the digests. */
int kw_keys_derive(const kw_config_model *m, const kw_config_deploy *d,
                   kw_keys_set *out, char *err, size_t errlen);

/* Frees what s owns and zeroes it.  NULL is fine. */
void kw_keys_set_destroy(kw_keys_set *s);

/* The delta state of a packed set's entries: the family and fields of
 * the last entry, which the next entry of that family changes.  Internal
 * to keypack.c; {0} is the state before the first entry. */
typedef struct kw_keys_delta {
    uint8_t family;
    int64_t fields[KW_KEYS_MAX_FIELDS];
} kw_keys_delta;

/* A key set packed, for a holder of many keys for long (a warm job, a
 * streamed reply): about 3 bytes a key instead of 152 (2.75 for V4 at
 * dcp_world 40000 on two archs).  Each entry is a family, an arch index
 * or "every arch of the table", and the fields that changed since the
 * previous entry, as varints of the difference; the digest is computed
 * again as a key is read back.  Read in order through a kw_keys_cursor.
 * Caller-allocated; kw_keys_pack_destroy() frees what it owns. */
typedef struct kw_keys_packed {
    uint8_t *buf;      /* packed keys (malloc'd), or NULL */
    size_t len, cap;   /* bytes used, allocated */
    kw_keys_key *keys; /* the keys as they were, when they do not pack */
    size_t n;          /* keys */
    char archs[KW_CONFIG_MAX_ARCH][KW_CONFIG_ARCH_LEN];
    size_t narchs;
    int64_t workspace_rows, workspace_bytes; /* kw_keys_derive_packed() */
    kw_keys_delta last; /* the last entry packed: what the next one changes */
} kw_keys_packed;

/* Where a reading of a packed set is: key i; the next entry at byte off;
 * within an entry that stands for every arch, whether one is open and
 * the arch of its next key; and the fields read so far, the base of the
 * next entry's changes.  {0}: the first key.  Reading is sequential
 * only: a cursor is stepped from {0}, never set to a key. */
typedef struct kw_keys_cursor {
    size_t i, off;
    uint8_t arch; /* the next arch of an open entry */
    bool open;    /* an every-arch entry has keys left */
    kw_keys_delta last;
} kw_keys_cursor;

/* An empty set (also what destroy leaves). */
void kw_keys_pack_init(kw_keys_packed *p);

/* Packs a copy of keys[0..n) into p (initialised here).  Returns 0 or
 * KW_ENOMEM (p then empty). */
int kw_keys_pack(kw_keys_packed *p, const kw_keys_key *keys, size_t n);

/* kw_keys_derive() straight into the packed form: the set of 152-byte
 * keys is never made, and no digest is computed (a reader computes each
 * as it reads the key), so the derivation's peak is its largest family's
 * de-duplication table.  p->n is the key count, p->workspace_* the sizes
 * of §5.  Returns as kw_keys_derive(); p is empty on error. */
int kw_keys_derive_packed(const kw_config_model *m, const kw_config_deploy *d,
                          kw_keys_packed *p, char *err, size_t errlen);

/* Reads the key at cur into k (digest computed) and steps cur; false at
 * the end of p. */
bool kw_keys_pack_next(const kw_keys_packed *p, kw_keys_cursor *cur,
                       kw_keys_key *k);

/* The same, with the digest computed only when digest is set (else
 * k->digest is zeros, unless the set is kept unpacked): a reader that
 * only counts or cancels keys skips the BLAKE2b, most of a read's cost. */
bool kw_keys_pack_read(const kw_keys_packed *p, kw_keys_cursor *cur,
                       kw_keys_key *k, bool digest);

/* The bytes p holds (for a budget or a log). */
size_t kw_keys_pack_bytes(const kw_keys_packed *p);

/* Moves src's keys into dst (src left empty; dst's own are not freed). */
void kw_keys_pack_move(kw_keys_packed *dst, kw_keys_packed *src);

/* Frees what p owns and empties it.  NULL is fine. */
void kw_keys_pack_destroy(kw_keys_packed *p);

/* Registry queries.  Names are static strings.  kw_keys_family_from_name()
 * returns 0 or KW_ENOFAMILY. */
const char *kw_keys_family_name(kw_k_family f);
int kw_keys_family_from_name(const char *name, kw_k_family *out);
size_t kw_keys_nfields(kw_k_family f);
const char *kw_keys_field_name(kw_k_family f, size_t i);
bool kw_keys_field_is_bool(kw_k_family f, size_t i);

/* Computes key k's digest (§6) into out from its family, fields and arch.
 * Returns 0 or a negative code from the toolchain query. */
int kw_keys_digest(const kw_keys_key *k, uint8_t out[KW_KEYS_DIGEST_LEN]);

/* One digest of every family's embedded device source (the per-family
 * digests that enter every key's digest, in family order): what `--version`
 * shows as the kernel sources, so two builds that derive the same digests
 * can be told apart from two that do not.  0 or the toolchain query's
 * code. */
int kw_keys_sources_digest(uint8_t out[KW_KEYS_DIGEST_LEN]);

/* Writes the lowercase hex of a digest into hex (KW_KEYS_HEX_LEN bytes). */
void kw_keys_hex(const uint8_t digest[KW_KEYS_DIGEST_LEN], char *hex);

/* Builds the document of `kwarm keys --json` (§6) as a new cJSON tree, the
 * caller's to cJSON_Delete().  Returns 0 or KW_ENOMEM. */
int kw_keys_to_json(const kw_config_model *m, const kw_config_deploy *d,
                    const kw_keys_set *s, cJSON **out);

/* Builds one key's JSON object {"family", "arch", "fields", "digest"}. */
cJSON *kw_keys_key_json(const kw_keys_key *k);

/* Storage behind one rendered compile request: the name expression and
 * the named headers.  Caller-allocated; the request borrows from it. */
#define KW_KEYS_MAX_HEADERS 8
typedef struct kw_keys_build {
    char name_expr[512];
    char arch[KW_CONFIG_ARCH_LEN + 1]; /* kw_k_compile_arch() of the key */
    kw_jit_header headers[KW_KEYS_MAX_HEADERS];
    size_t nheaders;
} kw_keys_build;

/* Renders key k into an NVRTC request for kw_jit_compile(): the family's
 * embedded source and headers, its template name expression, and the
 * arch it builds for (kw_k_compile_arch: sm_90a for sm_90 indexer_logits).
 * req borrows from b and from k (the arch), which must outlive it.
 * Returns 0, KW_ENOFAMILY (no source embedded) or KW_ENOSPC. */
int kw_keys_jit_req(const kw_keys_key *k, kw_keys_build *b, kw_jit_req *req);

/* Renders and compiles k (see kw_jit_compile() for res and the codes).
 * res is always safe to pass to kw_jit_result_destroy().  Thread-safe. */
int kw_keys_compile(const kw_keys_key *k, bool want_ptx, kw_jit_result *res);

#endif /* KW_KEYS_H */
