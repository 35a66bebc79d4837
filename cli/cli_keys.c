/* cli_keys.c: `kwarm keys`, the compile keys of a model and deployment. */
#include "cli.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_err.h"
#include "kw_keys.h"

typedef struct keys_opts {
    bool json;
} keys_opts;

static const kw_opt keys_rows[] = {
    {.name = "json", .type = KW_OPT_SWITCH, .off = offsetof(keys_opts, json),
     .size = sizeof(bool),
     .help = "one JSON document (docs/spec/warmup-keys.md\n"
             "§6) instead of a table"},
};

static const kw__cli_cmd keys_cmd = {
    .name = "keys",
    .usage = "usage: kwarm keys --model CONFIG.json [DEPLOYMENT] [--json]\n"
             "\n"
             "Prints the compile keys a sparse-MLA serving process needs for this model\n"
             "and deployment (docs/spec/warmup-keys.md), with their digests.\n"
             "\n",
    KW__CLI_ROWS(keys_rows),
    .model = true,
};

/* Prints the settings block of the readable output. */
static void print_summary(const kw__cli_model *a, const kw_keys_set *s)
{
    const kw_config_model *m = &a->cfg;
    const kw_config_deploy *d = &a->dep;
    printf("model        %s\ntext config  %s\n", m->path, m->text_config);
    printf("settings     index_topk %lld, compress_ratios [", (long long)m->index_topk);
    for (size_t i = 0; i < m->ncompress_ratios && i < 8; i++)
        printf("%s%d", i ? "," : "", m->compress_ratios[i]);
    printf("%s], index_kpool ", m->ncompress_ratios > 8 ? ",..." : "");
    if (m->has_index_kpool)
        printf("%lld", (long long)m->index_kpool);
    else
        printf("none");
    printf(", kv_lora_rank %lld, qk_rope_head_dim %lld, element %d bytes\n",
           (long long)m->kv_lora_rank, (long long)m->qk_rope_head_dim,
           m->element_size);
    printf("deployment   dcp_world %lld, dcp_rank ", (long long)d->dcp_world);
    if (d->dcp_rank == KW_CONFIG_RANK_ALL)
        printf("all");
    else
        printf("%lld", (long long)d->dcp_rank);
    printf(", dcp_interleave %lld, pcp %lld, max_num_batched_tokens %lld,\n"
           "             max_num_seqs %lld, block_size %lld, max_model_len %lld, "
           "block_stride_rows %lld, arch ", (long long)d->dcp_interleave,
           (long long)d->pcp, (long long)d->max_num_batched_tokens,
           (long long)d->max_num_seqs, (long long)d->block_size,
           (long long)d->max_model_len, (long long)d->block_stride_rows);
    for (size_t i = 0; i < d->narch; i++)
        printf("%s%s", i ? "," : "", d->arch[i]);
    printf("\nworkspace    %lld rows, %lld bytes (%.1f MiB)\n",
           (long long)s->workspace_rows, (long long)s->workspace_bytes,
           (double)s->workspace_bytes / (1024.0 * 1024.0));
}

/* Prints the per-family counts and one line per key. */
static void print_keys(const kw_keys_set *s)
{
    size_t count[KW_K_NFAMILIES] = {0};
    for (size_t i = 0; i < s->nkeys; i++)
        count[s->keys[i].family]++;
    printf("keys         %zu:", s->nkeys);
    for (int f = 0; f < KW_K_NFAMILIES; f++)
        printf("%s %s %zu", f ? "," : "", kw_keys_family_name((kw_k_family)f),
               count[f]);
    printf("\n\n%-25s %-6s %-16s %s\n", "FAMILY", "ARCH", "DIGEST", "FIELDS");
    for (size_t i = 0; i < s->nkeys; i++) {
        const kw_keys_key *k = &s->keys[i];
        char hex[KW_KEYS_HEX_LEN];
        kw_keys_hex(k->digest, hex);
        printf("%-25s %-6s %.16s ", kw_keys_family_name(k->family), k->arch, hex);
        for (size_t f = 0; f < kw_keys_nfields(k->family); f++) {
            const char *name = kw_keys_field_name(k->family, f);
            if (kw_keys_field_is_bool(k->family, f))
                printf(" %s=%s", name, k->fields[f] ? "true" : "false");
            else
                printf(" %s=%lld", name, (long long)k->fields[f]);
        }
        putchar('\n');
    }
}

/* Prints the §6 document on stdout. */
static int print_json(const kw__cli_model *a, const kw_keys_set *s)
{
    cJSON *doc = NULL;
    int rc = kw_keys_to_json(&a->cfg, &a->dep, s, &doc);
    char *text = rc == 0 ? cJSON_PrintUnformatted(doc) : NULL;
    cJSON_Delete(doc);
    if (text == NULL) {
        kw__cli_err("keys", "%s", kw_strerror(KW_ENOMEM));
        return KW_CLI_RUNTIME;
    }
    fputs(text, stdout);
    putchar('\n');
    free(text);
    return KW_CLI_OK;
}

int kw__cli_keys(int argc, char **argv)
{
    kw__cli_model a;
    kw_keys_set set = {0};
    keys_opts o = {0};
    kw__cli_model_init(&a);
    int rc = kw__cli_getopt(&keys_cmd, argc, argv, &o, &a, NULL, 0);
    if (rc < 0)
        rc = kw__cli_model_load(&a, "keys");
    else
        goto out;
    if (rc != KW_CLI_OK)
        goto out;
    if ((rc = kw__cli_derive(&a, "keys", &set)) != KW_CLI_OK)
        goto out;
    if (o.json)
        rc = print_json(&a, &set);
    else {
        print_summary(&a, &set);
        print_keys(&set);
    }
out:
    kw_keys_set_destroy(&set);
    kw__cli_model_destroy(&a);
    return rc;
}
