/* cli_warmup.c: `kwarm warmup`, a running kwarmd asked to compile every
 * missing key of a model and deployment, with progress, each failure's
 * NVRTC log and the counts at the end. */
#include "cli.h"

#include <errno.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kw_client.h"
#include "kw_err.h"
#include "kw_proto.h"

/* A warmup's wait for its next frame (--wait-timeout): kwarmd sends one
 * at least every 2 s while a warmup runs (a heartbeat while compiles are
 * slow), so a minute of silence means kwarmd is stuck, not busy. */
#define CLI_WAIT_S 60
#define CLI_WAIT_MAX_S 86400

/* ---- warmup -------------------------------------------------------------- */

typedef struct warm_opts {
    kw__cli_model a;
    const char *socket, *pin;
    bool json, quiet, detach;
    unsigned wait_s; /* --wait-timeout */
} warm_opts;

static const kw_opt warmup_rows[] = {
    KW__CLI_SWITCH(warm_opts, json, "json",
                   "one document: keys, hits, remote_hits,\n"
                   "compiled, failed, cancelled, seconds and\n"
                   "the manifest (every key's result)"),
    KW__CLI_SWITCH(warm_opts, quiet, "quiet", "no progress on stderr"),
    KW__CLI_TEXT(warm_opts, pin, "pin", "NAME",
                 "once every key is cached, keep the\n"
                 "deployment's entries as the pin set NAME\n"
                 "(never evicted until kwarm unpin NAME)"),
    {.name = "wait-timeout", .type = KW_OPT_UINT, .arg = "S",
     .unit = "a number of seconds", .min = 1, .max = CLI_WAIT_MAX_S,
     .off = offsetof(warm_opts, wait_s), .size = sizeof(unsigned),
     .help = "give up when kwarmd sends nothing for S\n"
             "seconds (60); it sends a frame at least\n"
             "every 2 s while it works"},
    KW__CLI_SWITCH(warm_opts, detach, "detach",
                   "return once kwarmd has accepted the warmup:\n"
                   "it goes on compiling after this client leaves\n"
                   "(kwarm stats and kwarmd's log tell the outcome);\n"
                   "without it, a client that leaves cancels them"),
    KW__CLI_SOCKET_ROW(warm_opts, socket),
};

static const kw__cli_cmd warmup_cmd = {
    .name = "warmup",
    .usage = "usage: kwarm warmup --model CONFIG.json [DEPLOYMENT] [--socket PATH] "
             "[--json]\n"
             "                    [--quiet] [--pin NAME] [--wait-timeout S] [--detach]\n"
             "\n"
             "Asks a running kwarmd to compile every key of this model and deployment\n"
             "that its cache lacks, showing progress and each failed key's NVRTC log;\n"
             "exit 1 when a key failed, kwarmd stopped before the end, or it sent\n"
             "nothing for --wait-timeout.\n"
             "\n",
    KW__CLI_ROWS(warmup_rows),
    .model = true,
};

/* The deployment kwarmd should use: every field the flags or --deploy
 * gave (their values survive kw_config_resolve()), as a --deploy file
 * would spell them, so the daemon applies the same defaults kwarm keys
 * would.  A new string (free it), or NULL. */
static char *deploy_json(const kw_config_deploy *d)
{
    cJSON *obj = NULL;
    if (kw_config_deploy_given_json(d, &obj) < 0)
        return NULL;
    char *s = cJSON_PrintUnformatted(obj);
    cJSON_Delete(obj);
    return s;
}

/* Reads the config file as text for the request (kwarmd takes a config of
 * at most one protocol header).  Returns -1 to go on, else an exit code. */
