/* ops_load.c: kw_ops_load(): warm a deployment through kwarmd, read its
 * keys and settings, fetch and load every key of this process's arch
 * (kw_ops.h).  Also the fetch of one key, which runtime misses share. */
#include "kw_ops.h"

#include "internal.h"
#include "kw_err.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>


/* ---- fetching one key ------------------------------------------------- */

/* Loads k (fetched) into e for (fam, fields). */
static int load_kernel(kw_ops *o, kw_client_kernel *k, int fam,
                       const int64_t *fields, kw__ops_entry *e, char *err,
                       size_t errlen)
{
    memset(e, 0, sizeof(*e));
    e->fam = fam;
    memcpy(e->fields, fields, kw_launch_nfields(fam) * sizeof(*fields));
    e->cubin_len = k->len;
    snprintf(e->digest, sizeof(e->digest), "%s", k->digest);
    if (!o->cuda)
        return k->len > 0 ? 0 : kw_err_fmt(err, errlen, KW_EPROTO, "empty cubin");
    int rc = kw_cuda_load(o->cuda, k->cubin, k->len, k->entry, &e->fn);
    if (rc < 0) {
        char why[256];
        kw_cuda_last_error_copy(o->cuda, why, sizeof(why));
        return kw_err_fmt(err, errlen, rc, "loading %.16s: %s", k->digest, why);
    }
    return 0;
}

int kw__ops_fetch(kw_ops *o, int fam, const int64_t *fields, bool compile,
                  kw__ops_entry *e, char *err, size_t errlen)
{
    char json[512];
    if (kw__ops_fields_json(fam, fields, json, sizeof(json)) < 0)
        return kw_err_fmt(err, errlen, KW_ENOSPC, "key fields too long");
    kw_client_kernel k = {0};
    int rc = kw_client_get_key_as_miss(o->client, kw_launch_family_name(fam),
                                       json, o->arch, compile, "runtime", &k);
    if (rc < 0)
        return kw_err_fmt(err, errlen, rc, "kwarmd: %s",
                    kw_client_last_error(o->client));
    rc = load_kernel(o, &k, fam, fields, e, err, errlen);
    kw_client_kernel_destroy(&k);
    return rc;
}

void kw__ops_report_capture(kw_ops *o, int fam, const int64_t *fields)
{
    char json[512];
    if (kw__ops_fields_json(fam, fields, json, sizeof(json)) < 0)
        return;
    kw_client_kernel k = {0};
    /* The capture fails anyway; a kwarmd that is slow or gone must not
     * hold the capturing thread for the load's timeout. */
    kw_client_set_timeout(o->client, 2000);
    (void)kw_client_get_key_as_miss(o->client, kw_launch_family_name(fam),
                                    json, o->arch, false, "capture", &k);
    kw_client_set_timeout(o->client, o->timeout_ms);
    kw_client_kernel_destroy(&k); /* nothing is loaded while capturing */
}

/* ---- the deployment sent to kwarmd ------------------------------------ */

/* Whether the comma-separated list has arch as one of its items. */
static bool list_has(const char *list, const char *arch)
{
    size_t n = strlen(arch);
    for (const char *p = list; p && *p;) {
        const char *end = strchr(p, ',');
        size_t len = end ? (size_t)(end - p) : strlen(p);
        if (len == n && strncmp(p, arch, n) == 0)
            return true;
        p = end ? end + 1 : NULL;
    }
    return false;
}

/* The deployment as kwarmd gets it: the caller's, with this process's
 * arch added when it names none.  Refuses a deployment of several ranks
 * that does not name one, and an arch list without this device's. */
static int deployment_text(const kw_ops_opts *opts, const char *arch,
                           char **out, char *err, size_t errlen)
{
    const char *src = opts->deployment_json ? opts->deployment_json : "{}";
    cJSON *d = cJSON_Parse(src);
    if (!cJSON_IsObject(d)) {
        cJSON_Delete(d);
        return kw_err_fmt(err, errlen, KW_EJSON,
                    "deployment: not a JSON object");
    }
    int rc = 0;
    const cJSON *w = cJSON_GetObjectItemCaseSensitive(d, "dcp_world");
    const cJSON *r = cJSON_GetObjectItemCaseSensitive(d, "dcp_rank");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(d, "arch");
    if (cJSON_IsNumber(w) && w->valuedouble > 1 && !cJSON_IsNumber(r))
        rc = kw_err_fmt(err, errlen, KW_EINVAL,
                  "deployment dcp_rank: a serving process is one rank of "
                  "dcp_world %g: set dcp_rank to one of 0..%g",
                  w->valuedouble, w->valuedouble - 1);
    else if (a && !cJSON_IsString(a))
        rc = kw_err_fmt(err, errlen, KW_EINVAL,
                  "deployment arch: must be a string such as \"sm_90\"");
    else if (a && !list_has(a->valuestring, arch))
        rc = kw_err_fmt(err, errlen, KW_EINVAL,
                  "deployment arch: \"%s\" does not list this device's %s",
                  a->valuestring, arch);
    else if (!a && !cJSON_AddStringToObject(d, "arch", arch))
        rc = KW_ENOMEM;
    if (rc == 0 && !(*out = cJSON_PrintUnformatted(d)))
        rc = KW_ENOMEM;
    cJSON_Delete(d);
    return rc;
}

