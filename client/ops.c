/* ops.c: a deployment's loaded kernels as operations: the table of keys,
 * dispatch and launch, runtime misses (kw_ops.h).  Loading is in
 * ops_load.c. */
#include "kw_ops.h"

#include "internal.h"
#include "kw_err.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the table: (family, fields) -> kernel, open addressing ---------- */

static uint64_t key_hash(int fam, const int64_t *fields)
{
    uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)fam;
    for (size_t i = 0; i < kw_launch_nfields(fam); i++) {
        h ^= (uint64_t)fields[i] + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
        h *= 0xff51afd7ed558ccdull;
    }
    return h ^ (h >> 33);
}

static bool key_eq(const kw__ops_entry *e, int fam, const int64_t *fields)
{
    return e->fam == fam &&
           memcmp(e->fields, fields, kw_launch_nfields(fam) * 8) == 0;
}

kw__ops_entry *kw__ops_find_locked(kw_ops *o, int fam, const int64_t *fields)
{
    if (!o->cap)
        return NULL;
    size_t mask = o->cap - 1;
    for (size_t i = key_hash(fam, fields) & mask;; i = (i + 1) & mask) {
        kw__ops_entry *e = &o->table[i];
        if (e->fam < 0)
            return NULL;
        if (key_eq(e, fam, fields))
            return e;
    }
}

/* Places e in a table of cap slots known to have room. */
static void place(kw__ops_entry *table, size_t cap, const kw__ops_entry *e)
{
    size_t mask = cap - 1;
    size_t i = key_hash(e->fam, e->fields) & mask;
    while (table[i].fam >= 0)
        i = (i + 1) & mask;
    table[i] = *e;
}

int kw__ops_insert_locked(kw_ops *o, const kw__ops_entry *e)
{
    if ((o->count + 1) * 2 > o->cap) { /* keep the load under 1/2 */
        size_t cap = o->cap ? o->cap * 2 : 64;
        kw__ops_entry *t = malloc(cap * sizeof(*t));
        if (!t)
            return KW_ENOMEM;
        for (size_t i = 0; i < cap; i++)
            t[i].fam = -1;
        for (size_t i = 0; i < o->cap; i++)
            if (o->table[i].fam >= 0)
                place(t, cap, &o->table[i]);
        free(o->table);
        o->table = t;
        o->cap = cap;
    }
    place(o->table, o->cap, e);
    o->count++;
    return 0;
}

/* ---- errors ----------------------------------------------------------- */

