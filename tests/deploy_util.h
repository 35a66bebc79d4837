/* deploy_util.h: helpers shared by the deployment suites (test_deploy.c,
 * test_resolve.c): setting flags, resolving against inline models, and a
 * temporary directory for --deploy files. */
#ifndef KW_TEST_DEPLOY_UTIL_H
#define KW_TEST_DEPLOY_UTIL_H

#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kw_config.h"
#include "kw_err.h"
#include "kw_test_util.h"

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* ---- helpers ----------------------------------------------------------- */

/* The integer fields (all but dcp_rank, arch and text_config). */
static const kw_config_field int_fields[] __attribute__((unused)) = {
    KW_CONFIG_DCP_WORLD,    KW_CONFIG_DCP_INTERLEAVE,
    KW_CONFIG_PCP,          KW_CONFIG_MAX_NUM_BATCHED_TOKENS,
    KW_CONFIG_MAX_NUM_SEQS, KW_CONFIG_BLOCK_SIZE,
    KW_CONFIG_MAX_MODEL_LEN, KW_CONFIG_BLOCK_STRIDE_ROWS,
};

static inline int64_t *int_slot(kw_config_deploy *d, kw_config_field f)
{
    switch (f) {
    case KW_CONFIG_DCP_WORLD: return &d->dcp_world;
    case KW_CONFIG_DCP_RANK: return &d->dcp_rank;
    case KW_CONFIG_DCP_INTERLEAVE: return &d->dcp_interleave;
    case KW_CONFIG_PCP: return &d->pcp;
    case KW_CONFIG_MAX_NUM_BATCHED_TOKENS: return &d->max_num_batched_tokens;
    case KW_CONFIG_MAX_NUM_SEQS: return &d->max_num_seqs;
    case KW_CONFIG_BLOCK_SIZE: return &d->block_size;
    case KW_CONFIG_MAX_MODEL_LEN: return &d->max_model_len;
    case KW_CONFIG_BLOCK_STRIDE_ROWS: return &d->block_stride_rows;
    default: return NULL;
    }
}


/* True when err names flag (e.g. "--block-size") as a whole word, so that
 * "--dcp-world" is not found inside a longer flag. */
static inline bool names_flag(const char *err, const char *flag)
{
    size_t n = strlen(flag);
    for (const char *p = strstr(err, flag); p; p = strstr(p + 1, flag)) {
        char c = p[n];
        if ((p == err || p[-1] != '-') && !(isalnum((unsigned char)c) ||
                                             c == '-' || c == '_'))
            return true;
    }
    return false;
}

/* Sets one flag on a fresh deployment; returns the code, message in err. */
static inline int set_one(kw_config_deploy *d, kw_config_field f, const char *v,
                   char *err)
{
    kw_config_deploy_init(d);
    err[0] = '\0';
    return kw_config_deploy_set_flag(d, f, v, err, KW_CONFIG_ERRLEN);
}

/* Expects every integer flag to reject value with KW_EDEPLOY and a one-line
 * message naming the flag. */
static inline void int_flags_reject(const char *value)
{
    for (size_t i = 0; i < N(int_fields); i++) {
        kw_config_deploy d;
        char err[KW_CONFIG_ERRLEN];
        const char *flag = kw_config_field_flag(int_fields[i]);
        int rc = set_one(&d, int_fields[i], value, err);
        cr_expect_eq(rc, KW_EDEPLOY, "%s '%s': rc %d", flag, value, rc);
        cr_expect(names_flag(err, flag), "%s '%s': %s", flag, value, err);
        cr_expect(strchr(err, '\n') == NULL, "%s: not one line", flag);
        kw_config_deploy_destroy(&d);
    }
}

/* Loads a model from inline JSON; asserts success. */
static inline void model(kw_config_model *m, const char *json)
{
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load_buffer(m, "model.json", json, strlen(json), NULL,
                                   err, sizeof err);
    cr_assert_eq(rc, 0, "model %s: %s", json, err);
}

