/* cli_model.c: --model, --deploy and the deployment flags, for every
 * command that derives keys. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kw_err.h"
#include "kw_parse.h"

const char kw__cli_deploy_help[] =
    "Model and deployment:\n"
    "  --model FILE               the model's config.json (flat or composite);\n"
    "                             - reads it from standard input\n"
    "  --text-config POINTER      JSON pointer of the text config (default: search\n"
    "                             thinker_config, llm_config, text_config, ...)\n"
    "  --deploy FILE              deployment as JSON (snake_case names below);\n"
    "                             not combined with the flags\n"
    "  --dcp-world N              decode-context-parallel world size (1)\n"
    "  --dcp-rank R|all           rank to warm, or every rank (all)\n"
    "  --dcp-interleave I         DCP interleave; must divide block size (1)\n"
    "  --pcp N                    prefill context parallel size (1)\n"
    "  --max-num-batched-tokens N (8192)\n"
    "  --max-num-seqs N           (256)\n"
    "  --block-size N             KV block size (64, raised for compression)\n"
    "  --max-model-len N          (max_position_embeddings)\n"
    "  --block-stride-rows N      (block size)\n"
    "  --num-speculative-tokens N decode queries per request - 1, 0..7 (0)\n"
    "  --arch LIST                comma-separated, e.g. sm_90,sm_100 (sm_90)\n";

void kw__cli_err(const char *cmd, const char *fmt, ...)
{
    char msg[2048];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(msg, sizeof msg, fmt, ap);
    va_end(ap);
    /* Errors are one line (scripts read them), whatever the input held. */
    for (char *p = msg; *p != '\0'; p++)
        if ((unsigned char)*p < 0x20 || *p == 0x7f)
            *p = '?';
    fprintf(stderr, "kwarm %s: %s\n", cmd, msg);
}

