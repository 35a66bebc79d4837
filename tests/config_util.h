/* config_util.h: helpers shared by the config suites (test_config.c,
 * test_json.c): loading inline JSON, asserting errors name their pointer,
 * and a temporary directory for file-level cases. */
#ifndef KW_TEST_CONFIG_UTIL_H
#define KW_TEST_CONFIG_UTIL_H

#include <criterion/criterion.h>
#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include "kw_config.h"
#include "kw_err.h"
#include "kw_test_util.h"

#define NAME "cfg.json"

/* ---- helpers ----------------------------------------------------------- */


/* Loads len bytes of json (which must have a NUL at json[len]) and expects
 * KW_ECONFIG with a one-line message naming NAME and, unless ptr is NULL,
 * the pointer ptr.  what labels the case in failure messages. */
static inline void reject_len(const char *json, size_t len, const char *pointer,
                       const char *ptr, const char *what)
{
    kw_config_model m;
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load_buffer(&m, NAME, json, len, pointer, err,
                                   sizeof err);
    cr_expect_eq(rc, KW_ECONFIG, "[%s] rc %d (%s), want KW_ECONFIG", what, rc,
                 err);
    cr_expect(strstr(err, NAME) != NULL, "[%s] message lacks the file: %s",
              what, err);
    if (ptr != NULL)
        cr_expect(kw_test_names_pointer(err, ptr), "[%s] message lacks %s: %s", what,
                  ptr, err);
    cr_expect(strchr(err, '\n') == NULL, "[%s] message is not one line",
              what);
    /* *m is zeroed first and holds nothing to free on error. */
    cr_expect(m.path == NULL && m.text_config == NULL &&
                  m.compress_ratios == NULL && m.ncompress_ratios == 0,
              "[%s] model not left zeroed on error", what);
    kw_config_model_destroy(&m);
}

static inline void reject(const char *json, const char *ptr)
{
    reject_len(json, strlen(json), NULL, ptr, json);
}

/* Loads json (with --text-config pointer unless NULL); asserts success. */
static inline void load_ok(kw_config_model *m, const char *json, const char *pointer)
{
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load_buffer(m, NAME, json, strlen(json), pointer, err,
                                   sizeof err);
    cr_assert_eq(rc, 0, "rc %d (%s) for %s", rc, err, json);
}

/* Like load_ok but reports through cr_expect and returns the code, for
 * tables of inputs that must all be accepted. */
static inline int accept(kw_config_model *m, const char *json)
{
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = kw_config_load_buffer(m, NAME, json, strlen(json), NULL, err,
                                   sizeof err);
    cr_expect_eq(rc, 0, "rejected %s: %s", json, err);
    return rc;
}

/* Rejects `{"index_topk":2048, KEY: v}` for each v, naming /KEY; or, when
 * key is index_topk itself, `{"index_topk": v}`. */
static inline void reject_values(const char *key, const char *const *vals, size_t n)
{
    char json[512], ptr[128];
    snprintf(ptr, sizeof ptr, "/%s", key);
    for (size_t i = 0; i < n; i++) {
        if (strcmp(key, "index_topk") == 0)
            snprintf(json, sizeof json, "{\"index_topk\": %s}", vals[i]);
        else
            snprintf(json, sizeof json, "{\"index_topk\": 2048, \"%s\": %s}",
                     key, vals[i]);
        reject(json, ptr);
    }
}

/* Accepts `{"index_topk":2048, KEY: v}` and returns what the loader read
 * into the model through get. */
static inline int64_t accept_value(const char *key, const char *val,
                            int64_t (*get)(const kw_config_model *))
{
    char json[512];
    kw_config_model m;
    if (strcmp(key, "index_topk") == 0)
        snprintf(json, sizeof json, "{\"index_topk\": %s}", val);
    else
        snprintf(json, sizeof json, "{\"index_topk\": 2048, \"%s\": %s}", key,
                 val);
    if (accept(&m, json) != 0)
        return INT64_MIN;
    int64_t v = get(&m);
    kw_config_model_destroy(&m);
    return v;
}

static inline int64_t get_topk(const kw_config_model *m) { return m->index_topk; }
static inline int64_t get_kpool(const kw_config_model *m)
{
    return m->has_index_kpool ? m->index_kpool : -1;
}
static inline int64_t get_mpe(const kw_config_model *m)
{
    return m->has_max_position_embeddings ? m->max_position_embeddings : -1;
}
static inline int64_t get_lora(const kw_config_model *m) { return m->kv_lora_rank; }
static inline int64_t get_rope(const kw_config_model *m)
{
    return m->qk_rope_head_dim;
}

#define N(a) (sizeof(a) / sizeof((a)[0]))

/* ---- temporary directory for file-level cases -------------------------- */

static char tmpdir[64];

static inline void tmp_setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(tmpdir, sizeof tmpdir, "config"), 0,
                 "mkdtemp: %s", strerror(errno));
}

/* Removes the temporary directory and everything in it. */
static inline void tmp_teardown(void)
{
    kw_test_rmtree(tmpdir);
}

/* Writes len bytes of data to tmpdir/name; returns the path (static). */
static inline const char *tmp_file(const char *name, const char *data, size_t len)
{
    static char path[256];
    cr_assert_eq(kw_test_write_file(tmpdir, name, data, len, path, sizeof path),
                 0, "%s/%s: %s", tmpdir, name, strerror(errno));
    return path;
}

#endif /* KW_TEST_CONFIG_UTIL_H */
