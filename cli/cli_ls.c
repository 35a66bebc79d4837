/* cli_ls.c: `kwarm ls` and `kwarm evict` on a cache directory.
 *
 * Both walk the cache into the JSON document a kwarmd request of the same
 * name would reply with, one object per entry:
 *   {"digest", "family", "arch", "fields": {name: value, ...}, "size",
 *    "created", "last_used", "hits", "pinned", "pins": [NAME, ...]}
 * and print it (--json: as it is).  Field names come from the key
 * registry (jit/); an entry of a family this build does not know keeps
 * its values as an array.
 */
#include "cli.h"

#include <inttypes.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_parse.h"
#include "kw_warm.h"

typedef kw_warm_filter filter;

/* "name=value,..." of an entry's fields into buf. */
static void fields_text(const cJSON *fields, char *buf, size_t cap)
{
    size_t used = 0;
    const cJSON *v;
    buf[0] = '\0';
    cJSON_ArrayForEach(v, fields) {
        char val[32];
        if (cJSON_IsBool(v))
            snprintf(val, sizeof val, "%s", cJSON_IsTrue(v) ? "true" : "false");
        else
            snprintf(val, sizeof val, "%.0f", v->valuedouble);
        int n = snprintf(buf + used, cap - used, "%s%s%s%s", used ? "," : "",
                         v->string ? v->string : "", v->string ? "=" : "", val);
        if (n < 0 || (size_t)n >= cap - used)
            break;
        used += (size_t)n;
    }
}

/* One entry as a table row. */
static void print_row(const cJSON *e)
{
    const cJSON *dg = cJSON_GetObjectItemCaseSensitive(e, "digest");
    const cJSON *fam = cJSON_GetObjectItemCaseSensitive(e, "family");
    const cJSON *arch = cJSON_GetObjectItemCaseSensitive(e, "arch");
    const cJSON *pins = cJSON_GetObjectItemCaseSensitive(e, "pins"), *p;
    char size[16], created[32], used[32], names[256] = "", fields[512];
    kw__cli_size(kw__cli_u64(e, "size"), size, sizeof size);
    kw__cli_time(kw__cli_u64(e, "created"), created, sizeof created);
    kw__cli_time(kw__cli_u64(e, "last_used"), used, sizeof used);
    cJSON_ArrayForEach(p, pins) {
        size_t n = strlen(names);
        if (cJSON_IsString(p))
            snprintf(names + n, sizeof names - n, "%s%s", n ? "," : "",
                     p->valuestring);
    }
    if (names[0] == '\0')
        snprintf(names, sizeof names, "%s",
                 cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(e, "pinned"))
                     ? "(pinned)" : "-");
    fields_text(cJSON_GetObjectItemCaseSensitive(e, "fields"), fields,
                sizeof fields);
    printf("%.16s  %-26s %-8s %7s  %-16s  %-16s %6" PRIu64 "  %-12s %s\n",
           cJSON_IsString(dg) ? dg->valuestring : "?",
           cJSON_IsString(fam) ? fam->valuestring : "?",
           cJSON_IsString(arch) ? arch->valuestring : "?", size, created,
           used, kw__cli_u64(e, "hits"), names, fields);
}

void kw__cli_print_ls(const cJSON *doc, bool json)
{
    if (json) {
        kw__cli_print_json(doc);
        return;
    }
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(doc, "entries"), *e;
    char size[16];
    if (cJSON_GetArraySize(arr) > 0)
        printf("%-16s  %-26s %-8s %7s  %-16s  %-16s %6s  %-12s %s\n", "DIGEST",
               "FAMILY", "ARCH", "SIZE", "CREATED", "LAST USED", "HITS",
               "PINS", "FIELDS");
    cJSON_ArrayForEach(e, arr)
        print_row(e);
    kw__cli_size(kw__cli_u64(doc, "bytes"), size, sizeof size);
    printf("%" PRIu64 " entries, %s\n", kw__cli_u64(doc, "count"), size);
}

/* ---- ls ------------------------------------------------------------------ */

typedef struct ls_opts {
    const char *dir, *sock;
    filter f;
    bool json;
} ls_opts;

