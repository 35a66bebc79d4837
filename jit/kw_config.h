/* kw_config.h: model configs and deployments (prefix kw_config_).
 *
 * Reads a Hugging Face config.json strictly (spec/warmup-keys.md §1), finds
 * its text config (flat, composite or multimodal), validates the sparse-MLA
 * settings of §2, and reads a deployment from flags or a JSON file.  Every
 * error fills a one-line message naming the file and JSON pointer, or the
 * flag, at fault; the return code says which kind of input was bad.
 *
 * Thread-safety: every function works on caller-owned structs only; distinct
 * structs may be used from distinct threads at once.
 */
#ifndef KW_CONFIG_H
#define KW_CONFIG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define KW_CONFIG_MAX_FILE (16u << 20) /* bytes of a config or deploy file */
#define KW_CONFIG_MAX_RATIOS 4096      /* entries of compress_ratios */
#define KW_CONFIG_MAX_DESCENT 4        /* wrapper levels searched */
#define KW_CONFIG_MAX_POINTER 4096     /* bytes of a --text-config pointer */
#define KW_CONFIG_MAX_ARCH 16          /* distinct archs in a deployment */
#define KW_CONFIG_ARCH_LEN 8           /* "sm_100a" + NUL */
#define KW_CONFIG_RANK_ALL (-1)        /* dcp_rank "all" */
#define KW_CONFIG_ERRLEN 1024          /* room for one error line */

/* The settings read from one config.json (§2).  Filled by kw_config_load();
 * owns its strings and array; release with kw_config_model_destroy(). */
typedef struct kw_config_model {
    char *path;        /* the file name as given */
    char *text_config; /* JSON pointer of the text config; "/" is the root */
    int64_t index_topk;
    int32_t *compress_ratios; /* NULL when absent or empty */
    size_t ncompress_ratios;
    bool has_index_kpool;
    int64_t index_kpool;
    bool has_max_position_embeddings;
    int64_t max_position_embeddings;
    int64_t kv_lora_rank;     /* 0 when absent */
    int64_t qk_rope_head_dim; /* 0 when absent */
    bool has_index_n_heads;   /* index_n_heads, [1, 256] */
    int64_t index_n_heads;
    bool has_index_head_dim;  /* index_head_dim, 32..512, multiple of 32 */
    int64_t index_head_dim;
    int element_size;         /* bytes per workspace element: 2 or 4 */
} kw_config_model;

/* Loads and validates the config at path.  pointer is the --text-config
 * JSON pointer, or NULL to search the wrapper keys of §1.
 * Returns 0; KW_ECONFIG for a bad file or field (message in err); -errno when
 * the file cannot be read (message in err); KW_ENOMEM.  *m is zeroed first
 * and holds nothing to free on error. */
int kw_config_load(kw_config_model *m, const char *path, const char *pointer,
                   char *err, size_t errlen);

/* As kw_config_load(), on len bytes of buf; name is used in messages. */
int kw_config_load_buffer(kw_config_model *m, const char *name,
                          const char *buf, size_t len, const char *pointer,
                          char *err, size_t errlen);

/* Frees what *m owns and zeroes it.  NULL and zeroed structs are fine. */
void kw_config_model_destroy(kw_config_model *m);

/* Fields of a deployment; the names are the --deploy file's members and,
 * with '-' for '_', the flags. */
typedef enum kw_config_field {
    KW_CONFIG_DCP_WORLD,
    KW_CONFIG_DCP_RANK,
    KW_CONFIG_DCP_INTERLEAVE,
    KW_CONFIG_PCP,
    KW_CONFIG_MAX_NUM_BATCHED_TOKENS,
    KW_CONFIG_MAX_NUM_SEQS,
    KW_CONFIG_BLOCK_SIZE,
    KW_CONFIG_MAX_MODEL_LEN,
    KW_CONFIG_BLOCK_STRIDE_ROWS,
    KW_CONFIG_NUM_SPECULATIVE_TOKENS,
    KW_CONFIG_ARCH,
    KW_CONFIG_TEXT_CONFIG,
    KW_CONFIG_NFIELDS
} kw_config_field;

