/* internal.h: helpers shared by jit/'s own files (kw__config_, kw__keys_).
 * Not API: nothing outside jit/ includes this header. */
#ifndef KW_JIT_INTERNAL_H
#define KW_JIT_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

/* Largest value of a deployment integer (§2): 2^31 - 1. */
#define KW__INT_MAX 2147483647LL

/* Formats one error line into err (truncating, always NUL-terminated). */
void kw__config_errf(char *err, size_t errlen, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

/* Reads the whole file at path into a malloc'd, NUL-terminated buffer of at
 * most KW_CONFIG_MAX_FILE bytes.  A directory, an unreadable or an oversized
 * file is an error whose message names path.  Returns 0, -errno, -EFBIG or
 * KW_ENOMEM; *buf is the caller's to free on success. */
int kw__config_read_file(const char *path, char **buf, size_t *len, char *err,
                         size_t errlen);

/* Parses len bytes of buf as strict RFC 8259 JSON whose root is an object:
 * valid UTF-8, no NUL byte, no NaN/Infinity, numbers by the RFC grammar, no
 * trailing data, no object with two members of one name.  On success *out is
 * the caller's tree (cJSON_Delete).  Returns 0 or KW_EJSON (message names
 * name, and the line and column or JSON pointer), or KW_ENOMEM. */
int kw__config_parse(const char *name, const char *buf, size_t len,
                     cJSON **out, char *err, size_t errlen);

/* Reads item as an integer by §2's rule (a number whose double value is
 * integral) in [lo, hi].  ptr is its JSON pointer, for the message.
 * Returns 0 or KW_ECONFIG with the message in err. */
int kw__config_int(const cJSON *item, const char *name, const char *ptr,
                   int64_t lo, int64_t hi, int64_t *out, char *err,
                   size_t errlen);

/* Appends "/" and the JSON-pointer escape of token (~ as ~0, / as ~1) to the
 * pointer in buf (cap bytes).  Returns 0 or KW_ENOSPC. */
int kw__config_ptr_append(char *buf, size_t cap, const char *token);

/* What every digest of one derivation shares, computed once: the NVRTC
 * version and each family's source digest. */
#include "kw_keys.h"
typedef struct kw__keys_digest_ctx {
    int nvrtc_major, nvrtc_minor;
    uint8_t source[KW_K_NFAMILIES][KW_KEYS_DIGEST_LEN];
} kw__keys_digest_ctx;

/* Fills ctx (computed at the first call, then copied).  Returns 0 or the
 * NVRTC version query's error. */
int kw__keys_digest_init(kw__keys_digest_ctx *ctx);

/* Computes k's digest (§6) with ctx; k->family must be valid. */
void kw__keys_digest_with(const kw__keys_digest_ctx *ctx, const kw_keys_key *k,
                          uint8_t out[KW_KEYS_DIGEST_LEN]);

/* A packed set's entries (keypack.c, the format in its header): the
 * arch byte of an entry that is its key once for every arch of the
 * table, in table order (a derivation's row crossed with its archs). */
#define KW__KEYS_ARCH_ALL 0xff
/* Bytes of one family's fields as varints at most. */
#define KW__KEYS_ROW_MAX (10 * KW_KEYS_MAX_FIELDS)
/* Bytes of one entry at most: family, arch, a mask of up to 13 bits in
 * two bytes, then the changed fields. */
#define KW__KEYS_ENTRY_MAX (2 + 2 + KW__KEYS_ROW_MAX)

/* Writes fields[0..nf) as zigzag varints at out (room for
 * KW__KEYS_ROW_MAX bytes); the bytes written.  Equal fields give equal
 * bytes, and no encoding is a prefix of another of the same nf. */
size_t kw__keys_put_fields(uint8_t *out, const int64_t *fields, size_t nf);
/* Reads nf fields of kw__keys_put_fields() at in; the bytes read. */
size_t kw__keys_get_fields(const uint8_t *in, int64_t *fields, size_t nf);

/* Writes one entry (family, arch: an index or KW__KEYS_ARCH_ALL, the
 * family's fields) at out (room for KW__KEYS_ENTRY_MAX bytes) as the
 * fields that differ from st's, and moves st to it; the bytes written. */
size_t kw__keys_entry_put(uint8_t *out, kw_keys_delta *st, kw_k_family family,
                          uint8_t arch, const int64_t *fields);
/* Reads the entry at in, written against the state st holds, into st
 * (family and fields) and *arch; the bytes read. */
size_t kw__keys_entry_get(const uint8_t *in, kw_keys_delta *st, uint8_t *arch);

/* Appends one entry to p: a key (family, the index of its arch in
 * p->archs, its fields), or with arch KW__KEYS_ARCH_ALL that key once for
 * every arch of p's table.  0 or KW_ENOMEM (keypack.c). */
int kw__keys_pack_add(kw_keys_packed *p, kw_k_family family, int arch,
                      const int64_t *fields);
/* Gives back p's spare bytes (a failed shrink keeps them). */
void kw__keys_pack_shrink(kw_keys_packed *p);

#endif /* KW_JIT_INTERNAL_H */
