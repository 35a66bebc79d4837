/* cli_daemon.c: the commands that talk to a running kwarmd through
 * libkwarm: `kwarm ping`, `kwarm warmup`, and the --socket forms of
 * `kwarm get` and `kwarm stats` (cli_cache.c's commands hand those over
 * when no --cache is given).
 */
#include "cli.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cjson/cJSON.h>

#include "kw_client.h"
#include "kw_err.h"
#include "kw_launch.h"
#include "kw_parse.h"
#include "kw_proto.h"

/* Bounds the connect, and every wait of the short requests (ping, stats).
 * Compiling gets then wait as long as a compile takes. */
#define CLI_TIMEOUT_MS 10000
/* A warmup's wait for its next frame (--wait-timeout): kwarmd sends one
 * at least every 2 s while a warmup runs (a heartbeat while compiles are
 * slow), so a minute of silence means kwarmd is stuck, not busy. */
#define CLI_WAIT_S 60
#define CLI_WAIT_MAX_S 86400

static const char socket_help[] =
    "  --socket PATH              kwarmd's socket ($KWARM_SOCKET, else\n"
    "                             $XDG_RUNTIME_DIR/kwarm.sock, or\n"
    "                             /run/kwarm/kwarm.sock for root)\n";

static const char ping_usage[] =
    "usage: kwarm ping [--socket PATH]\n"
    "\n"
    "Asks kwarmd for its version; exit 1 when it cannot be reached.\n"
    "\n";

static const char warmup_usage[] =
    "usage: kwarm warmup --model CONFIG.json [DEPLOYMENT] [--socket PATH] "
    "[--json]\n"
    "                    [--quiet] [--pin NAME] [--wait-timeout S]\n"
    "\n"
    "Asks a running kwarmd to compile every key of this model and deployment\n"
    "that its cache lacks, showing progress and each failed key's NVRTC log;\n"
    "exit 1 when a key failed, kwarmd stopped before the end, or it sent\n"
    "nothing for --wait-timeout.\n"
    "\n"
    "  --json                     one document: keys, hits, remote_hits,\n"
    "                             compiled, failed, cancelled, seconds and\n"
    "                             the manifest (every key's result)\n"
    "  --quiet                    no progress on stderr\n"
    "  --pin NAME                 once every key is cached, keep the\n"
    "                             deployment's entries as the pin set NAME\n"
    "                             (never evicted until kwarm unpin NAME)\n"
    "  --wait-timeout S           give up when kwarmd sends nothing for S\n"
    "                             seconds, in [1, 86400] (60); it sends a\n"
    "                             frame at least every 2 s while it works\n";

static const char get_usage[] =
    "usage: kwarm get (--digest HEX | --family F --fields k=v,... --arch sm_XX)\n"
    "                 -o FILE [--socket PATH] [--no-compile]\n"
    "\n"
    "Fetches one cubin from kwarmd and writes it to FILE (atomically).  A key\n"
    "given by family, fields and arch is compiled on a miss unless\n"
    "--no-compile; a digest is only looked up.  Exit 1 when it is not there.\n"
    "\n";

static const char stats_usage[] =
    "usage: kwarm stats [--socket PATH] [--json | --prometheus]\n"
    "\n"
    "Prints kwarmd's cache statistics (entries, bytes, max_size, hits, misses,\n"
    "compiles, compile_failures, evictions, corrupt) and its own counters.\n"
    "\n"
    "  --json                     one JSON object with those fields\n"
    "  --prometheus               the text kwarmd --metrics-listen serves\n";

static const char help_tail[] = "  -h, --help                 this text\n";

/* ---- shared ------------------------------------------------------------- */

static bool is_help(const char *arg)
{
    return strcmp(arg, "-h") == 0 || strcmp(arg, "--help") == 0;
}

/* Prints a command's usage (with the --socket line) on stdout. */
static int print_usage(const char *usage, bool model)
{
    printf("%s%s%s%s", usage, socket_help, help_tail,
           model ? "\n" : "");
    if (model)
        fputs(kw__cli_deploy_help, stdout);
    return KW_CLI_OK;
}