static int set_err(kw_ops *o, int rc, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static int set_err(kw_ops *o, int rc, const char *fmt, ...)
{
    va_list ap;
    va_start(ap, fmt);
    pthread_mutex_lock(&o->lock);
    vsnprintf(o->err, sizeof(o->err), fmt, ap);
    pthread_mutex_unlock(&o->lock);
    va_end(ap);
    return rc;
}

const char *kw_ops_last_error(const kw_ops *o)
{
    return o ? o->err : "";
}

void kw_ops_last_error_copy(kw_ops *o, char *buf, size_t cap)
{
    if (!buf || !cap)
        return;
    if (!o) {
        buf[0] = '\0';
        return;
    }
    pthread_mutex_lock(&o->lock);
    snprintf(buf, cap, "%s", o->err);
    pthread_mutex_unlock(&o->lock);
}

int kw__ops_fields_json(int fam, const int64_t *fields, char *buf,
                        size_t cap)
{
    size_t len = 0;
    for (size_t i = 0; i < kw_launch_nfields(fam); i++) {
        bool b = kw_launch_field_kind(fam, i) == KW_LAUNCH_F_BOOL;
        char v[24];
        snprintf(v, sizeof(v), "%lld", (long long)fields[i]);
        int n = snprintf(buf + len, cap - len, "%s\"%s\": %s", i ? ", " : "{",
                         kw_launch_field_name(fam, i),
                         b ? (fields[i] ? "true" : "false") : v);
        if (n < 0 || (size_t)n >= cap - len)
            return KW_ENOSPC;
        len += (size_t)n;
    }
    int n = snprintf(buf + len, cap - len, "}");
    return n < 0 || (size_t)n >= cap - len ? KW_ENOSPC : 0;
}

/* Names, in hint (cap bytes), how the loaded key of fam nearest to fields
 * (the fewest differing fields) differs, and the settings that choose
 * those fields.  Caller holds o->lock. */
static void nearest_hint_locked(kw_ops *o, int fam, const int64_t *fields,
                                char *hint, size_t cap)
{
    const kw__ops_entry *best = NULL;
    size_t best_n = SIZE_MAX, nf = kw_launch_nfields(fam);
    for (size_t i = 0; i < o->cap; i++) {
        const kw__ops_entry *e = &o->table[i];
        size_t n = 0;
        for (size_t j = 0; e->fam == fam && j < nf; j++)
            n += e->fields[j] != fields[j];
        if (e->fam == fam && n < best_n) {
            best = e;
            best_n = n;
        }
    }
    if (!best) {
        snprintf(hint, cap, "no key of %s is loaded: the deployment warms "
                 "none (check the model's settings)", kw_launch_family_name(fam));
        return;
    }
    size_t len = (size_t)snprintf(hint, cap, "the nearest loaded key differs in");
    for (size_t j = 0; j < nf && len < cap; j++) {
        if (best->fields[j] == fields[j])
            continue;
        const char *s = kw_launch_field_setting(fam, j);
        len += (size_t)snprintf(hint + len, cap - len,
                                " %s (wanted %lld, loaded %lld%s%s%s)",
                                kw_launch_field_name(fam, j),
                                (long long)fields[j],
                                (long long)best->fields[j],
                                *s ? "; the deployment setting " : "", s,
                                *s ? " chooses it" : "");
    }
}

/* ---- dispatch and launch --------------------------------------------- */

static int capturing(kw_ops *o, uintptr_t cu_stream, bool *out)
{
    *out = false;
    if (o->cuda)
        return kw_cuda_stream_capturing(o->cuda, cu_stream, out);
    return o->device.capturing ? o->device.capturing(o->device.ctx, cu_stream, out)
                               : 0;
}

/* The key (fam, fields) is not loaded.  While the stream captures: refused,
 * nothing asked of kwarmd or loaded.  Otherwise fetched (kwarmd compiles
 * and audits it), loaded, counted and logged; *out gets the entry. */
static int miss(kw_ops *o, kw_launch_op op, int fam, const int64_t *fields,
                uintptr_t cu_stream, kw__ops_entry *out)
{
    char key[512], hint[512];
    if (kw__ops_fields_json(fam, fields, key, sizeof(key)) < 0)
        snprintf(key, sizeof(key), "(fields too long to show)");
    bool cap = false;
    int rc = capturing(o, cu_stream, &cap);
    if (rc < 0 || cap) {
        o->capture_misses++;
        pthread_mutex_lock(&o->miss_lock);
        kw__ops_report_capture(o, fam, fields);
        pthread_mutex_unlock(&o->miss_lock);
        pthread_mutex_lock(&o->lock);
        nearest_hint_locked(o, fam, fields, hint, sizeof(hint));
        pthread_mutex_unlock(&o->lock);
        return set_err(o, KW_ECAPTURE,
                       "%s: key %s %s %s is not loaded and the stream is "
                       "capturing a CUDA graph: nothing was loaded (kwarmd "
                       "was told, for its miss audit); warm it before "
                       "capture (%s)",
                       kw_launch_op_name(op), kw_launch_family_name(fam), key,
                       o->arch, hint);
    }
    pthread_mutex_lock(&o->miss_lock);
    pthread_mutex_lock(&o->lock);
    kw__ops_entry *e = kw__ops_find_locked(o, fam, fields);
    if (e)
        *out = *e; /* another thread fetched it meanwhile */
    pthread_mutex_unlock(&o->lock);
    if (e) {
        pthread_mutex_unlock(&o->miss_lock);
        return 0;
    }
    double t0 = kw__ops_now_ms();
    char err[768];
    rc = kw__ops_fetch(o, fam, fields, true, out, err, sizeof(err));
    if (rc == 0) {
        pthread_mutex_lock(&o->lock);
        nearest_hint_locked(o, fam, fields, hint, sizeof(hint));
        rc = kw__ops_insert_locked(o, out);
        pthread_mutex_unlock(&o->lock);
    }
    pthread_mutex_unlock(&o->miss_lock);
    if (rc < 0) {
        if (out->fn)
            kw_cuda_unload(out->fn);
        return set_err(o, rc, "%s: runtime miss of %s %s %s: %s",
                       kw_launch_op_name(op), kw_launch_family_name(fam), key,
                       o->arch, rc == KW_ENOMEM ? "out of memory" : err);
    }
    o->runtime_misses++;
    o->loaded++;
    if (o->log) {
        char line[1400];
        snprintf(line, sizeof(line),
                 "kwarm: runtime miss: %s key %s %s (digest %.16s) was not "
                 "loaded before serving; fetched from kwarmd and loaded in "
                 "%.1f ms (%s)",
                 kw_launch_family_name(fam), key, o->arch, out->digest,
                 kw__ops_now_ms() - t0, hint);
        o->log(o->log_ctx, line);
    }
    return 0;
}

/* Dispatches and checks call; fills fields and geo. */
static int prepare(kw_ops *o, kw_launch_op op, const kw_launch_call *call,
                   int64_t *fields, kw_launch_geo *geo)
{
    char err[512];
    int rc = kw_launch_dispatch(op, &o->deploy, call, fields, err,
                                sizeof(err));
    if (rc == 0)
        rc = kw_launch_check(op, &o->deploy, fields, call, err, sizeof(err));
    if (rc < 0)
        return set_err(o, rc, "%s", err);
    if (kw_launch_geometry(op, fields, call, o->sm_count, geo) < 0)
        return set_err(o, KW_EINVAL,
                       "%s: the call's grid exceeds the driver's limits",
                       kw_launch_op_name(op));
    return 0;
}

int kw_ops_run(kw_ops *o, kw_launch_op op, const kw_launch_call *call,
               uintptr_t cu_stream)
{
    if (!o || !call || kw_launch_op_family(op) < 0)
        return KW_EINVAL;
    int64_t fields[KW_LAUNCH_MAX_FIELDS];
    kw_launch_geo geo;
    int rc = prepare(o, op, call, fields, &geo);
    if (rc < 0 || geo.grid[0] == 0)
        return rc; /* an empty call launches nothing */
    int fam = kw_launch_op_family(op);
    kw__ops_entry ent;
    pthread_mutex_lock(&o->lock);
    kw__ops_entry *e = kw__ops_find_locked(o, fam, fields);
    if (e)
        ent = *e;
    pthread_mutex_unlock(&o->lock);
    if (!e && (rc = miss(o, op, fam, fields, cu_stream, &ent)) < 0)
        return rc;
    kw_launch_params p;
    kw_launch_params_build(op, fields, &o->deploy, call, &p);
    if (o->cuda)
        rc = kw_cuda_launch_on(ent.fn, geo.grid, geo.block, geo.shmem, p.args,
                               cu_stream);
    else
        rc = o->device.launch(o->device.ctx, fam, fields, &geo, p.args,
                              cu_stream);
    if (rc < 0) {
        char why[256] = "";
        if (o->cuda)
            kw_cuda_last_error_copy(o->cuda, why, sizeof(why));
        return set_err(o, rc, "%s: launch failed: %s", kw_launch_op_name(op),
                       why[0] ? why : kw_strerror(rc));
    }
    o->launches++;
    return 0;
}

int kw_ops_dispatch(kw_ops *o, kw_launch_op op, const kw_launch_call *call,
                    int64_t *fields, bool *loaded)
{
    if (!o || !call || !fields || kw_launch_op_family(op) < 0)
        return KW_EINVAL;
    char err[512];
    int rc = kw_launch_dispatch(op, &o->deploy, call, fields, err,
                                sizeof(err));
    if (rc < 0)
        return set_err(o, rc, "%s", err);
    if (loaded) {
        pthread_mutex_lock(&o->lock);
        *loaded = kw__ops_find_locked(o, kw_launch_op_family(op), fields);
        pthread_mutex_unlock(&o->lock);
    }
    return 0;
}

/* ---- accessors --------------------------------------------------------- */

const kw_launch_deploy *kw_ops_deploy(const kw_ops *o)
{
    return o ? &o->deploy : NULL;
}

const char *kw_ops_arch(const kw_ops *o)
{
    return o ? o->arch : "";
}

void kw_ops_stats_get(kw_ops *o, kw_ops_stats *out)
{
    if (!o || !out)
        return;
    out->loaded = o->loaded;
    out->runtime_misses = o->runtime_misses;
    out->capture_misses = o->capture_misses;
    out->launches = o->launches;
    out->load_ms = o->load_ms;
}

size_t kw_ops_each(kw_ops *o,
                   void (*fn)(void *ctx, int fam, const int64_t *fields,
                              const char *digest),
                   void *ctx)
{
    size_t n = 0;
    for (size_t i = 0; o && i < o->cap; i++) {
        const kw__ops_entry *e = &o->table[i];
        if (e->fam < 0)
            continue;
        if (fn)
            fn(ctx, e->fam, e->fields, e->digest);
        n++;
    }
    return n;
}

void kw_ops_free(kw_ops *o)
{
    if (!o)
        return;
    for (size_t i = 0; i < o->cap; i++)
        if (o->table[i].fam >= 0)
            kw_cuda_unload(o->table[i].fn);
    free(o->table);
    kw_client_close(o->client);
    pthread_mutex_destroy(&o->miss_lock);
    pthread_mutex_destroy(&o->lock);
    free(o);
}