/* A deployment (§2).  Initialise with kw_config_deploy_init(), fill from
 * flags or a file, then kw_config_resolve() against a model.  Owns its
 * text_config string; release with kw_config_deploy_destroy(). */
typedef struct kw_config_deploy {
    int64_t dcp_world;
    int64_t dcp_rank; /* KW_CONFIG_RANK_ALL or a rank */
    int64_t dcp_interleave;
    int64_t pcp;
    int64_t max_num_batched_tokens;
    int64_t max_num_seqs;
    int64_t block_size;        /* 0 until given or resolved */
    int64_t max_model_len;     /* 0 until given or resolved */
    int64_t block_stride_rows; /* 0 until given or resolved */
    int64_t num_speculative_tokens; /* [0, 7]; next_n = 1 + this */
    char arch[KW_CONFIG_MAX_ARCH][KW_CONFIG_ARCH_LEN];
    size_t narch;
    char *text_config; /* --text-config pointer, or NULL */
    unsigned given;    /* bit (1u << kw_config_field) per field given */
    char source[256];  /* the --deploy file, "" when from flags */
} kw_config_deploy;

/* Sets the defaults of §2 (arch sm_90, rank all, ...). */
void kw_config_deploy_init(kw_config_deploy *d);

/* Frees what *d owns.  NULL is fine. */
void kw_config_deploy_destroy(kw_config_deploy *d);

/* Maps a flag ("--dcp-world") to its field; -1 when it is not one. */
int kw_config_flag_field(const char *flag);

/* Returns the flag spelling of a field ("--dcp-world"). */
const char *kw_config_field_flag(kw_config_field f);

/* Returns the snake_case name of a field ("dcp_world"). */
const char *kw_config_field_name(kw_config_field f);

/* Sets field f from a flag's value (plain decimal integers; "all" for the
 * rank; a comma-separated list for arch; a JSON pointer for text_config).
 * A field given twice is an error.  Returns 0 or KW_EDEPLOY (message in
 * err naming the flag); KW_ENOMEM. */
int kw_config_deploy_set_flag(kw_config_deploy *d, kw_config_field f,
                              const char *value, char *err, size_t errlen);

/* Reads a --deploy JSON file into d (integers by the rule of §2; unknown
 * members are errors).  Fails if any field but text_config was already
 * given by a flag.  Returns 0, KW_EDEPLOY (message names the file, and the
 * pointer where a field is at fault; an unreadable file too), or
 * KW_ENOMEM. */
int kw_config_deploy_load(kw_config_deploy *d, const char *path, char *err,
                          size_t errlen);

/* As kw_config_deploy_load() on an already parsed JSON object (a daemon
 * request's "deployment"); name stands for the file in messages. */
struct cJSON;
int kw_config_deploy_from_json(kw_config_deploy *d, const struct cJSON *obj,
                               const char *name, char *err, size_t errlen);

/* The fields given by flags or a file (d->given), as the --deploy file
 * would spell them: a new object, the caller's to cJSON_Delete(), which
 * kw_config_deploy_from_json() reads back to the same deployment (how the
 * CLI hands a deployment to kwarmd).  Returns 0 or KW_ENOMEM. */
int kw_config_deploy_given_json(const kw_config_deploy *d,
                                struct cJSON **out);

/* Applies the model-dependent defaults and cross-field rules of §2:
 * block_size, max_model_len, block_stride_rows, dcp_rank < dcp_world,
 * interleave divisibility.  Returns 0, or KW_EDEPLOY / KW_ECONFIG with a
 * message naming the flag (or file and pointer) at fault. */
int kw_config_resolve(kw_config_deploy *d, const kw_config_model *m,
                      char *err, size_t errlen);

/* The ratio lists of §4: ratios_p (every compress ratio at least 1, then
 * the kpool) and ratios_s (only those above 1).  out must hold
 * KW_CONFIG_MAX_RATIOS + 1 entries; returns how many were written. */
size_t kw_config_ratios_p(const kw_config_model *m, int64_t *out);
size_t kw_config_ratios_s(const kw_config_model *m, int64_t *out);

#endif /* KW_CONFIG_H */