static const kw_opt ls_rows[] = {
    KW__CLI_TEXT(ls_opts, dir, "cache", "DIR", "the cache directory"),
    KW__CLI_TEXT(ls_opts, sock, "socket", "PATH", "ask kwarmd instead (its cache)"),
    KW__CLI_TEXT(ls_opts, f.family, "family", "F", "only entries of family F"),
    KW__CLI_TEXT(ls_opts, f.pin_name, "pinned", "NAME",
                 "only entries held by the pin set NAME"),
    KW__CLI_SWITCH(ls_opts, json, "json",
                   "{\"entries\": [{\"digest\", \"family\", \"arch\",\n"
                   "\"fields\", \"size\", \"created\", \"last_used\",\n"
                   "\"hits\", \"pinned\", \"pins\"}], \"count\",\n"
                   "\"bytes\"}; times in Unix seconds"),
};

static const kw__cli_cmd ls_cmd = {
    .name = "ls",
    .usage =
        "usage: kwarm ls --cache DIR [--family F] [--pinned NAME] [--json]\n"
        "\n"
        "Lists the cache's entries: digest (16 of 64 hex digits), family, arch,\n"
        "size, created, last used, hits, the pin sets holding it, and the key's\n"
        "fields.  Works on a cache this user cannot write.  Last-used times and\n"
        "hits are those last written to the cache.\n"
        "\n",
    KW__CLI_ROWS(ls_rows),
};

/* True when the pins document (kwarm pins --json) names the set name. */
static bool has_pin_set(const cJSON *pins, const char *name)
{
    const cJSON *p;
    cJSON_ArrayForEach(p, cJSON_GetObjectItemCaseSensitive(pins, "pins")) {
        const char *n = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(p, "name"));
        if (n != NULL && strcmp(n, name) == 0)
            return true;
    }
    return false;
}

/* --pinned NAME of a set the cache lacks: said as unpin says it, exit 1,
 * instead of "0 entries" (a typo would look like an empty set).  Asks c,
 * or kwarmd at sock when c is NULL.  -1 to go on, else an exit code. */
static int pin_set_check(kw_cache *c, const char *sock, const char *name,
                         const char *where)
{
    cJSON *doc = NULL;
    int rc = -1;
    if (c != NULL) {
        if (kw_warm_pins(c, &doc) < 0)
            doc = NULL; /* the listing says why, if it fails too */
    } else {
        cJSON *h = cJSON_CreateObject();
        rc = kw__cli_via_daemon("ls", sock, "pins", h, &doc);
        cJSON_Delete(h);
        if (rc != KW_CLI_OK)
            return rc;
        rc = -1;
    }
    if (doc != NULL && !has_pin_set(doc, name)) {
        kw__cli_err("ls", "--pinned %.80s: no such pin set in %s (kwarm pins "
                    "lists them)", name, where);
        rc = KW_CLI_RUNTIME;
    }
    cJSON_Delete(doc);
    return rc;
}

int kw__cli_ls(int argc, char **argv)
{
    ls_opts o = {0};
    int rc = kw__cli_getopt(&ls_cmd, argc, argv, &o, NULL, NULL, 0);
    if (rc >= 0)
        return rc;
    const char *dir = o.dir, *sock = o.sock;
    filter f = o.f;
    bool json = o.json;
    kw_k_family fam;
    if (f.family != NULL && kw_keys_family_from_name(f.family, &fam) < 0) {
        kw__cli_err("ls", "--family: '%.48s' is not a kernel family", f.family);
        return KW_CLI_USAGE;
    }
    cJSON *doc = NULL;
    if (dir == NULL) { /* through kwarmd */
        cJSON *h = cJSON_CreateObject();
        if (f.family != NULL)
            cJSON_AddStringToObject(h, "family", f.family);
        if (f.pin_name != NULL)
            cJSON_AddStringToObject(h, "pinned", f.pin_name);
        if (f.pin_name == NULL ||
            (rc = pin_set_check(NULL, sock, f.pin_name, "kwarmd's cache")) < 0)
            rc = kw__cli_via_daemon("ls", sock, "ls", h, &doc);
        cJSON_Delete(h);
        if (rc == KW_CLI_OK)
            kw__cli_print_ls(doc, json);
        cJSON_Delete(doc);
        return rc;
    }
    kw_cache *c = NULL;
    if ((rc = kw__cli_cache_open("ls", dir, KW_CLI_READ, &c)) != KW_CLI_OK)
        return rc;
    if (f.pin_name != NULL && (rc = pin_set_check(c, NULL, f.pin_name, dir)) >= 0) {
        kw_cache_close(c);
        return rc;
    }
    if ((rc = kw_warm_ls(c, &f, &doc)) < 0)
        kw__cli_err("ls", "%s: %s", dir, kw_strerror(rc));
    else
        kw__cli_print_ls(doc, json);
    cJSON_Delete(doc);
    kw_cache_close(c);
    return rc < 0 ? KW_CLI_RUNTIME : KW_CLI_OK;
}

