/* deploy.c: deployments from flags or a --deploy file, and their rules (§2).
 *
 * One table describes every integer field (name, bounds, default, offset),
 * in the manner of redis' createIntConfig, so flags, the file and the
 * defaults cannot drift apart.
 */
#include "kw_config.h"

#include <errno.h>
#include <stddef.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "kw_err.h"
#include "kw_parse.h"

typedef struct field_def {
    const char *name; /* snake_case, as in the file */
    const char *flag; /* as on the command line */
    int64_t min, max, def;
    size_t off; /* offsetof(kw_config_deploy, ...) for integers, else 0 */
} field_def;

#define INT_FIELD(nm, lo, def)                                              \
    {#nm, NULL, (lo), KW__INT_MAX, (def), offsetof(kw_config_deploy, nm)}

/* Indexed by kw_config_field.  A default of 0 means "derived later". */
static const field_def fields[KW_CONFIG_NFIELDS] = {
    INT_FIELD(dcp_world, 1, 1),
    INT_FIELD(dcp_rank, 0, KW_CONFIG_RANK_ALL),
    INT_FIELD(dcp_interleave, 1, 1),
    INT_FIELD(pcp, 1, 1),
    INT_FIELD(max_num_batched_tokens, 1, 8192),
    INT_FIELD(max_num_seqs, 1, 256),
    INT_FIELD(block_size, 1, 0),
    INT_FIELD(max_model_len, 1, 0),
    INT_FIELD(block_stride_rows, 1, 0),
    {"num_speculative_tokens", NULL, 0, 7, 0,
     offsetof(kw_config_deploy, num_speculative_tokens)},
    {"arch", NULL, 0, 0, 0, 0},
    {"text_config", NULL, 0, 0, 0, 0},
};

static int64_t *field_ptr(kw_config_deploy *d, kw_config_field f)
{
    return (int64_t *)((char *)d + fields[f].off);
}

static bool is_int_field(kw_config_field f)
{
    return f != KW_CONFIG_ARCH && f != KW_CONFIG_TEXT_CONFIG;
}

void kw_config_deploy_init(kw_config_deploy *d)
{
    memset(d, 0, sizeof *d);
    for (int f = 0; f < KW_CONFIG_NFIELDS; f++)
        if (is_int_field((kw_config_field)f))
            *field_ptr(d, (kw_config_field)f) = fields[f].def;
    memcpy(d->arch[0], "sm_90", 6);
    d->narch = 1;
}

void kw_config_deploy_destroy(kw_config_deploy *d)
{
    if (d == NULL)
        return;
    free(d->text_config);
    d->text_config = NULL;
}

const char *kw_config_field_name(kw_config_field f)
{
    return (unsigned)f < KW_CONFIG_NFIELDS ? fields[f].name : "?";
}

const char *kw_config_field_flag(kw_config_field f)
{
    static const char *const flags[KW_CONFIG_NFIELDS] = {
        "--dcp-world", "--dcp-rank", "--dcp-interleave", "--pcp",
        "--max-num-batched-tokens", "--max-num-seqs", "--block-size",
        "--max-model-len", "--block-stride-rows", "--num-speculative-tokens",
        "--arch", "--text-config",
    };
    return (unsigned)f < KW_CONFIG_NFIELDS ? flags[f] : "?";
}

int kw_config_flag_field(const char *flag)
{
    for (int f = 0; f < KW_CONFIG_NFIELDS; f++)
        if (strcmp(flag, kw_config_field_flag((kw_config_field)f)) == 0)
            return f;
    return -1;
}

/* Checks one arch name: "sm_" + 2 or 3 digits + optional 'a' or 'f'. */
static bool arch_ok(const char *s, size_t n)
{
    if (n < 5 || strncmp(s, "sm_", 3) != 0)
        return false;
    size_t digits = 0;
    while (3 + digits < n && s[3 + digits] >= '0' && s[3 + digits] <= '9')
        digits++;
    size_t rest = n - 3 - digits;
    if (digits < 2 || digits > 3 || rest > 1)
        return false;
    return rest == 0 || s[n - 1] == 'a' || s[n - 1] == 'f';
}

/* Adds one arch to d unless it is there already (de-dup in order). */
static int add_arch(kw_config_deploy *d, const char *s, size_t n, char *err,
                    size_t errlen, const char *where)
{
    if (!arch_ok(s, n)) {
        kw__config_errf(err, errlen, "%s: '%.*s' is not an arch name like "
                        "sm_90, sm_90a or sm_100f", where, (int)(n > 32 ? 32 : n), s);
        return KW_EDEPLOY;
    }
    for (size_t i = 0; i < d->narch; i++)
        if (strlen(d->arch[i]) == n && memcmp(d->arch[i], s, n) == 0)
            return 0;
    if (d->narch == KW_CONFIG_MAX_ARCH) {
        kw__config_errf(err, errlen, "%s: more than %d archs", where,
                        KW_CONFIG_MAX_ARCH);
        return KW_EDEPLOY;
    }
    memcpy(d->arch[d->narch], s, n);
    d->arch[d->narch++][n] = '\0';
    return 0;
}

/* Replaces d's arch list by the comma-separated list s. */
static int set_arch_list(kw_config_deploy *d, const char *s, char *err,
                         size_t errlen, const char *where)
{
    d->narch = 0;
    for (;;) {
        const char *comma = strchr(s, ',');
        size_t n = comma ? (size_t)(comma - s) : strlen(s);
        int rc = add_arch(d, s, n, err, errlen, where);
        if (rc < 0 || comma == NULL)
            return rc;
        s = comma + 1;
    }
}

static int set_text_config(kw_config_deploy *d, const char *v)
{
    char *dup = strdup(v);
    if (dup == NULL)
        return KW_ENOMEM;
    free(d->text_config);
    d->text_config = dup;
    return 0;
}

int kw_config_deploy_set_flag(kw_config_deploy *d, kw_config_field f,
                              const char *value, char *err, size_t errlen)
{
    const char *flag = kw_config_field_flag(f);
    if ((unsigned)f >= KW_CONFIG_NFIELDS)
        return KW_EINVAL;
    if (d->given & (1u << f)) {
        kw__config_errf(err, errlen, "%s: given more than once", flag);
        return KW_EDEPLOY;
    }
    if (d->source[0] != '\0' && f != KW_CONFIG_TEXT_CONFIG) {
        kw__config_errf(err, errlen, "%s: conflicts with --deploy %s", flag,
                        d->source);
        return KW_EDEPLOY;
    }
    d->given |= 1u << f;
    if (f == KW_CONFIG_ARCH)
        return set_arch_list(d, value, err, errlen, flag);
    if (f == KW_CONFIG_TEXT_CONFIG)
        return set_text_config(d, value);
    if (f == KW_CONFIG_DCP_RANK && strcmp(value, "all") == 0) {
        d->dcp_rank = KW_CONFIG_RANK_ALL;
        return 0;
    }
    int64_t v;
    if (kw_parse_i64(value, fields[f].min, fields[f].max, &v) < 0) {
        kw__config_errf(err, errlen, "%s: '%.32s' is not %san integer in "
                        "[%lld, %lld]", flag, value,
                        f == KW_CONFIG_DCP_RANK ? "'all' or " : "",
                        (long long)fields[f].min, (long long)fields[f].max);
        return KW_EDEPLOY;
    }
    *field_ptr(d, f) = v;
    return 0;
}

/* "arch" as kwarm keys --json prints it, an array of strings: joined with
 * commas, then read as the flag's list is (the same checks, the same
 * de-duplication), so that document's "deployment" is a --deploy file. */
static int arch_array(kw_config_deploy *d, const cJSON *arr, char *err,
                      size_t errlen, const char *where)
{
    char list[KW_CONFIG_MAX_ARCH * (KW_CONFIG_ARCH_LEN + 1) + 1] = "";
    size_t used = 0;
    const cJSON *a;
    cJSON_ArrayForEach(a, arr) {
        size_t n = cJSON_IsString(a) ? strlen(a->valuestring) : 0;
        if (!cJSON_IsString(a) || used + n + 2 > sizeof list) {
            kw__config_errf(err, errlen, "%s: must be a string or an array "
                            "of at most %d arch strings", where,
                            KW_CONFIG_MAX_ARCH);
            return KW_EDEPLOY;
        }
        used += (size_t)snprintf(list + used, sizeof list - used, "%s%s",
                                 used ? "," : "", a->valuestring);
    }
    return set_arch_list(d, list, err, errlen, where);
}

/* Reads one member of a --deploy file into d. */
static int load_member(kw_config_deploy *d, const cJSON *it, const char *path,
                       char *err, size_t errlen)
{
    char ptr[KW_CONFIG_MAX_POINTER] = "";
    kw__config_ptr_append(ptr, sizeof ptr, it->string);
    int f = 0;
    while (f < KW_CONFIG_NFIELDS && strcmp(fields[f].name, it->string) != 0)
        f++;
    if (f == KW_CONFIG_NFIELDS) {
        kw__config_errf(err, errlen, "%s: %s: unknown deployment field", path,
                        ptr);
        return KW_EDEPLOY;
    }
    if (d->given & (1u << f)) {
        kw__config_errf(err, errlen, "%s: %s: conflicts with %s", path, ptr,
                        kw_config_field_flag((kw_config_field)f));
        return KW_EDEPLOY;
    }
    d->given |= 1u << f;
    if (cJSON_IsNull(it))
        return 0;
    if (f == KW_CONFIG_DCP_RANK && cJSON_IsString(it) &&
        strcmp(it->valuestring, "all") == 0) {
        d->dcp_rank = KW_CONFIG_RANK_ALL;
        return 0;
    }
    char where[KW_CONFIG_MAX_POINTER + 300];
    snprintf(where, sizeof where, "%s: %s", path, ptr);
    if (f == KW_CONFIG_ARCH && cJSON_IsArray(it))
        return arch_array(d, it, err, errlen, where);
    if (f == KW_CONFIG_ARCH || f == KW_CONFIG_TEXT_CONFIG) {
        if (!cJSON_IsString(it)) {
            kw__config_errf(err, errlen, "%s: must be a string", where);
            return KW_EDEPLOY;
        }
        return f == KW_CONFIG_ARCH
                   ? set_arch_list(d, it->valuestring, err, errlen, where)
                   : set_text_config(d, it->valuestring);
    }
    int rc = kw__config_int(it, path, ptr, fields[f].min, fields[f].max,
                            field_ptr(d, (kw_config_field)f), err, errlen);
    return rc == KW_ECONFIG ? KW_EDEPLOY : rc;
}

int kw_config_deploy_load(kw_config_deploy *d, const char *path, char *err,
                          size_t errlen)
{
    /* --text-config names part of the model, so it may go with --deploy. */
    if ((d->given & ~(1u << KW_CONFIG_TEXT_CONFIG)) != 0 ||
        d->source[0] != '\0') {
        kw__config_errf(err, errlen, "--deploy: conflicts with deployment "
                        "flags or another --deploy");
        return KW_EDEPLOY;
    }
    char *buf = NULL;
    size_t len = 0;
    cJSON *root = NULL;
    int rc = kw__config_read_file(path, &buf, &len, err, errlen);
    if (rc == 0)
        rc = kw__config_parse(path, buf, len, &root, err, errlen);
    if (rc == KW_EJSON || rc == -EFBIG || (rc < 0 && rc > -1000))
        rc = KW_EDEPLOY;
    if (rc == 0)
        rc = kw_config_deploy_from_json(d, root, path, err, errlen);
    cJSON_Delete(root);
    free(buf);
    return rc;
}

int kw_config_deploy_from_json(kw_config_deploy *d, const cJSON *obj,
                               const char *name, char *err, size_t errlen)
{
    int rc = 0;
    if (!cJSON_IsObject(obj)) {
        kw__config_errf(err, errlen, "%s: /: a deployment is a JSON object", name);
        return KW_EDEPLOY;
    }
    for (const cJSON *it = obj->child; rc == 0 && it; it = it->next)
        rc = load_member(d, it, name, err, errlen);
    if (rc == 0)
        snprintf(d->source, sizeof d->source, "%s", name);
    return rc;
}

/* The arch list joined by commas into buf (room for every arch). */
static void arch_list(const kw_config_deploy *d, char *buf, size_t cap)
{
    size_t n = 0;
    buf[0] = '\0';
    for (size_t i = 0; i < d->narch && n < cap; i++)
        n += (size_t)snprintf(buf + n, cap - n, "%s%s", i ? "," : "",
                              d->arch[i]);
}

/* Adds field f of d to obj, as a --deploy file spells it; false on
 * allocation failure. */
static bool add_given(cJSON *obj, const kw_config_deploy *d,
                      kw_config_field f)
{
    const char *name = fields[f].name;
    char list[KW_CONFIG_MAX_ARCH * KW_CONFIG_ARCH_LEN + 1];
    if (f == KW_CONFIG_ARCH) {
        arch_list(d, list, sizeof list);
        return cJSON_AddStringToObject(obj, name, list) != NULL;
    }
    if (f == KW_CONFIG_TEXT_CONFIG)
        return d->text_config == NULL ||
               cJSON_AddStringToObject(obj, name, d->text_config) != NULL;
    if (f == KW_CONFIG_DCP_RANK && d->dcp_rank == KW_CONFIG_RANK_ALL)
        return cJSON_AddStringToObject(obj, name, "all") != NULL;
    int64_t v = *(const int64_t *)((const char *)d + fields[f].off);
    return cJSON_AddNumberToObject(obj, name, (double)v) != NULL;
}

int kw_config_deploy_given_json(const kw_config_deploy *d, cJSON **out)
{
    cJSON *obj = cJSON_CreateObject();
    bool ok = obj != NULL;
    for (int f = 0; ok && f < KW_CONFIG_NFIELDS; f++)
        if (d->given & (1u << f))
            ok = add_given(obj, d, (kw_config_field)f);
    if (!ok) {
        cJSON_Delete(obj);
        return KW_ENOMEM;
    }
    *out = obj;
    return 0;
}