/* ---- the keys document -> kw_launch_deploy ---------------------------- */

static int64_t num(const cJSON *obj, const char *name, int64_t dflt)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNumber(v) ? (int64_t)v->valuedouble : dflt;
}

/* Appends r to list (n entries, deduplicated in order). */
static int add_ratio(int64_t *list, size_t *n, int64_t r)
{
    for (size_t i = 0; i < *n; i++)
        if (list[i] == r)
            return 0;
    if (*n == KW_LAUNCH_MAX_RATIOS)
        return KW_E2BIG;
    list[(*n)++] = r;
    return 0;
}

/* ratios_p and ratios_s of spec/warmup-keys.md §4. */
static int fill_ratios(kw_launch_deploy *d, const cJSON *settings)
{
    const cJSON *cr =
        cJSON_GetObjectItemCaseSensitive(settings, "compress_ratios");
    int64_t kpool = num(settings, "index_kpool", 0), rc = 0;
    const cJSON *r;
    cJSON_ArrayForEach(r, cr) {
        int64_t v = (int64_t)r->valuedouble;
        rc |= add_ratio(d->ratios_p, &d->nratios_p, v > 1 ? v : 1);
        if (v > 1)
            rc |= add_ratio(d->ratios_s, &d->nratios_s, v);
    }
    if (cJSON_GetArraySize(cr) == 0)
        rc |= add_ratio(d->ratios_p, &d->nratios_p, 1);
    rc |= add_ratio(d->ratios_p, &d->nratios_p, kpool > 0 ? kpool : 1);
    if (kpool > 1)
        rc |= add_ratio(d->ratios_s, &d->nratios_s, kpool);
    return rc ? KW_E2BIG : 0;
}

static int fill_deploy(kw_launch_deploy *d, const cJSON *doc, char *err,
                       size_t errlen)
{
    const cJSON *s = cJSON_GetObjectItemCaseSensitive(doc, "settings");
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(doc, "deployment");
    if (!cJSON_IsObject(s) || !cJSON_IsObject(p))
        return kw_err_fmt(err, errlen, KW_EPROTO,
                    "kwarmd's keys document has no settings or deployment");
    memset(d, 0, sizeof(*d));
    d->index_topk = num(s, "index_topk", 0);
    d->index_n_heads = num(s, "index_n_heads", 0);
    d->index_head_dim = num(s, "index_head_dim", 0);
    d->dcp_world = num(p, "dcp_world", 0);
    d->dcp_rank = num(p, "dcp_rank", d->dcp_world == 1 ? 0 : -1);
    d->dcp_interleave = num(p, "dcp_interleave", 0);
    d->pcp = num(p, "pcp", 0);
    d->max_num_batched_tokens = num(p, "max_num_batched_tokens", 0);
    d->max_num_seqs = num(p, "max_num_seqs", 0);
    d->block_size = num(p, "block_size", 0);
    d->block_stride_rows = num(p, "block_stride_rows", 0);
    d->max_model_len = num(p, "max_model_len", 0);
    d->num_speculative_tokens = num(p, "num_speculative_tokens", 0);
    if (fill_ratios(d, s) < 0)
        return kw_err_fmt(err, errlen, KW_E2BIG,
                    "model: more than %d distinct compress ratios",
                    KW_LAUNCH_MAX_RATIOS);
    return kw_launch_deploy_check(d, err, errlen);
}

int kw_ops_deploy_from_keys(const char *keys_json, kw_launch_deploy *d,
                            char *err, size_t errlen)
{
    if (!keys_json || !d)
        return kw_err_fmt(err, errlen, KW_EINVAL, "NULL argument");
    cJSON *doc = cJSON_Parse(keys_json);
    if (!doc)
        return kw_err_fmt(err, errlen, KW_EPROTO, "keys document: not JSON");
    int rc = fill_deploy(d, doc, err, errlen);
    cJSON_Delete(doc);
    return rc;
}