/* ---- evict --------------------------------------------------------------- */


int64_t kw__cli_age(const char *s)
{
    static const struct {
        char unit;
        int64_t secs;
    } units[] = {{'s', 1}, {'m', 60}, {'h', 3600}, {'d', 86400}, {'w', 604800}};
    size_t n = strlen(s);
    char num[24];
    int64_t v;
    if (n < 2 || n >= sizeof num)
        return -1;
    memcpy(num, s, n - 1);
    num[n - 1] = '\0';
    for (size_t i = 0; i < sizeof units / sizeof *units; i++)
        if (s[n - 1] == units[i].unit &&
            kw_parse_i64(num, 0, INT64_MAX / units[i].secs, &v) == 0)
            return v * units[i].secs;
    return -1;
}

void kw__cli_print_evict(const cJSON *doc, bool json)
{
    if (json) {
        cJSON *out = cJSON_CreateObject();
        cJSON_AddItemReferenceToObject(out, "removed",
            cJSON_GetObjectItemCaseSensitive(doc, "removed"));
        cJSON_AddNumberToObject(out, "count", (double)kw__cli_u64(doc, "count"));
        cJSON_AddNumberToObject(out, "bytes", (double)kw__cli_u64(doc, "bytes"));
        kw__cli_print_json(out);
        cJSON_Delete(out);
        return;
    }
    const cJSON *arr = cJSON_GetObjectItemCaseSensitive(doc, "removed"), *e;
    cJSON_ArrayForEach(e, arr) {
        const cJSON *dg = cJSON_GetObjectItemCaseSensitive(e, "digest");
        const cJSON *fam = cJSON_GetObjectItemCaseSensitive(e, "family");
        const cJSON *arch = cJSON_GetObjectItemCaseSensitive(e, "arch");
        printf("removed %.16s %s %s, %" PRIu64 " bytes\n", dg->valuestring,
               cJSON_IsString(fam) ? fam->valuestring : "?",
               cJSON_IsString(arch) ? arch->valuestring : "?",
               kw__cli_u64(e, "size"));
    }
    printf("evicted %" PRIu64 " entries, %" PRIu64 " bytes\n",
           kw__cli_u64(doc, "count"), kw__cli_u64(doc, "bytes"));
}

typedef struct evict_opts {
    const char *dir, *sock, *digest, *age;
    bool force, json;
    filter f;
} evict_opts;

static const kw_opt evict_rows[] = {
    KW__CLI_TEXT(evict_opts, dir, "cache", "DIR", "the cache directory"),
    KW__CLI_TEXT(evict_opts, sock, "socket", "PATH", "ask kwarmd instead (its cache)"),
    KW__CLI_TEXT(evict_opts, digest, "digest", "HEX",
                 "one entry: 64 hex digits or a unique prefix\n"
                 "of at least 8 (ambiguous: exit 2)"),
    KW__CLI_TEXT(evict_opts, f.family, "family", "F", "entries of family F"),
    KW__CLI_SWITCH(evict_opts, f.unpinned, "unpinned", "entries no pin holds"),
    KW__CLI_TEXT(evict_opts, age, "older-than", "AGE",
                 "entries not used for AGE: a number with s, m,\n"
                 "h, d or w (7d); as of the last recorded use"),
    KW__CLI_SWITCH(evict_opts, force, "force", "remove pinned entries too"),
    KW__CLI_SWITCH(evict_opts, json, "json",
                   "{\"removed\": [entries as kwarm ls --json],\n"
                   "\"count\", \"bytes\"}"),
};

