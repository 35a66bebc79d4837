/* audit.c: the miss audit (kw__audit_, issue 13): every get that missed
 * the local cache, kept so `kwarm misses` can say why.
 *
 * A record is added on whichever thread learns the get's outcome (the
 * loop for a get that may not compile, a warm thread for one that did):
 * into a ring of the last KW__AUDIT_MAX records under a mutex, O(1), no
 * I/O.  The flush work (off the loop, with the cache's flush) appends the
 * new ones to <cache>/misses.jsonl, one JSON object a line, and rewrites
 * the file with the ring alone once it has grown to twice the ring; kwarmd
 * reads the file back at start, so the audit outlives restarts.  A
 * read-only cache keeps the audit in memory only.
 */
#include "internal.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "kw_alloc.h"
#include "kw_err.h"
#include "kw_jit.h"
#include "kw_launch.h"
#include "log.h"

#define NOUTCOMES 6

const char *kw__audit_outcome_name(int outcome)
{
    static const char *const names[NOUTCOMES] = {
        "not compiled", "compiled", "failed", "remote_hit", "cancelled",
        "cached"};
    return outcome >= 0 && outcome < NOUTCOMES ? names[outcome] : "?";
}

const char *kw__audit_kind_name(int kind)
{
    return kind == 1 ? "runtime" : kind == 2 ? "capture" : NULL;
}

int kw__audit_kind_from_name(const char *name)
{
    if (name && strcmp(name, "runtime") == 0)
        return 1;
    if (name && strcmp(name, "capture") == 0)
        return 2;
    return -1;
}

/* One record as a JSON object (the file's line and the reply's entry,
 * before the nearest key is added); NULL when out of memory. */
cJSON *kw__audit_json(const kw__miss *m)
{
    char hex[KW_KEYS_HEX_LEN];
    cJSON *o = cJSON_CreateObject();
    kw_keys_hex(m->key.digest, hex);
    bool ok = o != NULL &&
              cJSON_AddNumberToObject(o, "time", (double)m->t) != NULL &&
              cJSON_AddNumberToObject(o, "uid", (double)m->uid) != NULL &&
              cJSON_AddNumberToObject(o, "pid", (double)m->pid) != NULL &&
              cJSON_AddStringToObject(o, "digest", hex) != NULL &&
              cJSON_AddStringToObject(o, "outcome",
                                      kw__audit_outcome_name(m->outcome)) != NULL;
    if (ok && m->kind)
        ok = cJSON_AddStringToObject(o, "kind",
                                     kw__audit_kind_name(m->kind)) != NULL;
    if (ok && m->have_key) {
        kw_alloc_pause(); /* jit/'s tree: its failure paths leak */
        cJSON *k = kw_keys_key_json(&m->key);
        kw_alloc_resume();
        ok = k != NULL && cJSON_AddItemToObject(o, "key", k);
    }
    if (!ok) {
        cJSON_Delete(o);
        return NULL;
    }
    return o;
}

/* Reads one line of the file back; false when it is not a record. */
static bool from_json(const cJSON *o, kw__miss *m)
{
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(o, "time");
    const cJSON *dg = cJSON_GetObjectItemCaseSensitive(o, "digest");
    const cJSON *k = cJSON_GetObjectItemCaseSensitive(o, "key");
    const char *oc = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "outcome"));
    memset(m, 0, sizeof *m);
    if (!cJSON_IsNumber(t) || !cJSON_IsString(dg) || strlen(dg->valuestring) != 64)
        return false;
    m->t = (uint64_t)t->valuedouble;
    m->uid = (uid_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "uid"));
    m->pid = (pid_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(o, "pid"));
    for (int i = 0; i < NOUTCOMES && oc != NULL; i++)
        if (strcmp(oc, kw__audit_outcome_name(i)) == 0)
            m->outcome = i;
    int kind = kw__audit_kind_from_name(
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(o, "kind")));
    m->kind = kind > 0 ? kind : 0;
    for (int i = 0; i < KW_KEYS_DIGEST_LEN; i++)
        sscanf(dg->valuestring + 2 * i, "%2hhx", &m->key.digest[i]);
    char err[160];
    m->have_key = cJSON_IsObject(k) && kw__key_from_json(k, &m->key, err,
                                                          sizeof err) == 0;
    return true;
}

void kw__audit_add(kw__audit *a, const kw__miss *m)
{
    pthread_mutex_lock(&a->mu);
    a->ring[a->next] = *m;
    a->next = (a->next + 1) % KW__AUDIT_MAX;
    if (a->n < KW__AUDIT_MAX)
        a->n++;
    a->added++;
    pthread_mutex_unlock(&a->mu);
}

size_t kw__audit_snapshot(kw__audit *a, uint64_t since, kw__miss **out)
{
    pthread_mutex_lock(&a->mu);
    kw__miss *v = kw_malloc((a->n ? a->n : 1) * sizeof *v);
    size_t k = 0;
    for (size_t i = 0; v != NULL && i < a->n; i++) {
        const kw__miss *m = &a->ring[(a->next + KW__AUDIT_MAX - a->n + i) %
                                     KW__AUDIT_MAX];
        if (m->t >= since)
            v[k++] = *m;
    }
    pthread_mutex_unlock(&a->mu);
    *out = v;
    return v ? k : 0;
}

/* Writes count records of v to the file (appended, or the whole file
 * rewritten through a temporary one); true when they are on disk. */