/* The exit code of a failed request: 2 when the input was at fault (the
 * daemon refused the model, deployment, key or an ambiguous digest
 * prefix, as --cache does), else 1. */
static int exit_for(int rc)
{
    switch (rc) {
    case KW_EINVAL: case KW_EJSON: case KW_ECONFIG: case KW_EDEPLOY:
    case KW_ENOFAMILY: case KW_E2BIG: case KW_EAMBIGUOUS: case -ENAMETOOLONG:
        return KW_CLI_USAGE;
    default:
        return KW_CLI_RUNTIME;
    }
}

int kw__cli_connect(const char *cmd, const char *path, int timeout_ms,
                    kw_client **c)
{
    char err[512], def[KW_CLIENT_PATH_MAX];
    const char *p = path ? path : kw_client_default_socket(def, sizeof def);
    struct stat st;
    /* Something that is not a socket: connect() would say "Connection
     * refused", which sends one looking for a stopped daemon. */
    if (p != NULL && stat(p, &st) == 0 && !S_ISSOCK(st.st_mode)) {
        kw__cli_err(cmd, "cannot reach kwarmd: %s: not a socket%s", p,
                    S_ISDIR(st.st_mode) ? " (a directory: name the socket "
                                          "file in it)" : "");
        return KW_CLI_USAGE;
    }
    int rc = kw_client_connect(c, path, timeout_ms, err, sizeof err);
    if (rc == -ENOENT || rc == -ECONNREFUSED) {
        kw__cli_err(cmd, "cannot reach kwarmd: %s; is it running? Start one "
                    "with kwarmd --socket %s --cache DIR, or systemctl start "
                    "kwarmd.socket; or name another with --socket or "
                    "$KWARM_SOCKET", err, p ? p : "PATH");
        return KW_CLI_RUNTIME;
    }
    if (rc < 0) {
        kw__cli_err(cmd, "cannot reach kwarmd: %s", err);
        return exit_for(rc);
    }
    return KW_CLI_OK;
}

/* Connects to path (NULL: the default) for a short request. */
static int connect_to(const char *cmd, const char *path, kw_client **c)
{
    return kw__cli_connect(cmd, path, CLI_TIMEOUT_MS, c);
}

/* Prints the failure of a request on c; returns its exit code. */
static int request_failed(const char *cmd, const kw_client *c, int rc)
{
    kw__cli_err(cmd, "%s", kw_client_last_error(c));
    return exit_for(rc);
}

/* Reads --socket's value at argv[*i] into *path.  1 when argv[*i] is
 * --socket, 0 when not, -KW_CLI_USAGE after printing the error. */
static int socket_arg(const char *cmd, int argc, char **argv, int *i,
                      const char **path)
{
    if (!kw__cli_is(argv[*i], "--socket"))
        return 0;
    if (*path != NULL) {
        kw__cli_err(cmd, "--socket: given more than once");
        return -KW_CLI_USAGE;
    }
    *path = kw__cli_value(cmd, argc, argv, i);
    return *path != NULL ? 1 : -KW_CLI_USAGE;
}

/* Prints "unknown argument" for cmd, with the nearest flag of its help
 * (usage, and the --socket lines all three take); returns KW_CLI_USAGE. */
static int unknown_arg(const char *cmd, const char *arg, const char *usage)
{
    return kw__cli_unknown(cmd, arg, usage, socket_help);
}

/* ---- ping ---------------------------------------------------------------- */

int kw__cli_ping(int argc, char **argv)
{
    const char *path = NULL;
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i]))
            return print_usage(ping_usage, false);
        int rc = socket_arg("ping", argc, argv, &i, &path);
        if (rc < 0)
            return -rc;
        if (rc == 0)
            return unknown_arg("ping", argv[i], ping_usage);
    }
    kw_client *c = NULL;
    char version[64];
    int rc = connect_to("ping", path, &c);
    if (rc != KW_CLI_OK)
        return rc;
    if ((rc = kw_client_ping(c, version, sizeof version)) < 0)
        rc = request_failed("ping", c, rc);
    else
        printf("kwarmd %s at %s\n", version, kw_client_path(c));
    kw_client_close(c);
    return rc;
}

