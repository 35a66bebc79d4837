/* config.c: finding the text config and reading its settings (§1, §2). */
#include "kw_config.h"

#include <errno.h>
#include <stdlib.h>
#include <stdio.h>
#include <string.h>

#include "internal.h"
#include "kw_err.h"

/* Wrapper keys whose object value holds the language model's settings, in
 * the order they are reported when two are present (§1 step 2). */
static const char *const wrapper_keys[] = {
    "thinker_config", "llm_config", "language_config", "text_config",
    "decoder",        "generator",  "text_encoder",
};
#define NWRAPPERS (sizeof wrapper_keys / sizeof wrapper_keys[0])

/* Walks an explicit --text-config pointer from root.  "" and "/" both mean
 * the root.  Tokens name object members; ~1 decodes to '/', ~0 to '~'. */
static int walk_pointer(const cJSON *root, const char *pointer,
                        const cJSON **out, const char *name, char *err,
                        size_t errlen)
{
    const cJSON *cur = root;
    if (strlen(pointer) >= KW_CONFIG_MAX_POINTER) {
        kw__config_errf(err, errlen, "--text-config: pointer longer than %d",
                        KW_CONFIG_MAX_POINTER - 1);
        return KW_EDEPLOY;
    }
    if (pointer[0] != '\0' && pointer[0] != '/') {
        kw__config_errf(err, errlen,
                        "--text-config: '%s' is not a JSON pointer "
                        "(it must be empty or start with '/')", pointer);
        return KW_EDEPLOY;
    }
    char tok[KW_CONFIG_MAX_POINTER];
    const char *p = pointer[0] == '/' ? pointer + 1 : pointer;
    while (*p != '\0' && cur != NULL) {
        size_t n = 0;
        for (; *p != '\0' && *p != '/'; p++) {
            if (*p == '~' && (p[1] == '0' || p[1] == '1')) {
                tok[n++] = p[1] == '0' ? '~' : '/';
                p++;
            } else if (*p == '~') {
                kw__config_errf(err, errlen,
                                "--text-config: '%s': bad escape '~'", pointer);
                return KW_EDEPLOY;
            } else
                tok[n++] = *p;
        }
        tok[n] = '\0';
        if (*p == '/')
            p++;
        cur = cJSON_GetObjectItemCaseSensitive(cur, tok);
    }
    if (cur == NULL || !cJSON_IsObject(cur)) {
        kw__config_errf(err, errlen,
                        "%s: --text-config %s does not name an object", name,
                        pointer);
        return KW_ECONFIG;
    }
    *out = cur;
    return 0;
}

/* Applies §1 step 2 from root: descend through the one wrapper key whose
 * value is an object, at most KW_CONFIG_MAX_DESCENT times.  The pointer
 * of the result is written to ptr ("" for the root). */
static int search_wrappers(const cJSON *root, const cJSON **out, char *ptr,
                           size_t cap, const char *name, char *err,
                           size_t errlen)
{
    const cJSON *cur = root;
    for (int depth = 0;; depth++) {
        const char *found[2] = {NULL, NULL};
        const cJSON *next = NULL;
        size_t nfound = 0;
        for (size_t i = 0; i < NWRAPPERS; i++) {
            const cJSON *w = cJSON_GetObjectItemCaseSensitive(cur, wrapper_keys[i]);
            if (!cJSON_IsObject(w))
                continue;
            if (nfound < 2)
                found[nfound] = wrapper_keys[i];
            nfound++;
            next = w;
        }
        if (nfound == 0)
            break;
        if (nfound > 1) {
            kw__config_errf(err, errlen,
                            "%s: ambiguous text config: %s/%s and %s/%s; "
                            "pass --text-config", name, ptr, found[0], ptr,
                            found[1]);
            return KW_ECONFIG;
        }
        if (depth == KW_CONFIG_MAX_DESCENT) {
            kw__config_errf(err, errlen,
                            "%s: %s/%s: text config nested deeper than %d "
                            "wrappers; pass --text-config", name, ptr,
                            found[0], KW_CONFIG_MAX_DESCENT);
            return KW_ECONFIG;
        }
        kw__config_ptr_append(ptr, cap, found[0]);
        cur = next;
    }
    *out = cur;
    return 0;
}

/* Reads one optional integer member of obj; absent and null leave *out and
 * report *present = false. */
