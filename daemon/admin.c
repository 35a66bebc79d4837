/* admin.c: ls, pins, unpin, resize and evict by criteria, on a job
 * thread (issue 12): the documents of warm/kw_warm.h's admin functions,
 * the same `kwarm ls --cache ... --json` prints.  ls streams its entries
 * (PROGRESS {"entries": [...]}, up to KW__STREAM_KEYS a frame) and ends
 * with {"count", "bytes"}; evict by criteria streams the removed entries
 * the same way.  A read-only cache answers the writes with KW_EROFS.
 */
#include "handlers.h"

#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "log.h"

/* Sends doc's array `member` in PROGRESS frames {"entries": [...]} and
 * takes it out of doc; 0 or KW_ENOMEM. */
static int stream_entries(kw__req *r, cJSON *doc, const char *member)
{
    cJSON *arr = cJSON_DetachItemFromObjectCaseSensitive(doc, member);
    int rc = 0;
    while (rc == 0 && arr != NULL && arr->child != NULL) {
        cJSON *h = cJSON_CreateObject(), *out = cJSON_AddArrayToObject(h, "entries");
        if (out == NULL)
            rc = KW_ENOMEM;
        for (size_t n = 0; out != NULL && n < KW__STREAM_KEYS && arr->child; n++)
            cJSON_AddItemToArray(out, cJSON_DetachItemViaPointer(arr, arr->child));
        if (rc == 0)
            rc = kw__req_progress(r, h); /* parks while the client is slow */
        cJSON_Delete(h);
    }
    cJSON_Delete(arr);
    return rc;
}

/* Reads the criteria of ls or evict's "match" into f (digest into buf);
 * 0, or a code with the message in err. */
static int read_filter(kw__daemon *d, const cJSON *m, kw_warm_filter *f,
                       uint8_t *buf, char *err, size_t errlen)
{
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(m, "family");
    const cJSON *pin = cJSON_GetObjectItemCaseSensitive(m, "pinned");
    const cJSON *dg = cJSON_GetObjectItemCaseSensitive(m, "digest");
    const cJSON *before = cJSON_GetObjectItemCaseSensitive(m, "before");
    kw_k_family k;
    memset(f, 0, sizeof *f);
    if ((fam && (!cJSON_IsString(fam) ||
                 kw_keys_family_from_name(fam->valuestring, &k) < 0)) ||
        (pin && !cJSON_IsString(pin)) || (dg && !cJSON_IsString(dg)) ||
        (before && (!cJSON_IsNumber(before) || before->valuedouble < 0))) {
        snprintf(err, errlen, "\"family\" must name a kernel family, "
                 "\"pinned\" and \"digest\" be strings, \"before\" seconds");
        return KW_EINVAL;
    }
    f->family = fam ? fam->valuestring : NULL;
    f->pin_name = pin ? pin->valuestring : NULL;
    f->unpinned = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(m, "unpinned"));
    f->before = before ? (uint64_t)before->valuedouble : 0;
    if (dg == NULL)
        return 0;
    f->digest = buf;
    return kw_warm_digest(d->cache, dg->valuestring, buf, err, errlen);
}

/* An ls between its runs: its filter, where the listing is, the totals. */
typedef struct ls_state {
    kw_warm_filter f;
    uint8_t digest[KW_CACHE_DIGEST_LEN]; /* f.digest's bytes */
    uint8_t from[KW_CACHE_DIGEST_LEN];   /* where the next page starts */
    uint64_t count, bytes;
    bool more;
} ls_state;

/* Sends one page (KW__STREAM_KEYS entries) of st's listing; 0, 1 when
 * the stream's budget is full (the caller yields), or a negative code. */
static int ls_page(kw__req *r, ls_state *st)
{
    cJSON *arr = NULL, *h = NULL;
    uint64_t b = 0;
    int rc = kw_warm_ls_page(r->d->cache, &st->f, st->from, KW__STREAM_KEYS,
                             &arr, &b, &st->more);
    if (rc < 0)
        return rc;
    st->count += (uint64_t)cJSON_GetArraySize(arr);
    st->bytes += b;
    if (arr->child == NULL) {
        cJSON_Delete(arr);
        return 0;
    }
    if ((h = cJSON_CreateObject()) == NULL ||
        !cJSON_AddItemToObject(h, "entries", arr)) {
        cJSON_Delete(h);
        cJSON_Delete(arr);
        return KW_ENOMEM;
    }
    rc = kw__req_progress_yield(r, h);
    cJSON_Delete(h);
    return rc;
}

/* ls streams the entries a page at a time, each page read when the
 * stream has room: memory follows the stream's budget, not the cache's
 * size, and no job thread waits for a slow reader (it yields). */
