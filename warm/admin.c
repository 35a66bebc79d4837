/* admin.c: what `kwarm ls`, `evict`, `pins`, `unpin` and `resize` do to a
 * cache, as JSON documents, so the CLI (--cache) and kwarmd (--socket)
 * answer with the same document and print it the same way.
 *
 * An entry of ls and evict is
 *   {"digest", "family", "arch", "fields": {name: value, ...}, "size",
 *    "created", "last_used", "hits", "pinned", "pins": [NAME, ...]}
 * Field names come from the key registry (jit/); an entry of a family this
 * build does not know keeps its values as an array.
 */
#include "kw_warm.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>
#include <sodium.h>

#include "kw_err.h"

/* Which entries a walk keeps: kw_warm_filter (kw_warm.h). */
typedef kw_warm_filter filter;

/* Unused: the struct below documents kw_warm_filter's members. */
typedef struct filter_doc {
    const char *family;   /* --family */
    const char *pin_name; /* --pinned NAME */
    const uint8_t *digest; /* --digest, resolved */
    bool unpinned;        /* --unpinned */
    uint64_t before;      /* --older-than: last used at or before this */
} filter_doc;

typedef struct walk {
    const filter *f;
    kw_cache *c;
    cJSON *entries; /* array being filled */
    uint64_t bytes;
    int rc;
    size_t max;     /* kw_warm_ls_page: entries a page holds (0: all) */
    uint8_t next[KW_CACHE_DIGEST_LEN]; /* where the next page starts */
    bool more;      /* an entry was left for the next page */
} walk;

/* Adds info's fields to e, by name when the family is known. */
static bool add_fields(cJSON *e, const kw_cache_info *info)
{
    kw_k_family fam;
    bool known = kw_keys_family_from_name(info->family, &fam) == 0 &&
                 kw_keys_nfields(fam) == info->nfields;
    cJSON *f = known ? cJSON_AddObjectToObject(e, "fields")
                     : cJSON_AddArrayToObject(e, "fields");
    bool ok = f != NULL;
    for (uint32_t i = 0; ok && i < info->nfields; i++) {
        cJSON *v = known && kw_keys_field_is_bool(fam, i)
                       ? cJSON_CreateBool(info->fields[i] != 0)
                       : cJSON_CreateNumber((double)info->fields[i]);
        ok = v != NULL && (known ? cJSON_AddItemToObject(f, kw_keys_field_name(fam, i), v)
                                 : cJSON_AddItemToArray(f, v));
        if (!ok)
            cJSON_Delete(v); /* not attached: ours to free */
    }
    return ok;
}

/* Splits the comma-separated pin names into an array "pins" of e; false
 * when out of memory. */
static bool add_pins(cJSON *e, char *names)
{
    cJSON *arr = cJSON_AddArrayToObject(e, "pins");
    bool ok = arr != NULL;
    for (char *save = NULL, *n = strtok_r(names, ",", &save); ok && n;
         n = strtok_r(NULL, ",", &save)) {
        cJSON *v = cJSON_CreateString(n);
        ok = v != NULL && cJSON_AddItemToArray(arr, v);
        if (!ok)
            cJSON_Delete(v);
    }
    return ok;
}

/* True when the comma-separated list names holds name. */
static bool names_hold(const char *names, const char *name)
{
    size_t n = strlen(name);
    for (const char *p = names; *p != '\0';) {
        size_t len = strcspn(p, ",");
        if (len == n && strncmp(p, name, n) == 0)
            return true;
        p += len + (p[len] == ',');
    }
    return false;
}

static bool keep(const filter *f, const uint8_t *digest,
                 const kw_cache_info *info, const char *names)
{
    uint64_t used = info->last_used ? info->last_used : info->created;
    return (f->family == NULL || strcmp(f->family, info->family) == 0) &&
           (f->pin_name == NULL || names_hold(names, f->pin_name)) &&
           (f->digest == NULL ||
            memcmp(f->digest, digest, KW_CACHE_DIGEST_LEN) == 0) &&
           (!f->unpinned || !info->pinned) &&
           (f->before == 0 || used <= f->before);
}