static int opt_int(const cJSON *obj, const char *key, const char *tptr,
                   int64_t lo, int64_t hi, int64_t *out, bool *present,
                   const char *name, char *err, size_t errlen)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(obj, key);
    *present = it != NULL && !cJSON_IsNull(it);
    if (!*present)
        return 0;
    char ptr[KW_CONFIG_MAX_POINTER + 64];
    snprintf(ptr, sizeof ptr, "%s", tptr);
    kw__config_ptr_append(ptr, sizeof ptr, key);
    return kw__config_int(it, name, ptr, lo, hi, out, err, errlen);
}

/* Reads compress_ratios: an array of at most KW_CONFIG_MAX_RATIOS
 * integers in [0, 65536]; absent, null or empty means none. */
static int read_ratios(kw_config_model *m, const cJSON *tc, const char *tptr,
                       const char *name, char *err, size_t errlen)
{
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(tc, "compress_ratios");
    char ptr[KW_CONFIG_MAX_POINTER + 64];
    snprintf(ptr, sizeof ptr, "%s", tptr);
    kw__config_ptr_append(ptr, sizeof ptr, "compress_ratios");
    if (arr == NULL || cJSON_IsNull(arr))
        return 0;
    if (!cJSON_IsArray(arr)) {
        kw__config_errf(err, errlen, "%s: %s: must be an array of integers",
                        name, ptr);
        return KW_ECONFIG;
    }
    int n = cJSON_GetArraySize(arr);
    if (n > KW_CONFIG_MAX_RATIOS) {
        kw__config_errf(err, errlen, "%s: %s: more than %d entries", name, ptr,
                        KW_CONFIG_MAX_RATIOS);
        return KW_ECONFIG;
    }
    if (n == 0)
        return 0;
    m->compress_ratios = malloc((size_t)n * sizeof *m->compress_ratios);
    if (m->compress_ratios == NULL)
        return KW_ENOMEM;
    size_t base = strlen(ptr), i = 0;
    for (const cJSON *e = arr->child; e != NULL; e = e->next, i++) {
        char tok[16];
        int64_t v;
        snprintf(tok, sizeof tok, "%zu", i);
        kw__config_ptr_append(ptr, sizeof ptr, tok);
        int rc = kw__config_int(e, name, ptr, 0, 65536, &v, err, errlen);
        if (rc < 0)
            return rc;
        ptr[base] = '\0';
        m->compress_ratios[i] = (int32_t)v;
    }
    m->ncompress_ratios = i;
    return 0;
}

/* Finds the workspace element size: the first string among root
 * torch_dtype, root dtype, text torch_dtype, text dtype (vLLM's order). */
static int read_dtype(kw_config_model *m, const cJSON *root, const cJSON *tc,
                      const char *tptr, const char *name, char *err,
                      size_t errlen)
{
    const cJSON *objs[4] = {root, root, tc, tc};
    const char *keys[4] = {"torch_dtype", "dtype", "torch_dtype", "dtype"};
    m->element_size = 2;
    for (int i = 0; i < 4; i++) {
        const cJSON *it = cJSON_GetObjectItemCaseSensitive(objs[i], keys[i]);
        if (it == NULL || cJSON_IsNull(it))
            continue;
        if (!cJSON_IsString(it)) {
            kw__config_errf(err, errlen, "%s: %s/%s: must be a string", name,
                            i < 2 ? "" : tptr, keys[i]);
            return KW_ECONFIG;
        }
        m->element_size = strcmp(it->valuestring, "float32") == 0 ? 4 : 2;
        return 0;
    }
    return 0;
}

/* Reads index_n_heads ([1, 256]) and index_head_dim (a multiple of 32 in
 * [32, 512]), the indexer_logits shape (§2, §4.6). */
static int read_indexer(kw_config_model *m, const cJSON *tc, const char *tptr,
                        const char *name, char *err, size_t errlen)
{
    int rc = opt_int(tc, "index_n_heads", tptr, 1, 256, &m->index_n_heads,
                     &m->has_index_n_heads, name, err, errlen);
    if (rc == 0)
        rc = opt_int(tc, "index_head_dim", tptr, 32, 512, &m->index_head_dim,
                     &m->has_index_head_dim, name, err, errlen);
    if (rc == 0 && m->has_index_head_dim && m->index_head_dim % 32 != 0) {
        kw__config_errf(err, errlen, "%s: %s/index_head_dim: %lld is not a "
                        "multiple of 32", name, tptr,
                        (long long)m->index_head_dim);
        rc = KW_ECONFIG;
    }
    return rc;
}

