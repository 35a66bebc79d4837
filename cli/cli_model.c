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

void kw__cli_model_init(kw__cli_model *a)
{
    memset(a, 0, sizeof *a);
    kw_config_deploy_init(&a->dep);
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