static int visit(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                 const kw_cache_info *info, void *arg)
{
    walk *w = arg;
    char names[1024] = "", hex[KW_KEYS_HEX_LEN];
    int rc = kw_cache_pin_names(w->c, digest, names, sizeof names, NULL);
    if (rc < 0 && rc != KW_ENOSPC)
        return w->rc = rc;
    if (!keep(w->f, digest, info, names))
        return 0;
    cJSON *e = cJSON_CreateObject();
    if (e == NULL || !cJSON_AddItemToArray(w->entries, e)) {
        cJSON_Delete(e);
        return w->rc = KW_ENOMEM;
    }
    kw_keys_hex(digest, hex);
    /* An entry with a member missing would read as whole: out of memory,
     * the listing fails instead. */
    bool ok = cJSON_AddStringToObject(e, "digest", hex) &&
              cJSON_AddStringToObject(e, "family", info->family) &&
              cJSON_AddStringToObject(e, "arch", info->arch) &&
              add_fields(e, info) &&
              cJSON_AddNumberToObject(e, "size", (double)info->size) &&
              cJSON_AddNumberToObject(e, "created", (double)info->created) &&
              cJSON_AddNumberToObject(e, "last_used", (double)info->last_used) &&
              cJSON_AddNumberToObject(e, "hits", (double)info->hits) &&
              cJSON_AddBoolToObject(e, "pinned", info->pinned) &&
              add_pins(e, names);
    if (!ok)
        return w->rc = KW_ENOMEM;
    w->bytes += info->size;
    return 0;
}

/* The page's stop: the entry that did not fit starts the next page. */
static int visit_page(const uint8_t digest[KW_CACHE_DIGEST_LEN],
                      const kw_cache_info *info, void *arg)
{
    walk *w = arg;
    if (w->max > 0 && (size_t)cJSON_GetArraySize(w->entries) >= w->max) {
        memcpy(w->next, digest, KW_CACHE_DIGEST_LEN);
        w->more = true;
        return 1;
    }
    return visit(digest, info, w);
}

int kw_warm_ls_page(kw_cache *c, const kw_warm_filter *f, uint8_t *from,
                    size_t max, cJSON **entries, uint64_t *bytes, bool *more)
{
    walk w = {.f = f, .c = c, .max = max};
    w.entries = cJSON_CreateArray();
    int rc = w.entries ? kw_cache_foreach_from(c, from, visit_page, &w)
                       : KW_ENOMEM;
    if (rc >= 0 && w.rc < 0)
        rc = w.rc;
    if (rc < 0) {
        cJSON_Delete(w.entries);
        return rc;
    }
    memcpy(from, w.next, KW_CACHE_DIGEST_LEN);
    *more = w.more;
    *bytes = w.bytes;
    *entries = w.entries;
    return 0;
}

int kw_warm_ls(kw_cache *c, const kw_warm_filter *f, cJSON **out)
{
    walk w = {.f = f, .c = c};
    cJSON *doc = cJSON_CreateObject();
    w.entries = cJSON_AddArrayToObject(doc, "entries");
    int rc = w.entries ? kw_cache_foreach(c, visit, &w) : KW_ENOMEM;
    if (rc >= 0 && w.rc < 0)
        rc = w.rc;
    if (rc < 0) {
        cJSON_Delete(doc);
        return rc;
    }
    cJSON_AddNumberToObject(doc, "count", cJSON_GetArraySize(w.entries));
    cJSON_AddNumberToObject(doc, "bytes", (double)w.bytes);
    *out = doc;
    return 0;
}

static int pin_to_json(const kw_cache_pin_info *p, void *arg)
{
    cJSON *o = cJSON_CreateObject();
    if (o == NULL || !cJSON_AddItemToArray(arg, o))
        return KW_ENOMEM;
    cJSON_AddStringToObject(o, "name", p->name);
    cJSON_AddNumberToObject(o, "digests", (double)p->digests);
    cJSON_AddNumberToObject(o, "entries", (double)p->entries);
    cJSON_AddNumberToObject(o, "bytes", (double)p->bytes);
    cJSON_AddNumberToObject(o, "created", (double)p->created);
    return 0;
}

int kw_warm_pins(kw_cache *c, cJSON **out)
{
    cJSON *doc = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(doc, "pins");
    int rc = arr != NULL ? kw_cache_pins_foreach(c, pin_to_json, arr) : KW_ENOMEM;
    if (rc < 0)
        cJSON_Delete(doc);
    else
        *out = doc;
    return rc;
}

typedef struct find_pin {
    const char *name;
    kw_cache_pin_info found;
    bool hit;
} find_pin;