static const kw__cli_cmd evict_cmd = {
    .name = "evict",
    .usage =
        "usage: kwarm evict --cache DIR (--digest HEX | --family F | --unpinned |\n"
        "                   --older-than AGE)... [--force] [--json]\n"
        "\n"
        "Removes the entries that match every criterion given, and prints each.\n"
        "When a matching entry is pinned (by kwarm prewarm --pin, or a pin set),\n"
        "nothing is removed and the exit status is 1, unless --force.\n"
        "\n",
    KW__CLI_ROWS(evict_rows),
};

/* Parses evict's arguments; -1 to go on, else an exit code. */
static int evict_parse(evict_opts *o, int argc, char **argv)
{
    int rc = kw__cli_getopt(&evict_cmd, argc, argv, o, NULL, NULL, 0);
    if (rc >= 0)
        return rc;
    kw_k_family fam;
    int64_t age = o->age ? kw__cli_age(o->age) : 0;
    if (!o->digest && !o->f.family && !o->f.unpinned && !o->age)
        kw__cli_err("evict", "one of --digest, --family, --unpinned or "
                    "--older-than is required (see kwarm evict --help)");
    else if (o->f.family && kw_keys_family_from_name(o->f.family, &fam) < 0)
        kw__cli_err("evict", "--family: '%.48s' is not a kernel family",
                    o->f.family);
    else if (age < 0)
        kw__cli_err("evict", "--older-than: '%.32s' is not an age (a number "
                    "with s, m, h, d or w: 7d)", o->age);
    else {
        if (o->age != NULL)
            o->f.before = (uint64_t)time(NULL) - (uint64_t)age;
        return -1;
    }
    return KW_CLI_USAGE;
}

/* evict through kwarmd: the same criteria as a "match" object. */
static int evict_socket(const evict_opts *o)
{
    cJSON *h = cJSON_CreateObject(), *m = cJSON_AddObjectToObject(h, "match");
    cJSON *doc = NULL;
    if (o->digest != NULL)
        cJSON_AddStringToObject(m, "digest", o->digest);
    if (o->f.family != NULL)
        cJSON_AddStringToObject(m, "family", o->f.family);
    if (o->f.unpinned)
        cJSON_AddBoolToObject(m, "unpinned", true);
    if (o->f.before != 0)
        cJSON_AddNumberToObject(m, "before", (double)o->f.before);
    cJSON_AddBoolToObject(h, "force", o->force);
    int rc = kw__cli_via_daemon("evict", o->sock, "evict", h, &doc);
    if (rc == KW_CLI_OK)
        kw__cli_print_evict(doc, o->json);
    cJSON_Delete(doc);
    cJSON_Delete(h);
    return rc;
}

int kw__cli_evict(int argc, char **argv)
{
    evict_opts o = {0};
    int rc = evict_parse(&o, argc, argv);
    if (rc >= 0)
        return rc;
    if (o.dir == NULL)
        return evict_socket(&o);
    kw_cache *c = NULL;
    cJSON *doc = NULL;
    uint8_t digest[KW_CACHE_DIGEST_LEN];
    char err[512];
    if ((rc = kw__cli_cache_open("evict", o.dir, KW_CLI_WRITE, &c)) != KW_CLI_OK)
        return rc;
    if (o.digest != NULL &&
        (rc = kw__cli_digest_resolve("evict", c, o.digest, digest)) >= 0)
        goto out;
    o.f.digest = o.digest ? digest : NULL;
    if ((rc = kw_warm_ls(c, &o.f, &doc)) < 0) {
        kw__cli_err("evict", "%s: %s", o.dir, kw_strerror(rc));
        rc = KW_CLI_RUNTIME;
    } else if (o.digest != NULL && kw__cli_u64(doc, "count") == 0) {
        kw__cli_err("evict", "--digest %.64s: not cached in %s", o.digest, o.dir);
        rc = KW_CLI_RUNTIME;
    } else if ((rc = kw_warm_evict(c, doc, o.force, err, sizeof err)) < 0) {
        kw__cli_err("evict", "%s (in %s)", err, o.dir);
        rc = KW_CLI_RUNTIME;
    } else {
        kw__cli_print_evict(doc, o.json);
    }
out:
    cJSON_Delete(doc);
    kw_cache_close(c);
    return rc;
}