/* ---- loading every key ------------------------------------------------ */

/* The fields of one key of the document ({"family", "fields", ...}). */
static int key_fields(const cJSON *key, int *fam, int64_t *fields)
{
    const cJSON *fj = cJSON_GetObjectItemCaseSensitive(key, "fields");
    *fam = kw_launch_family_from_name(
        cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(key, "family")));
    if (*fam < 0 || !cJSON_IsObject(fj))
        return KW_EPROTO;
    for (size_t i = 0; i < kw_launch_nfields(*fam); i++) {
        const cJSON *v = cJSON_GetObjectItemCaseSensitive(
            fj, kw_launch_field_name(*fam, i));
        if (cJSON_IsBool(v))
            fields[i] = cJSON_IsTrue(v);
        else if (cJSON_IsNumber(v))
            fields[i] = (int64_t)v->valuedouble;
        else
            return KW_EPROTO;
    }
    return 0;
}

/* Fetches and loads every key of doc for o's arch not loaded yet.  A key
 * kwarmd does not hold (KW_ENOTFOUND) is left out and counted in
 * *missing, its name kept in err; any other failure fails the load.  o
 * is not shared yet: the table is walked without its lock. */
static int load_keys(kw_ops *o, const cJSON *doc, size_t *missing,
                     char *err, size_t errlen)
{
    const cJSON *key;
    *missing = 0;
    cJSON_ArrayForEach(key, cJSON_GetObjectItemCaseSensitive(doc, "keys")) {
        const char *arch = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(key, "arch"));
        const char *digest = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(key, "digest"));
        int fam;
        int64_t fields[KW_LAUNCH_MAX_FIELDS] = {0};
        if (!arch || !digest || key_fields(key, &fam, fields) < 0)
            return kw_err_fmt(err, errlen, KW_EPROTO,
                        "kwarmd's keys document has a malformed key");
        if (strcmp(arch, o->arch) != 0 ||
            kw__ops_find_locked(o, fam, fields))
            continue;
        kw_client_kernel k = {0};
        int rc = kw_client_get(o->client, digest, false, &k);
        if (rc == KW_ENOTFOUND) {
            if ((*missing)++ == 0)
                kw_err_fmt(err, errlen, rc, "%s %.16s is not in kwarmd's cache",
                     kw_launch_family_name(fam), digest);
            continue;
        }
        if (rc < 0)
            return kw_err_fmt(err, errlen, rc, "fetching %s %.16s: %s",
                        kw_launch_family_name(fam), digest,
                        kw_client_last_error(o->client));
        kw__ops_entry e;
        rc = load_kernel(o, &k, fam, fields, &e, err, errlen);
        kw_client_kernel_destroy(&k);
        if (rc == 0 && (rc = kw__ops_insert_locked(o, &e)) < 0)
            kw_cuda_unload(e.fn);
        if (rc < 0)
            return rc;
        o->loaded++;
    }
    return 0;
}

/* The first failed key of a warmup result, as one line. */
static int warmup_failed(const char *result, char *err, size_t errlen)
{
    cJSON *r = cJSON_Parse(result);
    int64_t failed = num(r, "failed", 0), cancelled = num(r, "cancelled", 0);
    int rc = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(r, "manifest")) {
        const char *st = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(m, "status"));
        if (st && (strcmp(st, "failed") == 0 || strcmp(st, "cancelled") == 0)) {
            rc = kw_err_fmt(err, errlen, KW_ENVRTC,
                      "warmup: %lld keys failed, %lld cancelled; first: %s "
                      "%.16s: %s",
                      (long long)failed, (long long)cancelled,
                      cJSON_GetStringValue(
                          cJSON_GetObjectItemCaseSensitive(m, "family")),
                      cJSON_GetStringValue(
                          cJSON_GetObjectItemCaseSensitive(m, "digest")),
                      st[0] == 'c' ? "cancelled (kwarmd stopping)"
                                   : cJSON_GetStringValue(
                                         cJSON_GetObjectItemCaseSensitive(
                                             m, "error")));
            break;
        }
    }
    if (rc == 0 && (failed || cancelled))
        rc = kw_err_fmt(err, errlen, KW_ENVRTC, "warmup: %lld keys failed",
                  (long long)(failed + cancelled));
    cJSON_Delete(r);
    return rc;
}

/* Warms the deployment through kwarmd: every key not cached compiles. */
static int warm(kw_ops *o, const kw_ops_opts *opts, const char *dep,
                char *err, size_t errlen)
{
    char *text = NULL;
    int rc = kw_client_warmup(o->client, opts->config_json, dep, opts->name,
                              NULL, NULL, &text);
    if (rc < 0)
        return kw_err_fmt(err, errlen, rc, "warmup: %s",
                    kw_client_last_error(o->client));
    rc = warmup_failed(text, err, errlen);
    free(text);
    return rc;
}