static bool write_records(kw__audit *a, const kw__miss *v, size_t count,
                          bool rewrite)
{
    char tmp[sizeof a->path + 8];
    snprintf(tmp, sizeof tmp, "%s.new", a->path);
    FILE *f = fopen(rewrite ? tmp : a->path, rewrite ? "w" : "a");
    bool ok = f != NULL;
    for (size_t i = 0; ok && i < count; i++) {
        cJSON *o = kw__audit_json(&v[i]);
        char *line = o ? cJSON_PrintUnformatted(o) : NULL;
        ok = line != NULL && fprintf(f, "%s\n", line) > 0;
        free(line);
        cJSON_Delete(o);
    }
    ok = f != NULL && fclose(f) == 0 && ok;
    if (ok && rewrite)
        ok = rename(tmp, a->path) == 0;
    return ok;
}

/* Writes the records added since the last write to the file; rewrites it
 * from the ring when it has grown past twice the ring.  Flush work only;
 * flushes never overlap (flush_mu), and the records count as written
 * only once they are (a failed write is tried again by the next flush). */
void kw__audit_flush(kw__audit *a)
{
    if (a->path[0] == '\0')
        return;
    pthread_mutex_lock(&a->flush_mu);
    pthread_mutex_lock(&a->mu);
    uint64_t upto = a->added, fresh = a->added - a->written;
    if (fresh > a->n)
        fresh = a->n;
    bool rewrite = a->lines + fresh > 2 * KW__AUDIT_MAX;
    size_t count = rewrite ? a->n : (size_t)fresh;
    kw__miss *v = count ? kw_malloc(count * sizeof *v) : NULL;
    for (size_t i = 0; v != NULL && i < count; i++)
        v[i] = a->ring[(a->next + KW__AUDIT_MAX - count + i) % KW__AUDIT_MAX];
    pthread_mutex_unlock(&a->mu);
    bool ok = count == 0 || (v != NULL && write_records(a, v, count, rewrite));
    if (!ok)
        KW_LOG(KW_LOG_WARNING, "miss audit: cannot write %s%s", a->path,
               v == NULL ? " (out of memory)" : "");
    if (ok && count > 0) {
        pthread_mutex_lock(&a->mu);
        a->written = upto;
        pthread_mutex_unlock(&a->mu);
        a->lines = rewrite ? count : a->lines + count;
    }
    free(v);
    pthread_mutex_unlock(&a->flush_mu);
}

/* Reads the records the file holds (the last KW__AUDIT_MAX are kept). */
static void load(kw__audit *a)
{
    FILE *f = fopen(a->path, "r");
    char line[4096];
    while (f != NULL && fgets(line, sizeof line, f) != NULL) {
        cJSON *o = cJSON_Parse(line);
        kw__miss m;
        if (o != NULL && from_json(o, &m))
            kw__audit_add(a, &m);
        cJSON_Delete(o);
        a->lines++;
    }
    if (f != NULL)
        fclose(f);
    a->written = a->added;
}

int kw__audit_open(kw__audit *a, const char *cache_dir, bool read_only)
{
    memset(a, 0, sizeof *a);
    if ((a->ring = kw_calloc(KW__AUDIT_MAX, sizeof *a->ring)) == NULL)
        return KW_ENOMEM;
    pthread_mutex_init(&a->mu, NULL);
    pthread_mutex_init(&a->flush_mu, NULL);
    if (!read_only &&
        snprintf(a->path, sizeof a->path, "%s/misses.jsonl", cache_dir) <
            (int)sizeof a->path)
        load(a);
    else
        a->path[0] = '\0';
    return 0;
}

void kw__audit_close(kw__audit *a)
{
    if (a->ring == NULL)
        return;
    kw__audit_flush(a);
    pthread_mutex_destroy(&a->mu);
    pthread_mutex_destroy(&a->flush_mu);
    free(a->ring);
    a->ring = NULL;
}

uint64_t kw__audit_now(void)
{
    return (uint64_t)time(NULL);
}

/* ---- a key as JSON: a get's, and each record's in the file ------------ */

int kw__key_from_json(const cJSON *h, kw_keys_key *k, char *err, size_t errlen)
{
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(h, "family");
    const cJSON *fields = cJSON_GetObjectItemCaseSensitive(h, "fields");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(h, "arch");
    if (!cJSON_IsString(fam) || !cJSON_IsObject(fields) || !cJSON_IsString(arch) ||
        kw_keys_family_from_name(fam->valuestring, &k->family) < 0 ||
        snprintf(k->arch, sizeof k->arch, "%s", arch->valuestring) >= (int)sizeof k->arch) {
        snprintf(err, errlen, "get: needs \"digest\", or a known \"family\", "
                 "\"fields\" and \"arch\"");
        return KW_EINVAL;
    }
    for (size_t i = 0; i < kw_keys_nfields(k->family); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(fields,
                                                          kw_keys_field_name(k->family, i));
        /* Integers only, within int32 like every key field: a fraction
         * must not truncate into another key's value. */
        bool num = cJSON_IsNumber(v) && v->valuedouble == floor(v->valuedouble) &&
                   fabs(v->valuedouble) <= 2147483647.0;
        if (!num && !cJSON_IsBool(v)) {
            snprintf(err, errlen, "get: /fields/%s: missing or not an integer",
                     kw_keys_field_name(k->family, i));
            return KW_EINVAL;
        }
        k->fields[i] = cJSON_IsBool(v) ? cJSON_IsTrue(v) : (int64_t)v->valuedouble;
    }
    /* Refused here, before any compile is tried or counted as failed. */
    if (!kw_jit_arch_valid(k->arch)) {
        snprintf(err, errlen, "get: /arch: %s is not an architecture the "
                 "linked NVRTC builds", k->arch);
        return KW_EINVAL;
    }
    if (kw_launch_fields_check((int)k->family, k->fields) != 0) {
        snprintf(err, errlen, "get: /fields: no %s kernel takes these values "
                 "(kwarm get --fields names the one at fault)",
                 fam->valuestring);
        return KW_EINVAL;
    }
    return kw_keys_digest(k, k->digest);
}
