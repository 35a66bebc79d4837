/* cli_opt.c: the option tables of kwarm's commands (issue 24).
 *
 * Each command declares one kw__cli_cmd: its usage head, its own rows
 * (common/kw_opt.h: flag, type, bounds, field, help) and the shared groups
 * it takes (the model and deployment flags).  kw__cli_getopt parses argv
 * through getopt_long against those rows, and kw__cli_help prints --help
 * from the same rows; cli/doc/gen-cli-docs.sh makes the man page and bash
 * completion from that --help at build time.  So a flag a command takes
 * is in its help, completion and man page by construction, and every
 * bound is worded once, by kw_opt_describe.
 */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#include "kw_err.h"

/* Where the descriptions of --help start (as the texts always had). */
#define HELP_COL 29

/* The model and deployment flags of every key-deriving command.  Their
 * values are checked by jit/'s deployment rules (kw_config_deploy_set_
 * flag), which word their own messages, so they are routed, not set. */
static const kw_opt model_rows[] = {
    {.name = "model", .type = KW_OPT_TEXT, .arg = "FILE",
     .help = "the model's config.json (flat or composite);\n"
             "- reads it from standard input"},
    {.name = "text-config", .type = KW_OPT_TEXT, .arg = "POINTER",
     .help = "JSON pointer of the text config (default: search\n"
             "thinker_config, llm_config, text_config, ...)"},
    {.name = "deploy", .type = KW_OPT_TEXT, .arg = "FILE",
     .help = "deployment as JSON (snake_case names below);\n"
             "not combined with the flags"},
    {.name = "dcp-world", .type = KW_OPT_TEXT, .arg = "N",
     .help = "decode-context-parallel world size (1)"},
    {.name = "dcp-rank", .type = KW_OPT_TEXT, .arg = "R|all",
     .help = "rank to warm, or every rank (all)"},
    {.name = "dcp-interleave", .type = KW_OPT_TEXT, .arg = "I",
     .help = "DCP interleave; must divide block size (1)"},
    {.name = "pcp", .type = KW_OPT_TEXT, .arg = "N",
     .help = "prefill context parallel size (1)"},
    {.name = "max-num-batched-tokens", .type = KW_OPT_TEXT, .arg = "N",
     .help = "(8192)"},
    {.name = "max-num-seqs", .type = KW_OPT_TEXT, .arg = "N", .help = "(256)"},
    {.name = "block-size", .type = KW_OPT_TEXT, .arg = "N",
     .help = "KV block size (64, raised for compression)"},
    {.name = "max-model-len", .type = KW_OPT_TEXT, .arg = "N",
     .help = "(max_position_embeddings)"},
    {.name = "block-stride-rows", .type = KW_OPT_TEXT, .arg = "N",
     .help = "(block size)"},
    {.name = "num-speculative-tokens", .type = KW_OPT_TEXT, .arg = "N",
     .help = "decode queries per request - 1, 0..7 (0)"},
    {.name = "arch", .type = KW_OPT_TEXT, .arg = "LIST",
     .help = "comma-separated, e.g. sm_90,sm_100 (sm_90)"},
};
#define NMODEL (sizeof model_rows / sizeof model_rows[0])

static const kw_opt help_row = {.name = "help", .short_name = 'h',
                                .type = KW_OPT_SWITCH, .help = "this text"};

/* The rows of one parse: the command's, -h/--help, then the model group;
 * from[i] says which (0: the command's, 1: help, 2: model). */
typedef struct rowset {
    kw_opt r[KW_OPT_MAX];
    unsigned char from[KW_OPT_MAX];
    size_t n;
} rowset;

static void add_rows(rowset *s, const kw_opt *t, size_t n, unsigned char from)
{
    for (size_t i = 0; i < n && s->n < KW_OPT_MAX; i++) {
        s->r[s->n] = t[i];
        s->from[s->n++] = from;
    }
}

static void gather(const kw__cli_cmd *cmd, rowset *s)
{
    s->n = 0;
    add_rows(s, cmd->opts, cmd->nopts, 0);
    add_rows(s, &help_row, 1, 1);
    if (cmd->model)
        add_rows(s, model_rows, NMODEL, 2);
}

int kw__cli_help(const kw__cli_cmd *cmd)
{
    fputs(cmd->usage, stdout);
    kw_opt_help(stdout, cmd->opts, cmd->nopts, HELP_COL);
    kw_opt_help(stdout, &help_row, 1, HELP_COL);
    if (cmd->model) {
        fputs("\nModel and deployment:\n", stdout);
        kw_opt_help(stdout, model_rows, NMODEL, HELP_COL);
    }
    if (cmd->tail != NULL)
        fputs(cmd->tail, stdout);
    return KW_CLI_OK;
}

