/* reqkey.c: the key a get or an evict names (handlers.h): a digest, a
 * unique prefix of a cached one, or family, fields and arch. */
#include "handlers.h"

#include <stdio.h>
#include <string.h>

#include <sodium.h>

#include "kw_err.h"

/* A digest of 64 hex digits, or a unique prefix of at least 8 of a cached
 * one (as git takes them): 0, or a code with the candidates or the rule
 * in err. */
static int get_digest(kw_cache *c, const char *hex, uint8_t *out, char *err,
                      size_t errlen)
{
    size_t n = 0, len = strlen(hex);
    if (len == 64 && sodium_hex2bin(out, KW_KEYS_DIGEST_LEN, hex, 64, NULL, &n,
                                    NULL) == 0 && n == KW_KEYS_DIGEST_LEN)
        return 0;
    char cand[600] = "";
    int rc = len >= 8 && len < 64 ? kw_cache_find_prefix(c, hex, out, cand,
                                                          sizeof cand)
                                  : KW_EINVAL;
    for (char *p = cand; (p = strchr(p, '\n')) != NULL;)
        *p = ' '; /* one line: a client prints no control characters */
    if (rc == KW_EAMBIGUOUS)
        snprintf(err, errlen, "get: digest %.64s: ambiguous prefix, it starts: %s",
                 hex, cand);
    else if (rc == KW_ENOTFOUND)
        snprintf(err, errlen, "get: digest %.64s: no cached digest starts so "
                 "(a digest cannot be compiled: give family, fields and arch)",
                 hex);
    else if (rc < 0)
        snprintf(err, errlen, "get: \"digest\" must be 64 hex digits, or a "
                 "prefix of 8 or more");
    return rc;
}

int kw__req_get_key(kw_cache *c, const cJSON *h, kw_keys_key *k,
                    bool *have_key, char *err, size_t errlen)
{
    const cJSON *dg = cJSON_GetObjectItemCaseSensitive(h, "digest");
    memset(k, 0, sizeof *k);
    *have_key = false;
    if (cJSON_IsString(dg))
        return get_digest(c, dg->valuestring, k->digest, err, errlen);
    int rc = kw__key_from_json(h, k, err, errlen);
    *have_key = rc == 0;
    return rc;
}

int kw__req_digest(kw_cache *c, const cJSON *h,
                   uint8_t digest[KW_KEYS_DIGEST_LEN], char *err, size_t errlen)
{
    kw_keys_key k;
    bool have_key;
    int rc = kw__req_get_key(c, h, &k, &have_key, err, errlen);
    if (rc == 0)
        memcpy(digest, k.digest, KW_KEYS_DIGEST_LEN);
    return rc;
}