/* ---- stats --------------------------------------------------------------- */

/* Prints a stats reply as "name value" lines under "kwarmd PATH", in the
 * layout of the cache's stats. */
static void print_stats(const char *json, const char *path)
{
    cJSON *st = cJSON_Parse(json);
    int w = 17; /* the widest name, so the values line up */
    for (const cJSON *it = st ? st->child : NULL; it != NULL; it = it->next)
        if (cJSON_IsNumber(it) && (int)strlen(it->string) > w)
            w = (int)strlen(it->string);
    printf("kwarmd %s\n", path);
    for (const cJSON *it = st ? st->child : NULL; it != NULL; it = it->next)
        if (cJSON_IsNumber(it))
            printf("  %-*s %.0f\n", w, it->string, it->valuedouble);
        else if (cJSON_IsBool(it)) /* read_only, as stats --cache prints it */
            printf("  %-*s %s\n", w, it->string, cJSON_IsTrue(it) ? "true"
                                                                  : "false");
    cJSON_Delete(st);
}

/* Prints a stats reply: its "prometheus" text (exit 1 when kwarmd is too
 * old to send one), else the JSON without it, else "name value" lines. */
static int print_reply(const char *json, const char *path, int form)
{
    cJSON *st = cJSON_Parse(json);
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(st, "prometheus");
    char *out = NULL;
    int rc = KW_CLI_OK;
    if (form == 2 && cJSON_IsString(text)) {
        fputs(text->valuestring, stdout);
    } else if (form == 2) {
        fprintf(stderr, "kwarm stats: kwarmd at %s sends no Prometheus text "
                "(older than --prometheus)\n", path);
        rc = KW_CLI_RUNTIME;
    } else if (form == 1) {
        cJSON_DeleteItemFromObjectCaseSensitive(st, "prometheus");
        out = st ? cJSON_PrintUnformatted(st) : NULL;
        printf("%s\n", out ? out : json);
    } else {
        print_stats(json, path);
    }
    free(out);
    cJSON_Delete(st);
    return rc;
}

int kw__cli_stats_socket(int argc, char **argv)
{
    const char *path = NULL;
    int form = 0; /* lines, 1 --json, 2 --prometheus */
    for (int i = 1; i < argc; i++) {
        if (is_help(argv[i]))
            return print_usage(stats_usage, false);
        if (strcmp(argv[i], "--json") == 0 || strcmp(argv[i], "--prometheus") == 0) {
            int f = argv[i][2] == 'j' ? 1 : 2;
            if (form != 0 && form != f) {
                kw__cli_err("stats", "--json and --prometheus: give one (two "
                            "forms of the same counters)");
                return KW_CLI_USAGE;
            }
            form = f;
            continue;
        }
        int rc = socket_arg("stats", argc, argv, &i, &path);
        if (rc < 0)
            return -rc;
        if (rc == 0)
            return unknown_arg("stats", argv[i], stats_usage);
    }
    kw_client *c = NULL;
    char *reply = NULL;
    int rc = connect_to("stats", path, &c);
    if (rc != KW_CLI_OK)
        return rc;
    if ((rc = kw_client_stats(c, &reply)) < 0)
        rc = request_failed("stats", c, rc);
    else
        rc = print_reply(reply, kw_client_path(c), form);
    free(reply);
    kw_client_close(c);
    return rc;
}

/* ---- get ----------------------------------------------------------------- */

typedef kw__cli_get_opts get_opts; /* where: the --socket path */

/* Adds "name=value" of family f to obj: an integer, or true/false for a
 * boolean field.  Returns 0, or -1 after printing the error. */