/* Keys, then fetch and load what kwarmd holds; when some are missing,
 * warm (unless no_warmup: then the first missing key is the error) and
 * fetch the rest.  A warm kwarmd so costs two requests and the gets. */
static int load_all(kw_ops *o, const kw_ops_opts *opts, const char *dep,
                    char *err, size_t errlen)
{
    char *text = NULL;
    int rc = kw_client_keys(o->client, opts->config_json, dep, opts->name,
                            &text);
    if (rc < 0)
        return kw_err_fmt(err, errlen, rc, "keys: %s",
                    kw_client_last_error(o->client));
    cJSON *doc = cJSON_Parse(text);
    free(text);
    if (!doc)
        return kw_err_fmt(err, errlen, KW_EPROTO, "kwarmd's keys: not JSON");
    size_t missing = 0;
    if ((rc = fill_deploy(&o->deploy, doc, err, errlen)) == 0 &&
        (rc = load_keys(o, doc, &missing, err, errlen)) == 0 && missing &&
        !opts->no_warmup && (rc = warm(o, opts, dep, err, errlen)) == 0)
        rc = load_keys(o, doc, &missing, err, errlen);
    cJSON_Delete(doc);
    if (rc == 0 && missing)
        return KW_ENOTFOUND; /* err names the first: no_warmup, or a race */
    return rc;
}

/* The device's arch and SMs, or the options'. */
static int pick_arch(kw_ops *o, const kw_ops_opts *opts, char *err,
                     size_t errlen)
{
    int major = 0, minor = 0, sms = 0;
    if (o->cuda && kw_cuda_device_info(o->cuda, NULL, 0, &major, &minor,
                                       &sms) < 0)
        return kw_err_fmt(err, errlen, KW_ECUDA, "cuda: %s",
                    kw_cuda_last_error(o->cuda));
    o->sm_count = sms > 0 ? (unsigned)sms : 0;
    if (opts->arch)
        snprintf(o->arch, sizeof(o->arch), "%s", opts->arch);
    else
        snprintf(o->arch, sizeof(o->arch), "sm_%d%d", major, minor);
    return 0;
}

static int check_opts(const kw_ops_opts *opts, char *err, size_t errlen)
{
    if (!opts || !opts->config_json)
        return kw_err_fmt(err, errlen, KW_EINVAL, "kw_ops_load: no config_json");
    if (!opts->cuda && (!opts->device || !opts->device->launch))
        return kw_err_fmt(err, errlen, KW_EINVAL,
                    "kw_ops_load: neither cuda nor a stand-in device");
    if (!opts->cuda && !opts->arch)
        return kw_err_fmt(err, errlen, KW_EINVAL,
                    "kw_ops_load: arch is required without a CUDA device");
    if (opts->arch && strlen(opts->arch) >= 16)
        return kw_err_fmt(err, errlen, KW_EINVAL, "kw_ops_load: arch too long");
    return 0;
}

int kw_ops_load(kw_ops **out, const kw_ops_opts *opts, char *err,
                size_t errlen)
{
    double t0 = kw__ops_now_ms();
    int rc = out ? check_opts(opts, err, errlen)
                 : kw_err_fmt(err, errlen, KW_EINVAL, "kw_ops_load: NULL out");
    if (rc < 0)
        return rc;
    kw_ops *o = calloc(1, sizeof(*o));
    if (!o)
        return kw_err_fmt(err, errlen, KW_ENOMEM, "out of memory");
    pthread_mutex_init(&o->lock, NULL);
    pthread_mutex_init(&o->miss_lock, NULL);
    o->cuda = opts->cuda;
    if (opts->device)
        o->device = *opts->device;
    o->log = opts->log;
    o->log_ctx = opts->log_ctx;
    char *dep = NULL;
    int tmo = opts->timeout_ms == 0 ? 60000 : opts->timeout_ms;
    o->timeout_ms = tmo;
    if ((rc = pick_arch(o, opts, err, errlen)) == 0 &&
        (rc = deployment_text(opts, o->arch, &dep, err, errlen)) == 0 &&
        (rc = kw_client_connect(&o->client, opts->socket, tmo, err,
                                errlen)) == 0)
        rc = load_all(o, opts, dep, err, errlen);
    cJSON_free(dep);
    if (rc < 0) {
        kw_ops_free(o);
        return rc;
    }
    o->load_ms = kw__ops_now_ms() - t0;
    *out = o;
    return 0;
}
