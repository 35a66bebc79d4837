/* cli_daemon.c: the commands that talk to a running kwarmd through
 * libkwarm: `kwarm ping`, and the --socket forms of `kwarm get` and
 * `kwarm stats` (cli_cache.c's commands hand those over when no --cache
 * is given); what they share with `kwarm warmup` (cli_warmup.c).
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


typedef struct ping_opts {
    const char *socket;
} ping_opts;

static const kw_opt ping_rows[] = {KW__CLI_SOCKET_ROW(ping_opts, socket)};

static const kw__cli_cmd ping_cmd = {
    .name = "ping",
    .usage = "usage: kwarm ping [--socket PATH]\n"
             "\n"
             "Asks kwarmd for its version; exit 1 when it cannot be reached.\n"
             "\n",
    KW__CLI_ROWS(ping_rows),
};

/* ---- shared ------------------------------------------------------------- */

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
    return kw__cli_connect(cmd, path, KW_CLI_TIMEOUT_MS, c);
}

int kw__cli_request_failed(const char *cmd, const kw_client *c, int rc)
{
    kw__cli_err(cmd, "%s", kw_client_last_error(c));
    return exit_for(rc);
}

/* ---- ping ---------------------------------------------------------------- */

int kw__cli_ping(int argc, char **argv)
{
    ping_opts o = {0};
    int rc = kw__cli_getopt(&ping_cmd, argc, argv, &o, NULL, NULL, 0);
    if (rc >= 0)
        return rc;
    kw_client *c = NULL;
    char version[64];
    rc = connect_to("ping", o.socket, &c);
    if (rc != KW_CLI_OK)
        return rc;
    if ((rc = kw_client_ping(c, version, sizeof version)) < 0)
        rc = kw__cli_request_failed("ping", c, rc);
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

int kw__cli_stats_socket(const kw__cli_stats_opts *o)
{
    const char *path = o->socket;
    int form = o->prometheus ? 2 : o->json ? 1 : 0; /* 0: lines */
    if (o->json && o->prometheus) {
        kw__cli_err("stats", "--json and --prometheus: give one (two forms of "
                    "the same counters)");
        return KW_CLI_USAGE;
    }
    kw_client *c = NULL;
    char *reply = NULL;
    int rc = connect_to("stats", path, &c);
    if (rc != KW_CLI_OK)
        return rc;
    if ((rc = kw_client_stats(c, &reply)) < 0)
        rc = kw__cli_request_failed("stats", c, rc);
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
    return rc < 0 ? kw__cli_request_failed("get", c, rc) : KW_CLI_OK;
}

int kw__cli_get_socket(const get_opts *op)
{
    const get_opts o = *op;
    int rc;
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