bool kw__cli_is(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

const char *kw__cli_value(const char *cmd, int argc, char **argv, int *i)
{
    const char *eq = strchr(argv[*i], '=');
    if (eq != NULL && strncmp(argv[*i], "--", 2) == 0)
        return eq + 1;
    if (*i + 1 >= argc) {
        kw__cli_err(cmd, "%s: missing value", argv[*i]);
        return NULL;
    }
    *i += 1;
    return argv[*i];
}

void kw__cli_model_init(kw__cli_model *a)
{
    memset(a, 0, sizeof *a);
    kw_config_deploy_init(&a->dep);
}

/* Copies the flag's name (up to '=') into buf for the field lookup. */
static int flag_field(const char *arg)
{
    char name[64];
    size_t n = strcspn(arg, "=");
    if (n >= sizeof name)
        return -1;
    memcpy(name, arg, n);
    name[n] = '\0';
    return kw_config_flag_field(name);
}

int kw__cli_model_arg(kw__cli_model *a, const char *cmd, int argc, char **argv,
                      int *i)
{
    const char *arg = argv[*i], *v;
    const char **slot = kw__cli_is(arg, "--model")    ? &a->model
                        : kw__cli_is(arg, "--deploy") ? &a->deploy_file
                                                      : NULL;
    int f = slot ? -1 : flag_field(arg);
    if (slot == NULL && f < 0)
        return 0;
    if ((v = kw__cli_value(cmd, argc, argv, i)) == NULL)
        return -KW_CLI_USAGE;
    if (slot != NULL) {
        if (*slot != NULL) {
            kw__cli_err(cmd, "%.*s: given more than once",
                        (int)strcspn(arg, "="), arg);
            return -KW_CLI_USAGE;
        }
        *slot = v;
        return 1;
    }
    char err[KW_CONFIG_ERRLEN];
    if (kw_config_deploy_set_flag(&a->dep, (kw_config_field)f, v, err,
                                  sizeof err) < 0) {
        kw__cli_err(cmd, "%s", err);
        return -KW_CLI_USAGE;
    }
    return 1;
}

/* The name of a config read from standard input, in messages. */
#define STDIN_NAME "<stdin>"
/* The most a config may hold: common/kw_json's limit for config files. */
#define STDIN_MAX (16u << 20)

/* Reads standard input into a->text for --model -.  Prints why not and
 * returns an exit code, else -1. */
static int read_stdin(kw__cli_model *a, const char *cmd)
{
    if (isatty(STDIN_FILENO)) {
        kw__cli_err(cmd, "--model -: standard input is a terminal; pipe or "
                    "redirect the config into it");
        return KW_CLI_USAGE;
    }
    size_t cap = 64 << 10, n = 0;
    char *buf = malloc(cap + 1);
    for (ssize_t r = 1; buf != NULL && r > 0;) {
        if (n == cap) {
            char *bigger = cap < STDIN_MAX ? realloc(buf, 2 * cap + 1) : NULL;
            if (bigger == NULL)
                break;
            buf = bigger;
            cap *= 2;
        }
        r = read(STDIN_FILENO, buf + n, cap - n);
        if (r < 0 && errno == EINTR)
            r = 1;
        else if (r > 0)
            n += (size_t)r;
        else if (r < 0) {
            kw__cli_err(cmd, "--model -: %s", strerror(errno));
            free(buf);
            return KW_CLI_USAGE;
        }
    }
    if (buf == NULL || n > STDIN_MAX || (n == cap && cap >= STDIN_MAX)) {
        kw__cli_err(cmd, "--model -: %s", buf ? "over 16 MiB, more than a "
                    "config may hold" : kw_strerror(KW_ENOMEM));
        free(buf);
        return buf ? KW_CLI_USAGE : KW_CLI_RUNTIME;
    }
    buf[n] = '\0';
    a->text = buf;
    a->text_len = n;
    return -1;
}

int kw__cli_model_load(kw__cli_model *a, const char *cmd)
{
    char err[KW_CONFIG_ERRLEN];
    int rc = 0;
    if (a->model == NULL) {
        kw__cli_err(cmd, "--model: required (see kwarm %s --help)", cmd);
        return KW_CLI_USAGE;
    }
    if (a->deploy_file != NULL)
        rc = kw_config_deploy_load(&a->dep, a->deploy_file, err, sizeof err);
    bool from_stdin = strcmp(a->model, "-") == 0;
    if (rc == 0 && from_stdin && a->text == NULL) {
        int code = read_stdin(a, cmd);
        if (code >= 0)
            return code;
    }
    if (rc == 0 && from_stdin)
        rc = kw_config_load_buffer(&a->cfg, STDIN_NAME, a->text, a->text_len,
                                   a->dep.text_config, err, sizeof err);
    else if (rc == 0)
        rc = kw_config_load(&a->cfg, a->model, a->dep.text_config, err,
                            sizeof err);
    if (rc == 0)
        rc = kw_config_resolve(&a->dep, &a->cfg, err, sizeof err);
    if (rc == KW_ENOMEM)
        snprintf(err, sizeof err, "%s", kw_strerror(rc));
    if (rc < 0) {
        kw__cli_err(cmd, "%s", err);
        return rc == KW_ENOMEM ? KW_CLI_RUNTIME : KW_CLI_USAGE;
    }
    /* An arch NVRTC cannot build would fail every key later, one compile
     * at a time, and count each as a compile failure (issue 24). */
    return kw__cli_arch_check(cmd, &a->dep) < 0 ? KW_CLI_OK : KW_CLI_USAGE;
}

void kw__cli_model_destroy(kw__cli_model *a)
{
    free(a->text);
    a->text = NULL;
    kw_config_model_destroy(&a->cfg);
    kw_config_deploy_destroy(&a->dep);
}

int kw__cli_derive(kw__cli_model *a, const char *cmd, kw_keys_set *set)
{
    char err[KW_CONFIG_ERRLEN];
    int rc = kw_keys_derive(&a->cfg, &a->dep, set, err, sizeof err);
    if (rc < 0) {
        kw__cli_err(cmd, "%s", rc == KW_ENOMEM ? kw_strerror(rc) : err);
        return rc == KW_EDEPLOY ? KW_CLI_USAGE : KW_CLI_RUNTIME;
    }
    return KW_CLI_OK;
}

int kw__cli_count(const char *cmd, int argc, char **argv, int *i,
                  const char *what, unsigned max, unsigned *out)
{
    const char *flag = argv[*i], *v = kw__cli_value(cmd, argc, argv, i);
    uint64_t x;
    if (v == NULL)
        return -1;
    if (kw_parse_u64(v, max, &x) < 0 || x == 0) {
        size_t n = strcspn(flag, "=");
        kw__cli_err(cmd, "%.*s: '%.32s' is not %s in [1, %u]", (int)n, flag, v,
                    what, max);
        return -1;
    }
    *out = (unsigned)x;
    return 0;
}

int kw__cli_jobs(const char *cmd, int argc, char **argv, int *i, unsigned *jobs)
{
    return kw__cli_count(cmd, argc, argv, i, "an integer", KW_CLI_MAX_JOBS, jobs);
}
