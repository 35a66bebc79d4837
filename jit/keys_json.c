/* keys_json.c: the document of `kwarm keys --json` (spec §6). */
#include "kw_keys.h"

#include "kw_err.h"

cJSON *kw_keys_key_json(const kw_keys_key *k)
{
    char hex[KW_KEYS_HEX_LEN];
    cJSON *o = cJSON_CreateObject(), *fields = cJSON_CreateObject();
    if (o == NULL || fields == NULL) {
        cJSON_Delete(o);
        cJSON_Delete(fields);
        return NULL;
    }
    cJSON_AddItemToObject(o, "family",
                          cJSON_CreateString(kw_keys_family_name(k->family)));
    cJSON_AddItemToObject(o, "arch", cJSON_CreateString(k->arch));
    cJSON_AddItemToObject(o, "fields", fields);
    for (size_t i = 0; i < kw_keys_nfields(k->family); i++) {
        const char *name = kw_keys_field_name(k->family, i);
        cJSON *v = kw_keys_field_is_bool(k->family, i)
                       ? cJSON_CreateBool(k->fields[i] != 0)
                       : cJSON_CreateNumber((double)k->fields[i]);
        cJSON_AddItemToObject(fields, name, v);
    }
    kw_keys_hex(k->digest, hex);
    cJSON_AddItemToObject(o, "digest", cJSON_CreateString(hex));
    return o;
}

/* The "settings" object: what was read from the text config. */
static cJSON *settings_json(const kw_config_model *m)
{
    cJSON *s = cJSON_CreateObject();
    cJSON *ratios = cJSON_CreateArray();
    if (s == NULL || ratios == NULL) {
        cJSON_Delete(s);
        cJSON_Delete(ratios);
        return NULL;
    }
    cJSON_AddNumberToObject(s, "index_topk", (double)m->index_topk);
    for (size_t i = 0; i < m->ncompress_ratios; i++)
        cJSON_AddItemToArray(ratios, cJSON_CreateNumber(m->compress_ratios[i]));
    cJSON_AddItemToObject(s, "compress_ratios", ratios);
    if (m->has_index_kpool)
        cJSON_AddNumberToObject(s, "index_kpool", (double)m->index_kpool);
    else
        cJSON_AddNullToObject(s, "index_kpool");
    if (m->has_max_position_embeddings)
        cJSON_AddNumberToObject(s, "max_model_len",
                                (double)m->max_position_embeddings);
    else
        cJSON_AddNullToObject(s, "max_model_len");
    cJSON_AddNumberToObject(s, "kv_lora_rank", (double)m->kv_lora_rank);
    cJSON_AddNumberToObject(s, "qk_rope_head_dim", (double)m->qk_rope_head_dim);
    if (m->has_index_n_heads)
        cJSON_AddNumberToObject(s, "index_n_heads", (double)m->index_n_heads);
    else
        cJSON_AddNullToObject(s, "index_n_heads");
    if (m->has_index_head_dim)
        cJSON_AddNumberToObject(s, "index_head_dim", (double)m->index_head_dim);
    else
        cJSON_AddNullToObject(s, "index_head_dim");
    return s;
}

/* The "deployment" object, after kw_config_resolve(). */
static cJSON *deployment_json(const kw_config_deploy *d)
{
    cJSON *o = cJSON_CreateObject(), *arch = cJSON_CreateArray();
    if (o == NULL || arch == NULL) {
        cJSON_Delete(o);
        cJSON_Delete(arch);
        return NULL;
    }
    cJSON_AddNumberToObject(o, "dcp_world", (double)d->dcp_world);
    if (d->dcp_rank == KW_CONFIG_RANK_ALL)
        cJSON_AddStringToObject(o, "dcp_rank", "all");
    else
        cJSON_AddNumberToObject(o, "dcp_rank", (double)d->dcp_rank);
    cJSON_AddNumberToObject(o, "dcp_interleave", (double)d->dcp_interleave);
    cJSON_AddNumberToObject(o, "pcp", (double)d->pcp);
    cJSON_AddNumberToObject(o, "max_num_batched_tokens",
                            (double)d->max_num_batched_tokens);
    cJSON_AddNumberToObject(o, "max_num_seqs", (double)d->max_num_seqs);
    cJSON_AddNumberToObject(o, "block_size", (double)d->block_size);
    cJSON_AddNumberToObject(o, "max_model_len", (double)d->max_model_len);
    cJSON_AddNumberToObject(o, "block_stride_rows", (double)d->block_stride_rows);
    cJSON_AddNumberToObject(o, "num_speculative_tokens",
                            (double)d->num_speculative_tokens);
    for (size_t i = 0; i < d->narch; i++)
        cJSON_AddItemToArray(arch, cJSON_CreateString(d->arch[i]));
    cJSON_AddItemToObject(o, "arch", arch);
    return o;
}

int kw_keys_to_json(const kw_config_model *m, const kw_config_deploy *d,
                    const kw_keys_set *s, cJSON **out)
{
    cJSON *doc = cJSON_CreateObject(), *keys = cJSON_CreateArray();
    cJSON *settings = settings_json(m), *dep = deployment_json(d);
    if (doc == NULL || keys == NULL || settings == NULL || dep == NULL)
        goto nomem;
    cJSON_AddStringToObject(doc, "model", m->path);
    cJSON_AddStringToObject(doc, "text_config", m->text_config);
    cJSON_AddItemToObject(doc, "settings", settings);
    cJSON_AddItemToObject(doc, "deployment", dep);
    settings = dep = NULL;
    cJSON_AddNumberToObject(doc, "workspace_rows", (double)s->workspace_rows);
    cJSON_AddNumberToObject(doc, "workspace_bytes", (double)s->workspace_bytes);
    cJSON_AddItemToObject(doc, "keys", keys);
    for (size_t i = 0; i < s->nkeys; i++) {
        cJSON *k = kw_keys_key_json(&s->keys[i]);
        if (k == NULL)
            goto nomem_doc;
        cJSON_AddItemToArray(keys, k);
    }
    *out = doc;
    return 0;
nomem:
    cJSON_Delete(keys);
nomem_doc:
    cJSON_Delete(doc);
    cJSON_Delete(settings);
    cJSON_Delete(dep);
    return KW_ENOMEM;
}
