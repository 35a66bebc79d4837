/* reqkey.c: the key a get or an evict names (handlers.h): a digest, a
 * unique prefix of a cached one, or family, fields and arch. */
#include "handlers.h"

#include <stdio.h>
#include <string.h>

#include "kw_err.h"

/* A get's digest: kw_warm_digest, its message prefixed "get: ", with
 * what to do instead when no cached digest starts so. */
static int get_digest(kw_cache *c, const char *hex, uint8_t *out, char *err,
                      size_t errlen)
{
    char why[700];
    int rc = kw_warm_digest(c, hex, out, why, sizeof why);
    if (rc == KW_ENOTFOUND)
        snprintf(err, errlen, "get: %s (a digest cannot be compiled: give "
                 "family, fields and arch)", why);
    else if (rc < 0)
        snprintf(err, errlen, "get: %s", why);
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