static int read_config(const char *path, char **text)
{
    FILE *f = fopen(path, "rb");
    char *buf = malloc(KW_PROTO_MAX_HEADER + 2);
    size_t n = f && buf ? fread(buf, 1, KW_PROTO_MAX_HEADER + 1, f) : 0;
    int rc = -1;
    if (f == NULL || buf == NULL || ferror(f)) {
        kw__cli_err("warmup", "%s: %s", path, buf ? strerror(errno ? errno : EIO)
                                                  : kw_strerror(KW_ENOMEM));
        rc = buf ? KW_CLI_USAGE : KW_CLI_RUNTIME;
    } else if (n > KW_PROTO_MAX_HEADER) {
        kw__cli_err("warmup", "%s: over %u bytes, more than a kwarmd request "
                    "holds (use kwarm prewarm)", path, KW_PROTO_MAX_HEADER);
        rc = KW_CLI_USAGE;
    }
    if (f != NULL)
        fclose(f);
    if (rc >= 0) {
        free(buf);
        return rc;
    }
    buf[n] = '\0';
    *text = buf;
    return -1;
}

/* The config --model - read, as the request's text (*text, free it):
 * within one protocol header, as read_config() checks a file.  Returns
 * -1 to go on, else an exit code. */
static int stdin_config(const kw__cli_model *a, char **text)
{
    if (a->text_len > KW_PROTO_MAX_HEADER) {
        kw__cli_err("warmup", "--model -: over %u bytes, more than a kwarmd "
                    "request holds (use kwarm prewarm)", KW_PROTO_MAX_HEADER);
        return KW_CLI_USAGE;
    }
    if ((*text = strdup(a->text)) == NULL) {
        kw__cli_err("warmup", "%s", kw_strerror(KW_ENOMEM));
        return KW_CLI_RUNTIME;
    }
    return -1;
}

/* What a warmup shows while it runs (arg of on_progress). */
typedef struct warm_view {
    kw__cli_progress progress;
    kw__cli_tally tally;  /* the results so far, by status */
    size_t failed_shown;
    size_t read_only;     /* failed as "not cached (read-only cache)" */
    size_t unstored;      /* compiled, not stored: kwarmd's disk is full */
    char unstored_why[512]; /* the first one's reason */
} warm_view;

#define KW_CLI_MAX_FAILS 5 /* failures printed in full */

/* True when a failed result is a read-only kwarmd's miss: nothing was
 * compiled, so it is not printed as a compile failure. */
static bool read_only_miss(const char *error)
{
    return error != NULL && strcmp(error, kw_strerror(KW_EROFS)) == 0;
}

/* Counts one result by status; prints it when it is one of the first
 * KW_CLI_MAX_FAILS compile failures of the warmup, with its NVRTC log. */
static void tally_result(const cJSON *k, warm_view *v)
{
    const char *st = cJSON_GetStringValue(
        cJSON_GetObjectItemCaseSensitive(k, "status"));
    const char *f[5] = {"family", "arch", "digest", "error", "log"}, *s[5];
    if (st == NULL)
        return;
    if (strcmp(st, "hit") == 0 || strcmp(st, "remote_hit") == 0)
        v->tally.hits++;
    else if (strcmp(st, "compiled") == 0)
        v->tally.compiled++;
    else if (strcmp(st, "cancelled") == 0)
        v->tally.cancelled++;
    if (strcmp(st, "failed") != 0)
        return;
    v->tally.failed++;
    for (size_t i = 0; i < 5; i++)
        s[i] = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(k, f[i]));
    if (read_only_miss(s[3])) {
        v->read_only++;
        return;
    }
    if (s[3] != NULL && strcmp(s[3], kw_strerror(KW_EDISKFULL)) == 0) {
        if (v->unstored++ == 0) /* one cause: said once (print_result) */
            snprintf(v->unstored_why, sizeof v->unstored_why, "%s",
                     s[4] ? s[4] : s[3]);
        return;
    }
    if (v->failed_shown++ < KW_CLI_MAX_FAILS)
        kw__cli_print_failure("warmup", s[0] ? s[0] : "?", s[1] ? s[1] : "?",
                              s[2] ? s[2] : "?", s[3] ? s[3] : "failed", s[4]);
}