/* Reads and validates every setting of §2 from the text config tc. */
static int read_settings(kw_config_model *m, const cJSON *root,
                         const cJSON *tc, const char *tptr, const char *name,
                         char *err, size_t errlen)
{
    bool has;
    int rc = opt_int(tc, "index_topk", tptr, 1, 1048576, &m->index_topk, &has,
                     name, err, errlen);
    if (rc == 0 && !has) {
        kw__config_errf(err, errlen, "%s: no index_topk in text config at %s "
                        "(not a sparse-MLA model?)", name,
                        tptr[0] ? tptr : "/");
        rc = KW_ECONFIG;
    }
    if (rc == 0)
        rc = read_ratios(m, tc, tptr, name, err, errlen);
    if (rc == 0)
        rc = opt_int(tc, "index_kpool", tptr, 0, 65536, &m->index_kpool,
                     &m->has_index_kpool, name, err, errlen);
    if (rc == 0)
        rc = opt_int(tc, "max_position_embeddings", tptr, 1, KW__INT_MAX,
                     &m->max_position_embeddings,
                     &m->has_max_position_embeddings, name, err, errlen);
    if (rc == 0)
        rc = opt_int(tc, "kv_lora_rank", tptr, 0, 65536, &m->kv_lora_rank,
                     &has, name, err, errlen);
    if (rc == 0)
        rc = opt_int(tc, "qk_rope_head_dim", tptr, 0, 65536,
                     &m->qk_rope_head_dim, &has, name, err, errlen);
    if (rc == 0)
        rc = read_indexer(m, tc, tptr, name, err, errlen);
    if (rc == 0)
        rc = read_dtype(m, root, tc, tptr, name, err, errlen);
    return rc;
}

int kw_config_load_buffer(kw_config_model *m, const char *name,
                          const char *buf, size_t len, const char *pointer,
                          char *err, size_t errlen)
{
    memset(m, 0, sizeof *m);
    cJSON *root = NULL;
    const cJSON *tc = NULL;
    char tptr[KW_CONFIG_MAX_POINTER] = "";
    int rc = kw__config_parse(name, buf, len, &root, err, errlen);
    if (rc == KW_EJSON)
        rc = KW_ECONFIG;
    if (rc == 0 && pointer != NULL) {
        rc = walk_pointer(root, pointer, &tc, name, err, errlen);
        if (rc == 0 && strcmp(pointer, "/") != 0)
            snprintf(tptr, sizeof tptr, "%s", pointer);
    } else if (rc == 0)
        rc = search_wrappers(root, &tc, tptr, sizeof tptr, name, err, errlen);
    if (rc == 0)
        rc = read_settings(m, root, tc, tptr, name, err, errlen);
    if (rc == 0) {
        m->path = strdup(name);
        m->text_config = strdup(tptr[0] ? tptr : "/");
        if (m->path == NULL || m->text_config == NULL)
            rc = KW_ENOMEM;
    }
    cJSON_Delete(root);
    if (rc < 0)
        kw_config_model_destroy(m);
    return rc;
}

int kw_config_load(kw_config_model *m, const char *path, const char *pointer,
                   char *err, size_t errlen)
{
    char *buf = NULL;
    size_t len = 0;
    memset(m, 0, sizeof *m);
    int rc = kw__config_read_file(path, &buf, &len, err, errlen);
    if (rc < 0)
        return rc;
    rc = kw_config_load_buffer(m, path, buf, len, pointer, err, errlen);
    free(buf);
    return rc;
}

void kw_config_model_destroy(kw_config_model *m)
{
    if (m == NULL)
        return;
    free(m->path);
    free(m->text_config);
    free(m->compress_ratios);
    memset(m, 0, sizeof *m);
}

/* Appends v to out[0..n) unless already there; returns the new count. */
static size_t add_unique(int64_t *out, size_t n, int64_t v)
{
    for (size_t i = 0; i < n; i++)
        if (out[i] == v)
            return n;
    out[n] = v;
    return n + 1;
}

size_t kw_config_ratios_p(const kw_config_model *m, int64_t *out)
{
    size_t n = 0;
    if (m->ncompress_ratios == 0)
        n = add_unique(out, n, 1);
    for (size_t i = 0; i < m->ncompress_ratios; i++)
        n = add_unique(out, n, m->compress_ratios[i] > 1 ? m->compress_ratios[i] : 1);
    bool kpool = m->has_index_kpool && m->index_kpool != 0;
    return add_unique(out, n, kpool ? m->index_kpool : 1);
}

size_t kw_config_ratios_s(const kw_config_model *m, int64_t *out)
{
    size_t n = 0;
    for (size_t i = 0; i < m->ncompress_ratios; i++)
        if (m->compress_ratios[i] > 1)
            n = add_unique(out, n, m->compress_ratios[i]);
    if (m->has_index_kpool && m->index_kpool > 1)
        n = add_unique(out, n, m->index_kpool);
    return n;
}
