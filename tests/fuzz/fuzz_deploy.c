/* fuzz_deploy.c: libFuzzer harness for deployments (jit/deploy.c).
 *
 * The first input byte picks the mode:
 *   even  the rest is JSON; when it parses to an object it goes through
 *         kw_config_deploy_from_json(), as a request's "deployment" does
 *         in kwarmd;
 *   odd   the rest is flag values, one per line, each line starting with
 *         a byte that picks the field; they go through
 *         kw_config_deploy_set_flag(), as the CLI's flags do.
 * An accepted deployment is then resolved against a small fixed model, so
 * the cross-field rules see fuzzed values too.
 */
#include "kw_config.h"

#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kw_err.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* Aborts (a libFuzzer crash) when cond is false: a broken contract. */
#define CHECK(cond)                                                        \
    do {                                                                   \
        if (!(cond))                                                       \
            abort();                                                       \
    } while (0)

/* A DeepSeek-V3.2-like text config: index_topk, MLA dims, bf16. */
static const char model_json[] =
    "{\"index_topk\": 2048, \"kv_lora_rank\": 512, \"qk_rope_head_dim\": 64,"
    " \"max_position_embeddings\": 163840, \"torch_dtype\": \"bfloat16\"}";

/* Checks the invariants of a deployment.  After a refused value the
 * deployment may be half set (callers discard it), so only bounds hold;
 * accepted ones (ok) also have at least one arch. */
static void check_deploy(const kw_config_deploy *d, const char *err, bool ok)
{
    CHECK(memchr(err, '\0', KW_CONFIG_ERRLEN) != NULL);
    CHECK(d->narch <= KW_CONFIG_MAX_ARCH && (!ok || d->narch >= 1));
    for (size_t i = 0; i < d->narch; i++)
        CHECK(memchr(d->arch[i], '\0', KW_CONFIG_ARCH_LEN) != NULL);
    CHECK(memchr(d->source, '\0', sizeof d->source) != NULL);
}

/* Feeds data (size bytes) as a JSON deployment object. */
static int from_json(kw_config_deploy *d, const uint8_t *data, size_t size,
                     char *err)
{
    cJSON *root = cJSON_ParseWithLength((const char *)data, size);
    if (root == NULL)
        return KW_EDEPLOY;
    int rc = kw_config_deploy_from_json(d, root, "deployment", err,
                                        KW_CONFIG_ERRLEN);
    CHECK(rc == 0 || rc == KW_EDEPLOY || rc == KW_ENOMEM);
    cJSON_Delete(root);
    return rc;
}

/* Feeds data (size bytes) as lines "<field byte><value>" of flag values;
 * stops at the first refused one, as the CLI does. */
static int from_flags(kw_config_deploy *d, const uint8_t *data, size_t size,
                      char *err)
{
    int rc = 0;
    while (rc == 0 && size > 0) {
        const uint8_t *nl = memchr(data, '\n', size);
        size_t n = nl != NULL ? (size_t)(nl - data) : size;
        if (n > 0) {
            kw_config_field f = (kw_config_field)(data[0] % KW_CONFIG_NFIELDS);
            char *v = malloc(n); /* n - 1 value bytes and a NUL */
            if (v == NULL)
                return KW_ENOMEM;
            memcpy(v, data + 1, n - 1);
            v[n - 1] = '\0';
            rc = kw_config_deploy_set_flag(d, f, v, err, KW_CONFIG_ERRLEN);
            CHECK(rc == 0 || rc == KW_EDEPLOY || rc == KW_ENOMEM);
            free(v);
        }
        size_t skip = nl != NULL ? n + 1 : n;
        data += skip;
        size -= skip;
    }
    return rc;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size == 0)
        return 0;
    kw_config_deploy d;
    kw_config_deploy_init(&d);
    char err[KW_CONFIG_ERRLEN] = "";
    int rc = data[0] % 2 == 0 ? from_json(&d, data + 1, size - 1, err)
                              : from_flags(&d, data + 1, size - 1, err);
    check_deploy(&d, err, rc == 0);
    if (rc == 0) {
        kw_config_model m;
        char merr[KW_CONFIG_ERRLEN];
        if (kw_config_load_buffer(&m, "model.json", model_json,
                                  sizeof model_json - 1, NULL, merr,
                                  sizeof merr) == 0) {
            rc = kw_config_resolve(&d, &m, err, sizeof err);
            CHECK(rc == 0 || rc == KW_EDEPLOY || rc == KW_ECONFIG ||
                  rc == KW_ENOMEM);
            check_deploy(&d, err, rc == 0);
            kw_config_model_destroy(&m);
        }
    }
    kw_config_deploy_destroy(&d);
    return 0;
}