/* One PROGRESS frame: its results counted (failures in full), then the
 * progress display. */
static void on_progress(const char *progress_json, void *arg)
{
    warm_view *v = arg;
    cJSON *p = cJSON_Parse(progress_json);
    const cJSON *done = cJSON_GetObjectItemCaseSensitive(p, "done");
    const cJSON *total = cJSON_GetObjectItemCaseSensitive(p, "total");
    const cJSON *k;
    cJSON_ArrayForEach(k, cJSON_GetObjectItemCaseSensitive(p, "results"))
        tally_result(k, v);
    if (cJSON_IsNumber(done) && cJSON_IsNumber(total))
        kw__cli_progress_show(&v->progress, (size_t)done->valuedouble,
                              (size_t)total->valuedouble, &v->tally);
    cJSON_Delete(p);
}

/* Returns member name of obj as a count (0 when missing). */
static size_t count_of(const cJSON *obj, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(obj, name);
    return cJSON_IsNumber(v) && v->valuedouble > 0 ? (size_t)v->valuedouble : 0;
}

/* Prints a warmup's result; returns 1 when a key failed or was cancelled,
 * else 0. */
static int print_result(const char *json, const warm_opts *o, const char *path,
                        const warm_view *v)
{
    cJSON *res = cJSON_Parse(json);
    size_t failed = count_of(res, "failed"), cancelled = count_of(res, "cancelled");
    size_t ro = v->read_only <= failed ? v->read_only : failed;
    size_t unstored = v->unstored <= failed - ro ? v->unstored : failed - ro;
    size_t compile_failed = failed - ro - unstored;
    if (o->json) {
        printf("%s\n", json);
    } else {
        const cJSON *secs = cJSON_GetObjectItemCaseSensitive(res, "seconds");
        printf("warmup: %zu keys: %zu compiled, %zu hits, %zu remote hits, "
               "%zu failed, %zu cancelled in %.2f s (kwarmd at %s)\n",
               count_of(res, "keys"), count_of(res, "compiled"),
               count_of(res, "hits"), count_of(res, "remote_hits"), failed,
               cancelled, cJSON_IsNumber(secs) ? secs->valuedouble : 0.0, path);
    }
    if (ro > 0)
        kw__cli_err("warmup", "%zu key%s not cached: kwarmd's cache is "
                    "read-only and compiles nothing (warm the cache with kwarm "
                    "prewarm, or through a kwarmd that can write it)", ro,
                    ro == 1 ? "" : "s");
    if (unstored > 0) /* "store: " is the stage: the line says so */
        kw__cli_err("warmup", "%zu keys compiled but not stored: %s", unstored,
                    v->unstored_why + (strncmp(v->unstored_why, "store: ", 7)
                                           ? 0 : 7));
    if (compile_failed > 0)
        kw__cli_err("warmup", "%zu key%s failed to compile (%s shown above)",
                    compile_failed, compile_failed == 1 ? "" : "s",
                    compile_failed > KW_CLI_MAX_FAILS ? "the first 5" : "all");
    if (cancelled > 0)
        kw__cli_err("warmup", "kwarmd stopped: %zu of %zu keys cancelled",
                    cancelled, count_of(res, "keys"));
    const cJSON *pinned = cJSON_GetObjectItemCaseSensitive(res, "pinned");
    if (cJSON_IsFalse(pinned))
        kw__cli_err("warmup", "--pin %s: not recorded (%s)", o->pin,
                    failed || cancelled ? "keys are missing" : "see kwarmd's log");
    cJSON_Delete(res);
    return failed > 0 || cancelled > 0 || cJSON_IsFalse(pinned) ? KW_CLI_RUNTIME
                                                                 : KW_CLI_OK;
}

/* --detach: the warmup is handed to kwarmd; prints what it accepted
 * (--json: its first frame as is). */