/* A deployment built from flag/value pairs, NULL-terminated. */
static inline void flags(kw_config_deploy *d, const char *const *fv)
{
    kw_config_deploy_init(d);
    for (size_t i = 0; fv[i] != NULL; i += 2) {
        char err[KW_CONFIG_ERRLEN] = "";
        int f = kw_config_flag_field(fv[i]);
        cr_assert(f >= 0, "no flag %s", fv[i]);
        int rc = kw_config_deploy_set_flag(d, (kw_config_field)f, fv[i + 1],
                                           err, sizeof err);
        cr_assert_eq(rc, 0, "%s %s: %s", fv[i], fv[i + 1], err);
    }
}

/* Resolves flags fv against the model json; returns the code. */
static inline int resolve(const char *json, const char *const *fv,
                   kw_config_deploy *d, char *err)
{
    kw_config_model m;
    model(&m, json);
    flags(d, fv);
    err[0] = '\0';
    int rc = kw_config_resolve(d, &m, err, KW_CONFIG_ERRLEN);
    kw_config_model_destroy(&m);
    return rc;
}

/* Resolves and expects success, returning the resolved deployment. */
static inline kw_config_deploy resolve_ok(const char *json, const char *const *fv)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    int rc = resolve(json, fv, &d, err);
    cr_expect_eq(rc, 0, "resolve of %s: rc %d: %s", json, rc, err);
    return d;
}

/* Resolves and expects a rejection naming flag. */
static inline void resolve_rejects(const char *json, const char *const *fv,
                            const char *flag)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    int rc = resolve(json, fv, &d, err);
    cr_expect(rc == KW_EDEPLOY || rc == KW_ECONFIG,
              "%s: rc %d, want a rejection", json, rc);
    cr_expect(names_flag(err, flag), "%s: %s not named: %s", json, flag, err);
    cr_expect(strchr(err, '\n') == NULL, "not one line: %s", err);
    kw_config_deploy_destroy(&d);
}

#define FLAT "{\"index_topk\": 2048, \"max_position_embeddings\": 163840}"
#define V4 "{\"index_topk\": 512, \"max_position_embeddings\": 1048576, " \
           "\"compress_ratios\": [0, 0, 4, 128, 4, 128, 0]}"
#define KPOOL32 "{\"index_topk\": 2048, \"max_position_embeddings\": 4096, " \
                "\"index_kpool\": 32}"
#define F(...) ((const char *const[]){__VA_ARGS__, NULL})
#define NOFLAGS ((const char *const[]){NULL})

/* ---- temporary directory for --deploy files ----------------------------- */

static char tmpdir[64];

static inline void tmp_setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(tmpdir, sizeof tmpdir, "deploy"), 0,
                 "mkdtemp: %s", strerror(errno));
}

/* Removes the temporary directory and everything in it. */
static inline void tmp_teardown(void)
{
    kw_test_rmtree(tmpdir);
}

/* Writes text to tmpdir/name and returns the path (static buffer). */
static inline const char *tmp_file(const char *name, const char *text)
{
    static char path[256];
    cr_assert_eq(kw_test_write_file(tmpdir, name, text, strlen(text), path,
                                    sizeof path), 0, "%s/%s: %s", tmpdir, name,
                 strerror(errno));
    return path;
}

/* Loads text as a --deploy file into a fresh deployment. */
static inline int load_text(kw_config_deploy *d, const char *text, char *err,
                     const char **path)
{
    *path = tmp_file("deploy.json", text);
    kw_config_deploy_init(d);
    err[0] = '\0';
    return kw_config_deploy_load(d, *path, err, KW_CONFIG_ERRLEN);
}

/* Expects text to be refused as a --deploy file with KW_EDEPLOY, naming
 * the file and, unless ptr is NULL, the pointer. */
static inline void file_rejects(const char *text, const char *ptr)
{
    kw_config_deploy d;
    char err[KW_CONFIG_ERRLEN];
    const char *path;
    int rc = load_text(&d, text, err, &path);
    cr_expect_eq(rc, KW_EDEPLOY, "%s: rc %d (%s)", text, rc, err);
    cr_expect(strstr(err, path) != NULL, "%s: file not named: %s", text,
              err);
    if (ptr != NULL)
        cr_expect(kw_test_names_pointer(err, ptr), "%s: %s not named: %s", text, ptr,
                  err);
    cr_expect(strchr(err, '\n') == NULL, "%s: not one line", text);
    kw_config_deploy_destroy(&d);
}

#endif /* KW_TEST_DEPLOY_UTIL_H */