static int match_pin(const kw_cache_pin_info *p, void *arg)
{
    find_pin *f = arg;
    if (strcmp(p->name, f->name) != 0)
        return 0;
    f->found = *p;
    f->hit = true;
    return 1;
}

int kw_warm_unpin(kw_cache *c, const char *name, cJSON **doc)
{
    find_pin f = {.name = name};
    int rc = kw_cache_pins_foreach(c, match_pin, &f);
    if (rc >= 0 && !f.hit)
        rc = KW_ENOTFOUND;
    if (rc >= 0)
        rc = kw_cache_unpin_set(c, name);
    if (rc < 0)
        return rc;
    *doc = cJSON_CreateObject();
    cJSON_AddStringToObject(*doc, "name", name);
    cJSON_AddNumberToObject(*doc, "digests", (double)f.found.digests);
    cJSON_AddNumberToObject(*doc, "entries", (double)f.found.entries);
    cJSON_AddNumberToObject(*doc, "bytes", (double)f.found.bytes);
    return 0;
}

int kw_warm_resize(kw_cache *c, uint64_t size, cJSON **doc)
{
    kw_cache_stats before, after;
    int rc = kw_cache_stats_get(c, &before);
    if (rc == 0)
        rc = kw_cache_resize(c, size);
    if (rc == 0)
        rc = kw_cache_stats_get(c, &after);
    if (rc < 0)
        return rc;
    *doc = cJSON_CreateObject();
    cJSON_AddNumberToObject(*doc, "max_size", (double)after.max_size);
    cJSON_AddNumberToObject(*doc, "previous", (double)before.max_size);
    cJSON_AddNumberToObject(*doc, "evicted",
                            (double)(after.evictions - before.evictions));
    cJSON_AddNumberToObject(*doc, "entries", (double)after.entries);
    cJSON_AddNumberToObject(*doc, "bytes", (double)after.bytes);
    return 0;
}

int kw_warm_evict(kw_cache *c, cJSON *doc, bool force, char *err, size_t errlen)
{
    cJSON *arr = cJSON_GetObjectItemCaseSensitive(doc, "entries"), *e;
    size_t pinned = 0;
    cJSON_ArrayForEach(e, arr)
        pinned += cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "pinned"));
    if (pinned > 0 && !force) {
        snprintf(err, errlen, "%zu of the %d matching entries %s pinned; nothing "
                 "removed (--unpinned leaves them out, --force removes them "
                 "too, kwarm pins lists the sets)", pinned,
                 cJSON_GetArraySize(arr), pinned == 1 ? "is" : "are");
        return KW_EPINNED;
    }
    cJSON_ArrayForEach(e, arr) {
        const char *hex = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "digest"));
        uint8_t digest[KW_CACHE_DIGEST_LEN];
        size_t n = 0;
        if (hex == NULL || sodium_hex2bin(digest, sizeof digest, hex, strlen(hex),
                                          NULL, &n, NULL) != 0 || n != sizeof digest)
            continue;
        int rc = kw_cache_remove(c, digest);
        if (rc < 0 && rc != KW_ENOTFOUND) {
            snprintf(err, errlen, "%.16s: %s: %s", hex, kw_strerror(rc),
                     kw_cache_last_error(c));
            return rc;
        }
    }
    cJSON_AddItemReferenceToObject(doc, "removed", arr);
    return 0;
}

int kw_warm_digest(kw_cache *c, const char *hex,
                   uint8_t out[KW_KEYS_DIGEST_LEN], char *err, size_t errlen)
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
        snprintf(err, errlen, "digest %.64s: ambiguous prefix, it starts: %s",
                 hex, cand);
    else if (rc == KW_ENOTFOUND)
        snprintf(err, errlen, "digest %.64s: no cached digest starts so", hex);
    else if (rc < 0)
        snprintf(err, errlen, "digest %.64s: must be 64 hex digits, or a "
                 "prefix of 8 or more", hex);
    return rc;
}

int kw_warm_remove(kw_cache *c, const uint8_t digest[KW_KEYS_DIGEST_LEN],
                   char *err, size_t errlen)
{
    int rc = kw_cache_remove(c, digest);
    if (rc < 0 && rc != KW_ENOTFOUND)
        snprintf(err, errlen, "%s", kw_cache_last_error(c));
    return rc;
}