static int detach_run(kw_client *c, const warm_opts *o, const char *config,
                      const char *dep, const char *name)
{
    char *first = NULL;
    int rc = kw_client_warmup_detached(c, config, dep, name, o->pin, &first);
    if (rc < 0)
        return kw__cli_request_failed("warmup", c, rc);
    cJSON *doc = cJSON_Parse(first);
    const cJSON *total = cJSON_GetObjectItemCaseSensitive(doc, "total");
    if (total == NULL) /* a RESULT: it ended at once */
        total = cJSON_GetObjectItemCaseSensitive(doc, "keys");
    if (o->json)
        printf("%s\n", first);
    else
        printf("warmup: detached: kwarmd at %s is warming %.0f keys%s%s; kwarm "
               "stats and its log tell the outcome\n", kw_client_path(c),
               cJSON_GetNumberValue(total) > 0 ? cJSON_GetNumberValue(total) : 0,
               o->pin ? ", then pins them as " : "", o->pin ? o->pin : "");
    cJSON_Delete(doc);
    free(first);
    return KW_CLI_OK;
}

/* Sends the warmup of the loaded model in o; prints its outcome. */
static int warmup_run(warm_opts *o, const char *config, const char *dep)
{
    kw_client *c = NULL;
    char *result = NULL;
    warm_view v = {.failed_shown = 0};
    kw__cli_progress_init(&v.progress, "warmup", o->quiet);
    int rc = kw__cli_connect("warmup", o->socket, KW_CLI_TIMEOUT_MS, &c);
    if (rc != KW_CLI_OK)
        return rc;
    kw_client_set_timeout(c, (int)(o->wait_s * 1000));
    const char *name = o->a.text ? "stdin" : o->a.model;
    if (o->detach) {
        rc = detach_run(c, o, config, dep, name);
        kw_client_close(c);
        return rc;
    }
    rc = o->pin ? kw_client_warmup_pin(c, config, dep, name, o->pin,
                                       on_progress, &v, &result)
                : kw_client_warmup(c, config, dep, name, on_progress, &v,
                                   &result);
    if (rc == -ETIMEDOUT)
        kw__cli_err("warmup", "kwarmd at %s sent nothing for %u s, not even the "
                    "heartbeat it sends every 2 s: it looks stuck (see its log)",
                    kw_client_path(c), o->wait_s);
    if (rc < 0)
        rc = kw__cli_request_failed("warmup", c, rc);
    else
        rc = print_result(result, o, kw_client_path(c), &v);
    free(result);
    kw_client_close(c);
    return rc;
}

/* Parses warmup's arguments; returns -1 to go on, else an exit code. */
static int warmup_parse(warm_opts *o, int argc, char **argv)
{
    int rc = kw__cli_getopt(&warmup_cmd, argc, argv, o, &o->a, NULL, 0);
    if (rc >= 0)
        return rc;
    return kw__cli_pin_check("warmup", o->pin); /* before kwarmd works */
}

int kw__cli_warmup(int argc, char **argv)
{
    warm_opts o = {.socket = NULL, .pin = NULL, .json = false, .quiet = false,
                   .wait_s = CLI_WAIT_S};
    char *config = NULL, *dep = NULL;
    kw__cli_model_init(&o.a);
    int rc = warmup_parse(&o, argc, argv);
    /* Load locally first: bad input gets kwarm keys' exact message and
     * exit 2 without a daemon in the loop. */
    if (rc < 0 && (rc = kw__cli_model_load(&o.a, "warmup")) == KW_CLI_OK)
        rc = o.a.text ? stdin_config(&o.a, &config)
                      : read_config(o.a.model, &config);
    if (rc < 0 && (dep = deploy_json(&o.a.dep)) == NULL) {
        kw__cli_err("warmup", "%s", kw_strerror(KW_ENOMEM));
        rc = KW_CLI_RUNTIME;
    }
    if (rc < 0)
        rc = warmup_run(&o, config, dep);
    free(dep);
    free(config);
    kw__cli_model_destroy(&o.a);
    return rc;
}