bool kw__run_ls(kw__req *r)
{
    ls_state *st = r->state;
    char err[1200];
    int rc = 0;
    if (st == NULL) {
        if ((st = kw_calloc(1, sizeof *st)) == NULL) {
            kw__req_error(r, KW_ENOMEM, NULL);
            return false;
        }
        r->state = st;
        r->state_free = free;
        st->more = true;
        rc = read_filter(r->d, r->header, &st->f, st->digest, err, sizeof err);
        if (rc < 0) {
            kw__req_error(r, rc, err);
            return false;
        }
    }
    while (rc == 0 && st->more)
        rc = ls_page(r, st);
    if (rc == 1)
        return true; /* yielded */
    cJSON *res = rc == 0 ? cJSON_CreateObject() : NULL;
    if (res != NULL && (!cJSON_AddNumberToObject(res, "count", (double)st->count) ||
                        !cJSON_AddNumberToObject(res, "bytes", (double)st->bytes))) {
        cJSON_Delete(res);
        res = NULL;
    }
    if (rc < 0)
        kw__req_error(r, rc, NULL);
    else
        kw__req_finish(r, KW_PROTO_RESULT, res); /* NULL: out of memory */
    cJSON_Delete(res);
    return false;
}

/* evict {"match": {...}, "force"?}: the entries that match, removed. */
void kw__run_evict_match(kw__req *r, const cJSON *match)
{
    kw_warm_filter f;
    uint8_t digest[KW_CACHE_DIGEST_LEN];
    char err[1200];
    cJSON *doc = NULL;
    bool force = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(r->header, "force"));
    int rc = read_filter(r->d, match, &f, digest, err, sizeof err);
    if (rc == 0 && f.family == NULL && f.digest == NULL && !f.unpinned &&
        f.before == 0) {
        snprintf(err, sizeof err, "evict: \"match\" needs digest, family, "
                 "unpinned or before");
        rc = KW_EINVAL;
    }
    if (rc == 0 && (rc = kw_warm_ls(r->d->cache, &f, &doc)) < 0)
        snprintf(err, sizeof err, "%s", kw_strerror(rc));
    if (rc == 0 && (rc = kw_warm_evict(r->d->cache, doc, force, err, sizeof err)) == 0) {
        cJSON_DeleteItemFromObjectCaseSensitive(doc, "removed"); /* a reference */
        rc = stream_entries(r, doc, "entries");
    }
    if (rc < 0)
        kw__req_error(r, rc, err[0] ? err : NULL);
    else
        kw__req_finish(r, KW_PROTO_RESULT, doc);
    cJSON_Delete(doc);
}

void kw__run_pins(kw__req *r)
{
    cJSON *doc = NULL;
    int rc = kw_warm_pins(r->d->cache, &doc);
    if (rc < 0)
        kw__req_error(r, rc, NULL);
    else
        kw__req_finish(r, KW_PROTO_RESULT, doc);
    cJSON_Delete(doc);
}

void kw__run_unpin(kw__req *r)
{
    const char *name = cJSON_GetStringValue(
        cJSON_GetObjectItemCaseSensitive(r->header, "name"));
    char err[160];
    cJSON *doc = NULL;
    int rc = name ? kw_warm_unpin(r->d->cache, name, &doc) : KW_EINVAL;
    if (rc == KW_ENOTFOUND || (rc == KW_EINVAL && name != NULL))
        snprintf(err, sizeof err, "%.80s: no such pin set (kwarm pins lists them)",
                 name);
    else if (rc == KW_EINVAL)
        snprintf(err, sizeof err, "unpin: \"name\" must be a string");
    if (rc < 0)
        kw__req_error(r, rc, rc == KW_ENOTFOUND || rc == KW_EINVAL ? err : NULL);
    else
        kw__req_finish(r, KW_PROTO_RESULT, doc);
    cJSON_Delete(doc);
}

void kw__run_resize(kw__req *r)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(r->header, "max_size");
    cJSON *doc = NULL;
    int rc = cJSON_IsNumber(v) && v->valuedouble >= KW_CACHE_MIN_SIZE &&
                     v->valuedouble <= (double)KW_CACHE_MAX_SIZE
                 ? kw_warm_resize(r->d->cache, (uint64_t)v->valuedouble, &doc)
                 : KW_EINVAL;
    if (rc == KW_EINVAL)
        kw__req_error(r, rc, "resize: \"max_size\" must be bytes in [1M, 16T]");
    else if (rc < 0)
        kw__req_error(r, rc, kw_cache_last_error(r->d->cache)); /* the
            reason kw_warm_resize left there: its signature, shared with
            cli/, has no err */
    else
        kw__req_finish(r, KW_PROTO_RESULT, doc);
    cJSON_Delete(doc);
}
