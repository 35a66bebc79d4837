/* misses.c: the `misses` request, on a job thread (issue 13).
 *
 * Request {"since": SECONDS} (0 or absent: every record kept).  Each miss
 * comes back with the nearest cached key of the same family and arch (the
 * fewest fields that differ), those fields with both values, and the pin
 * sets (deployments) that hold that nearest key: what a serving process
 * asked for beside what was warmed.  Streamed like `keys`: PROGRESS frames
 * {"misses": [...]} of up to KW__STREAM_KEYS, then RESULT {"count",
 * "since"}.
 */
#include "handlers.h"

#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"
#include "kw_err.h"

/* One cached entry, enough to compare with a miss. */
typedef struct entry {
    uint8_t digest[KW_CACHE_DIGEST_LEN];
    kw_k_family family;
    char arch[16];
    int64_t fields[KW_CACHE_MAX_FIELDS];
    uint32_t nfields;
} entry;

typedef struct entries {
    entry *v;
    size_t n, cap;
} entries;

static int collect(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                   const kw_cache_info *info, void *arg)
{
    entries *es = arg;
    kw_k_family f;
    if (kw_keys_family_from_name(info->family, &f) < 0)
        return 0; /* another build's family: nothing to compare */
    if (es->n == es->cap) {
        size_t cap = es->cap ? es->cap * 2 : 256;
        entry *v = kw_realloc(es->v, cap * sizeof *v);
        if (v == NULL)
            return KW_ENOMEM;
        es->v = v;
        es->cap = cap;
    }
    entry *e = &es->v[es->n++];
    memcpy(e->digest, digest, KW_CACHE_DIGEST_LEN);
    e->family = f;
    snprintf(e->arch, sizeof e->arch, "%s", info->arch);
    e->nfields = info->nfields;
    memcpy(e->fields, info->fields, sizeof e->fields);
    return 0;
}

/* The cached entry of m's family and arch with the fewest differing
 * fields, or NULL. */
static const entry *nearest(const entries *es, const kw__miss *m)
{
    const entry *best = NULL;
    size_t best_d = SIZE_MAX, n = kw_keys_nfields(m->key.family);
    for (size_t i = 0; i < es->n; i++) {
        const entry *e = &es->v[i];
        if (e->family != m->key.family || strcmp(e->arch, m->key.arch) != 0 ||
            e->nfields != n)
            continue;
        size_t d = 0;
        for (size_t f = 0; f < n; f++)
            d += e->fields[f] != m->key.fields[f];
        if (d < best_d) {
            best = e;
            best_d = d;
        }
    }
    return best;
}

/* {"digest", "differ": [{"field", "requested", "cached"}], "pins": [...]} */
static cJSON *nearest_json(kw_cache *c, const entry *e, const kw__miss *m)
{
    char hex[KW_KEYS_HEX_LEN], names[1024] = "";
    cJSON *o = cJSON_CreateObject(), *diff = cJSON_CreateArray(), *pins;
    kw_keys_hex(e->digest, hex);
    cJSON_AddStringToObject(o, "digest", hex);
    for (size_t f = 0; f < e->nfields; f++) {
        if (e->fields[f] == m->key.fields[f])
            continue;
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "field", kw_keys_field_name(m->key.family, f));
        cJSON_AddNumberToObject(d, "requested", (double)m->key.fields[f]);
        cJSON_AddNumberToObject(d, "cached", (double)e->fields[f]);
        cJSON_AddItemToArray(diff, d);
    }
    cJSON_AddItemToObject(o, "differ", diff);
    kw_cache_pin_names(c, e->digest, names, sizeof names, NULL);
    pins = cJSON_AddArrayToObject(o, "pins");
    for (char *save = NULL, *t = strtok_r(names, ",", &save); t != NULL;
         t = strtok_r(NULL, ",", &save))
        cJSON_AddItemToArray(pins, cJSON_CreateString(t));
    return o;
}

/* One miss's entry of the reply; NULL when out of memory. */
static cJSON *miss_json(kw_cache *c, const entries *es, const kw__miss *m)
{
    cJSON *o = kw__audit_json(m);
    const entry *e = m->have_key ? nearest(es, m) : NULL;
    if (o != NULL)
        cJSON_AddItemToObject(o, "nearest", e ? nearest_json(c, e, m)
                                              : cJSON_CreateNull());
    return o;
}

void kw__run_misses(kw__req *r)
{
    const cJSON *since = cJSON_GetObjectItemCaseSensitive(r->header, "since");
    if (since != NULL && (!cJSON_IsNumber(since) || since->valuedouble < 0)) {
        kw__req_error(r, KW_EINVAL, "misses: \"since\" must be seconds >= 0");
        return;
    }
    uint64_t now = kw__audit_now(), age = since ? (uint64_t)since->valuedouble : 0;
    uint64_t from = age > 0 && age < now ? now - age : 0;
    kw__miss *v = NULL;
    size_t n = kw__audit_snapshot(&r->d->audit, from, &v);
    entries es = {0};
    /* Not through warm/: the nearest cached key of each miss is found
     * among every entry's family, fields and arch, one walk per request;
     * warm/ has no such call yet, and kw_warm_ls would build the JSON of
     * every entry to read three fields of each (left as it is; issue 23
     * point 8 names it). */
    int rc = kw_cache_foreach(r->d->cache, collect, &es);
    for (size_t i = 0; rc == 0 && i < n;) {
        cJSON *h = cJSON_CreateObject(), *arr = h ? cJSON_AddArrayToObject(h, "misses")
                                                  : NULL;
        for (size_t k = 0; arr != NULL && k < KW__STREAM_KEYS && i < n; k++, i++) {
            cJSON *o = miss_json(r->d->cache, &es, &v[i]);
            if (o == NULL || !cJSON_AddItemToArray(arr, o))
                rc = KW_ENOMEM;
        }
        if (arr == NULL)
            rc = KW_ENOMEM;
        if (rc == 0)
            rc = kw__req_progress(r, h); /* parks while the client is slow */
        cJSON_Delete(h);
    }
    cJSON *res = rc == 0 ? cJSON_CreateObject() : NULL;
    if (res != NULL && (!cJSON_AddNumberToObject(res, "count", (double)n) ||
                        !cJSON_AddNumberToObject(res, "since", (double)from))) {
        cJSON_Delete(res);
        res = NULL;
    }
    if (rc < 0)
        kw__req_error(r, rc, NULL);
    else
        kw__req_finish(r, KW_PROTO_RESULT, res);
    cJSON_Delete(res);
    free(es.v);
    free(v);
}
