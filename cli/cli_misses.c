/* cli_misses.c: `kwarm misses`, the miss audit (issue 13 point 6).
 *
 * Every get kwarmd could not answer from its cache, newest last, each with
 * the nearest cached key of its family and arch, the fields that differ
 * (both values) and the pin sets that hold that nearest key.  A warmup that
 * read its settings from the wrong level of a composite config shows up
 * here as misses whose nearest key differs in exactly those fields.
 */
#include "cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "kw_client.h"
#include "kw_err.h"

typedef struct misses_opts {
    const char *socket;
    int64_t since; /* seconds; 0: every miss kept */
    bool json;
} misses_opts;

/* --since AGE: an age such as 90s or 7d (cli_ls.c's kw__cli_age). */
static int set_since(void *opts, const char *v)
{
    int64_t s = kw__cli_age(v);
    if (s <= 0)
        return KW_EINVAL;
    ((misses_opts *)opts)->since = s;
    return 0;
}

static const kw_opt misses_rows[] = {
    {.name = "since", .type = KW_OPT_FUNC, .arg = "AGE", .set = set_since,
     .what = "an age (90s, 30m, 1h, 7d, 2w)",
     .help = "only the last AGE: 90s, 30m, 1h, 7d, 2w"},
    KW__CLI_SOCKET_ROW(misses_opts, socket),
    KW__CLI_SWITCH(misses_opts, json, "json",
                   "{\"count\", \"since\", \"misses\": [...]}"),
};

static const kw__cli_cmd misses_cmd = {
    .name = "misses",
    .usage = "usage: kwarm misses [--since AGE] [--socket PATH] [--json]\n"
             "\n"
             "Lists the gets kwarmd could not answer from its cache (the last 10,000),\n"
             "each with the nearest cached key of the same family and arch, the fields\n"
             "that differ (requested and cached) and the pins that hold that key.\n"
             "\n",
    KW__CLI_ROWS(misses_rows),
};

/* One miss: when, who, what, and the nearest key's differences. */
static void print_miss(const cJSON *m)
{
    char when[32];
    time_t t = (time_t)cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "time"));
    struct tm tm;
    gmtime_r(&t, &tm);
    strftime(when, sizeof when, "%Y-%m-%dT%H:%M:%SZ", &tm);
    const cJSON *key = cJSON_GetObjectItemCaseSensitive(m, "key");
    const char *fam = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(key, "family"));
    const char *arch = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(key, "arch"));
    /* A serving process's own miss says so: "runtime" (served), or
     * "capture" (refused while its stream captured a CUDA graph). */
    const char *kind = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "kind"));
    printf("%s uid %.0f pid %.0f %.16s %s %s: %s%s%s\n", when,
           cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "uid")),
           cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(m, "pid")),
           cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "digest")),
           fam ? fam : "(by digest)", arch ? arch : "",
           cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "outcome")),
           kind ? ", a serving process's miss during " : "",
           kind ? (kind[0] == 'c' ? "graph capture" : "serving") : "");
    const cJSON *near = cJSON_GetObjectItemCaseSensitive(m, "nearest");
    if (!cJSON_IsObject(near)) {
        printf("    no cached key of this family and arch\n");
        return;
    }
    printf("    nearest cached %.16s", cJSON_GetStringValue(
                                          cJSON_GetObjectItemCaseSensitive(near, "digest")));
    const cJSON *p;
    int np = 0;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(near, "pins"))
        printf("%s%s", np++ ? ", " : " (pinned by ", p->valuestring);
    printf("%s\n", np ? ")" : " (not pinned)");
    const cJSON *d;
    cJSON_ArrayForEach(d, cJSON_GetObjectItemCaseSensitive(near, "differ"))
        printf("    %s: requested %.0f, cached %.0f\n",
               cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(d, "field")),
               cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d, "requested")),
               cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(d, "cached")));
}

int kw__cli_misses(int argc, char **argv)
{
    misses_opts o = {0};
    int rc = kw__cli_getopt(&misses_cmd, argc, argv, &o, NULL, NULL, 0);
    if (rc >= 0)
        return rc;
    const char *sock = o.socket;
    int64_t since = o.since;
    bool json = o.json;
    kw_client *c = NULL;
    char err[512], *res = NULL;
    if (kw_client_connect(&c, sock, 10000, err, sizeof err) < 0) {
        kw__cli_err("misses", "cannot reach kwarmd: %s", err);
        return KW_CLI_RUNTIME;
    }
    if (kw_client_misses(c, (uint64_t)since, &res) < 0) {
        kw__cli_err("misses", "%s", kw_client_last_error(c));
        kw_client_close(c);
        return KW_CLI_RUNTIME;
    }
    cJSON *doc = cJSON_Parse(res);
    if (json) {
        printf("%s\n", res);
    } else {
        const cJSON *m;
        cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(doc, "misses"))
            print_miss(m);
        printf("%.0f misses\n",
               cJSON_GetNumberValue(cJSON_GetObjectItemCaseSensitive(doc, "count")));
    }
    cJSON_Delete(doc);
    free(res);
    kw_client_close(c);
    return KW_CLI_OK;
}