/* "unknown argument", naming the row nearest to arg when one is near. */
static int unknown(const char *cmd, const char *arg, const rowset *s)
{
    char names[KW_OPT_MAX + 4][48], name[48];
    const char *cands[KW_OPT_MAX + 4];
    size_t n = 0;
    for (size_t i = 0; i < s->n; i++) {
        snprintf(names[n], sizeof names[n], "--%s", s->r[i].name);
        cands[n] = names[n];
        n++;
    }
    snprintf(name, sizeof name, "%.*s", (int)strcspn(arg, "="), arg);
    const char *near = arg[0] == '-' ? kw_opt_nearest(name, cands, n) : NULL;
    if (near != NULL)
        kw__cli_err(cmd, "%s: unknown argument; did you mean %s? (see kwarm "
                    "%s --help)", arg, near, cmd);
    else
        kw__cli_err(cmd, "%s: unknown argument (see kwarm %s --help)", arg, cmd);
    return KW_CLI_USAGE;
}

/* Applies a model-group row: --model and --deploy once each, the rest
 * through jit/'s deployment rules.  Returns 0 or KW_CLI_USAGE. */
static int model_value(kw__cli_model *m, const char *cmd, const char *name,
                       const char *v)
{
    const char **slot = strcmp(name, "model") == 0    ? &m->model
                        : strcmp(name, "deploy") == 0 ? &m->deploy_file
                                                      : NULL;
    if (slot != NULL && *slot != NULL) {
        kw__cli_err(cmd, "--%s: given more than once", name);
        return KW_CLI_USAGE;
    }
    if (slot != NULL) {
        *slot = v;
        return 0;
    }
    char flag[64], err[KW_CONFIG_ERRLEN];
    snprintf(flag, sizeof flag, "--%s", name);
    int f = kw_config_flag_field(flag);
    if (f < 0 || kw_config_deploy_set_flag(&m->dep, (kw_config_field)f, v, err,
                                           sizeof err) < 0) {
        kw__cli_err(cmd, "%s", f < 0 ? "unknown deployment flag" : err);
        return KW_CLI_USAGE;
    }
    return 0;
}

/* Applies row r of s with value v (NULL for a switch).  Returns -1 to go
 * on, else the exit code after printing why. */
static int apply(const kw__cli_cmd *cmd, const rowset *s, size_t r,
                 const char *v, void *opts, kw__cli_model *m)
{
    const kw_opt *o = &s->r[r];
    if (s->from[r] == 1)
        return kw__cli_help(cmd);
    if (s->from[r] == 2)
        return model_value(m, cmd->name, o->name, v) == 0 ? -1 : KW_CLI_USAGE;
    if (kw_opt_set(o, opts, o->type == KW_OPT_SWITCH ? "true" : v) == 0)
        return -1;
    char what[160];
    kw_opt_describe(o, what, sizeof what);
    kw__cli_err(cmd->name, "--%s: '%.32s' is not %s", o->name, v, what);
    return KW_CLI_USAGE;
}

int kw__cli_getopt(const kw__cli_cmd *cmd, int argc, char **argv, void *opts,
                   kw__cli_model *m, const char **pos, size_t npos)
{
    rowset s;
    gather(cmd, &s);
    bool seen[KW_OPT_MAX] = {0};
    size_t got = 0;
    kw_opt_parser p;
    if (kw_opt_parser_init(&p, s.r, s.n, argc, argv) < 0)
        return KW_CLI_RUNTIME;
    const char *v;
    for (int r; (r = kw_opt_next(&p, &v)) != KW_OPT_END;) {
        if (r == KW_OPT_POSITIONAL && got < npos) {
            pos[got++] = v;
            continue;
        }
        if (r == KW_OPT_POSITIONAL || r == KW_OPT_UNKNOWN)
            return unknown(cmd->name, r == KW_OPT_UNKNOWN ? p.bad : v, &s);
        if (r < 0) {
            kw__cli_err(cmd->name, "%s: %s (see kwarm %s --help)", p.bad,
                        r == KW_OPT_MISSING ? "missing value" : "takes no value",
                        cmd->name);
            return KW_CLI_USAGE;
        }
        /* A value given twice would leave one of them unused. */
        if (seen[r] && s.r[r].type != KW_OPT_SWITCH) {
            kw__cli_err(cmd->name, "--%s: given more than once", s.r[r].name);
            return KW_CLI_USAGE;
        }
        seen[r] = true;
        int rc = apply(cmd, &s, (size_t)r, v, opts, m);
        if (rc >= 0)
            return rc;
    }
    return -1;
}