static int add_field(cJSON *obj, kw_k_family f, unsigned *seen,
                     int64_t *vals, const char *name, const char *v)
{
    size_t i = 0, n = kw_keys_nfields(f);
    while (i < n && strcmp(kw_keys_field_name(f, i), name) != 0)
        i++;
    if (i == n) {
        kw__cli_err("get", "--fields: %.48s is not a field of %s", name,
                    kw_keys_family_name(f));
        return -1;
    }
    if (*seen & (1u << i)) {
        kw__cli_err("get", "--fields: %s given twice", name);
        return -1;
    }
    *seen |= 1u << i;
    bool is_bool = kw_keys_field_is_bool(f, i);
    int64_t x;
    if (is_bool && (strcmp(v, "true") == 0 || strcmp(v, "false") == 0))
        cJSON_AddBoolToObject(obj, name, (vals[i] = v[0] == 't'));
    else if (kw_parse_i64(v, -(INT64_C(1) << 53), INT64_C(1) << 53, &x) == 0)
        cJSON_AddNumberToObject(obj, name, (double)(vals[i] = x));
    else {
        kw__cli_err("get", "--fields: %s: '%.32s' is not an integer%s", name,
                    v, is_bool ? " or true/false" : "");
        return -1;
    }
    return 0;
}

/* Splits "k=v,..." into the fields of family f, each checked, into obj;
 * then the key as a whole, by launch/'s rules, before kwarmd sees it. */
static int add_fields(cJSON *obj, kw_k_family f, char *list)
{
    unsigned seen = 0;
    int64_t vals[KW_LAUNCH_MAX_FIELDS] = {0};
    for (char *save = NULL, *kv = strtok_r(list, ",", &save); kv != NULL;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        if (eq == NULL) {
            kw__cli_err("get", "--fields: '%.48s' is not name=value", kv);
            return -1;
        }
        *eq = '\0';
        if (add_field(obj, f, &seen, vals, kv, eq + 1) < 0)
            return -1;
    }
    for (size_t i = 0; i < kw_keys_nfields(f); i++)
        if (!(seen & (1u << i))) {
            kw__cli_err("get", "--fields: %s missing (a %s key has %zu "
                        "fields)", kw_keys_field_name(f, i),
                        kw_keys_family_name(f), kw_keys_nfields(f));
            return -1;
        }
    return kw__cli_fields_check("get", (int)f, vals) < 0 ? 0 : -1;
}

/* Turns --family/--fields into the JSON object kwarmd takes (*json, free
 * it).  Returns -1 to go on, else an exit code after printing why. */
static int fields_json(const get_opts *o, char **json)
{
    kw_k_family f;
    if (kw_keys_family_from_name(o->family, &f) < 0) {
        kw__cli_err("get", "--family: '%.48s' is not a kernel family",
                    o->family);
        return KW_CLI_USAGE;
    }
    if (kw__cli_arch_one("get", o->arch) >= 0)
        return KW_CLI_USAGE;
    char *list = strdup(o->fields);
    cJSON *obj = cJSON_CreateObject();
    int rc = list && obj ? add_fields(obj, f, list) : -2;
    if (rc == 0 && (*json = cJSON_PrintUnformatted(obj)) == NULL)
        rc = -2;
    if (rc == -2)
        kw__cli_err("get", "%s", kw_strerror(KW_ENOMEM));
    free(list);
    cJSON_Delete(obj);
    return rc == 0 ? -1 : rc == -1 ? KW_CLI_USAGE : KW_CLI_RUNTIME;
}

/* Fetches the kernel of o (fields: its --fields as JSON, checked) from c
 * into *k; prints the failure. */
static int get_fetch(const get_opts *o, const char *fields, kw_client *c,
                     kw_client_kernel *k)
{
    int rc;
    if (o->digest != NULL) {
        rc = kw_client_get(c, o->digest, !o->no_compile, k);
    } else {
        kw_client_set_timeout(c, 0); /* a compile takes what it takes */
        rc = kw_client_get_key(c, o->family, fields, o->arch,
                               !o->no_compile, k);
    }
    if (rc == KW_ENOTFOUND) {
        kw__cli_err("get", "%s: not cached in kwarmd at %s",
                    o->digest ? o->digest : o->family, kw_client_path(c));
        return KW_CLI_RUNTIME;
    }
    return rc < 0 ? request_failed("get", c, rc) : KW_CLI_OK;
}

int kw__cli_get_socket(int argc, char **argv)
{
    get_opts o;
    if (kw__cli_wants_help(argc, argv))
        return print_usage(get_usage, false);
    int rc = kw__cli_get_parse(&o, argc, argv, "--socket");
    if (rc >= 0)
        return rc;
    size_t dl = o.digest ? strlen(o.digest) : 0;
    if (o.digest != NULL && (dl < 8 || dl > 64 ||
                             strspn(o.digest, "0123456789abcdefABCDEF") != dl)) {
        kw__cli_err("get", "--digest: '%.64s' is not 64 hex digits nor a prefix "
                    "of at least 8", o.digest);
        return KW_CLI_USAGE;
    }
    kw_client *c = NULL;
    kw_client_kernel k = {0};
    char *fields = NULL; /* checked here, before kwarmd sees the key */
    if (o.digest == NULL && (rc = fields_json(&o, &fields)) >= 0)
        return rc;
    if ((rc = connect_to("get", o.where, &c)) == KW_CLI_OK &&
        (rc = get_fetch(&o, fields, c, &k)) == KW_CLI_OK)
        rc = kw__cli_put_cubin("get", o.out, k.cubin, k.len, k.family,
                               k.arch, k.entry);
    free(fields);
    kw_client_kernel_destroy(&k);
    kw_client_close(c);
    return rc;
}

/* ---- warmup -------------------------------------------------------------- */

typedef struct warm_opts {
    kw__cli_model a;
    const char *socket, *pin;
    bool json, quiet;
    unsigned wait_s; /* --wait-timeout */
} warm_opts;

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
    size_t compile_failed = failed - ro;
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

/* Sends the warmup of the loaded model in o; prints its outcome. */
static int warmup_run(warm_opts *o, const char *config, const char *dep)
{
    kw_client *c = NULL;
    char *result = NULL;
    warm_view v = {.failed_shown = 0};
    kw__cli_progress_init(&v.progress, "warmup", o->quiet);
    int rc = connect_to("warmup", o->socket, &c);
    if (rc != KW_CLI_OK)
        return rc;
    kw_client_set_timeout(c, (int)(o->wait_s * 1000));
    const char *name = o->a.text ? "stdin" : o->a.model;
    rc = o->pin ? kw_client_warmup_pin(c, config, dep, name, o->pin,
                                       on_progress, &v, &result)
                : kw_client_warmup(c, config, dep, name, on_progress, &v,
                                   &result);
    if (rc == -ETIMEDOUT)
        kw__cli_err("warmup", "kwarmd at %s sent nothing for %u s, not even the "
                    "heartbeat it sends every 2 s: it looks stuck (see its log)",
                    kw_client_path(c), o->wait_s);
    if (rc < 0)
        rc = request_failed("warmup", c, rc);
    else
        rc = print_result(result, o, kw_client_path(c), &v);
    free(result);
    kw_client_close(c);
    return rc;
}

/* Parses warmup's arguments; returns -1 to go on, else an exit code. */
static int warmup_parse(warm_opts *o, int argc, char **argv)
{
    for (int i = 1; i < argc; i++) {
        int rc = kw__cli_model_arg(&o->a, "warmup", argc, argv, &i);
        if (rc == 0)
            rc = socket_arg("warmup", argc, argv, &i, &o->socket);
        if (rc < 0)
            return -rc;
        if (rc > 0)
            continue;
        if (strcmp(argv[i], "--json") == 0)
            o->json = true;
        else if (strcmp(argv[i], "--quiet") == 0)
            o->quiet = true;
        else if (kw__cli_is(argv[i], "--pin")) {
            if ((o->pin = kw__cli_value("warmup", argc, argv, &i)) == NULL)
                return KW_CLI_USAGE;
        } else if (kw__cli_is(argv[i], "--wait-timeout")) {
            if (kw__cli_count("warmup", argc, argv, &i, "a number of seconds",
                              CLI_WAIT_MAX_S, &o->wait_s) < 0)
                return KW_CLI_USAGE;
        }
        else if (is_help(argv[i]))
            return print_usage(warmup_usage, true);
        else
            return kw__cli_unknown("warmup", argv[i], warmup_usage,
                                   kw__cli_deploy_help);
    }
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
