/* cli_diff.c: `kwarm diff`, the keys two models or deployments do not
 * share, for checking a model update or a deployment change before a
 * rollout: how many new compiles, which families, and which settings or
 * deployment values moved.  Exit 0 when the key sets are equal, 1 when
 * they differ (as diff(1) does), 2 on bad input.
 */
#include "cli.h"

#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "kw_err.h"
#include "kw_keys.h"

typedef struct diff_opts {
    const char *against;
    bool json;
} diff_opts;

static const kw_opt diff_rows[] = {
    {.name = "against", .type = KW_OPT_TEXT, .arg = "B.json",
     .off = offsetof(diff_opts, against), .size = sizeof(const char *),
     .help = "the config to compare with (then B's flags)"},
    {.name = "json", .type = KW_OPT_SWITCH, .off = offsetof(diff_opts, json),
     .size = sizeof(bool),
     .help = "{\"equal\", \"only_in_a\", \"only_in_b\",\n"
             "\"common\", \"settings\", \"deployment\",\n"
             "\"families\": [{\"family\", \"common\",\n"
             "\"only_in_a\": [keys], \"only_in_b\": [keys]}]}"},
};

static const kw__cli_cmd diff_cmd = {
    .name = "diff",
    .usage =
        "usage: kwarm diff --model A.json [DEPLOYMENT] --against B.json [DEPLOYMENT]\n"
        "                  [--json]\n"
        "\n"
        "Compares the compile keys of A and B: per family, the keys only in A\n"
        "(no longer needed) and only in B (new compiles), and the settings and\n"
        "deployment values that differ. The DEPLOYMENT flags before --against\n"
        "are A's and those after it B's; when none follow --against, B uses A's.\n"
        "Exit 0 when the key sets are equal, 1 when they differ, 2 on bad input.\n"
        "\n",
    KW__CLI_ROWS(diff_rows),
    .model = true,
};

/* One side: its flags, loaded model, keys and document. */
typedef struct side {
    kw__cli_model a;
    kw_keys_set set;
    cJSON *doc; /* kwarm keys --json, without "keys" */
} side;

/* True when digest d is among s's keys (sets are small: a linear scan of
 * a sorted copy would do, but keys of one deployment number thousands at
 * most, and this is a command, not a server). */
static bool has_key(const kw_keys_set *s, const uint8_t *d)
{
    for (size_t i = 0; i < s->nkeys; i++)
        if (memcmp(s->keys[i].digest, d, KW_KEYS_DIGEST_LEN) == 0)
            return true;
    return false;
}

/* The index of the first --against of argv (argc when none): the flags
 * before it are A's, those after it B's. */
static int against_at(int argc, char **argv)
{
    int i = 1;
    while (i < argc && strcmp(argv[i], "--against") != 0 &&
           strncmp(argv[i], "--against=", 10) != 0)
        i++;
    return i;
}

/* Parses argv into a (before --against) and b (after); -1 to go on, else
 * an exit code.  Each part goes through diff's table on its own, so the
 * deployment flags of each side are checked as every command's are. */
static int parse(side *a, side *b, bool *json, int argc, char **argv)
{
    diff_opts o = {0};
    int at = against_at(argc, argv), rc;
    if ((rc = kw__cli_getopt(&diff_cmd, at, argv, &o, &a->a, NULL, 0)) >= 0)
        return rc;
    /* B's part, from --against on, with argv[0] in front */
    char *part[KW_OPT_MAX * 2 + 2] = {argv[0]};
    int nb = 1;
    for (int i = at; i < argc && nb < (int)(sizeof part / sizeof *part) - 1; i++)
        part[nb++] = argv[i];
    if ((rc = kw__cli_getopt(&diff_cmd, nb, part, &o, &b->a, NULL, 0)) >= 0)
        return rc;
    *json = o.json;
    if (o.against == NULL) {
        kw__cli_err("diff", "--against: required (see kwarm diff --help)");
        return KW_CLI_USAGE;
    }
    if (b->a.model != NULL) {
        kw__cli_err("diff", "--model: given after --against, which names B");
        return KW_CLI_USAGE;
    }
    b->a.model = o.against;
    if (a->a.model && strcmp(a->a.model, "-") == 0 &&
        strcmp(b->a.model, "-") == 0) {
        kw__cli_err("diff", "--model - and --against -: standard input holds "
                    "one config; name a file for the other");
        return KW_CLI_USAGE;
    }
    /* No deployment after --against: B takes A's flags (its --model set
     * aside: B's model is --against's). */
    if (b->a.dep.given == 0 && b->a.deploy_file == NULL) {
        diff_opts scratch = {0};
        b->a.model = NULL;
        rc = kw__cli_getopt(&diff_cmd, at, argv, &scratch, &b->a, NULL, 0);
        b->a.model = o.against;
        if (rc >= 0)
            return rc;
    }
    return -1;
}

/* Loads and derives one side; KW_CLI_OK or the exit code. */
static int load(side *s)
{
    int rc = kw__cli_model_load(&s->a, "diff");
    if (rc == KW_CLI_OK)
        rc = kw__cli_derive(&s->a, "diff", &s->set);
    kw_keys_set none = s->set;
    none.nkeys = 0;
    if (rc == KW_CLI_OK && kw_keys_to_json(&s->a.cfg, &s->a.dep, &none, &s->doc) < 0)
        rc = KW_CLI_RUNTIME;
    if (rc == KW_CLI_OK)
        cJSON_DeleteItemFromObjectCaseSensitive(s->doc, "keys");
    return rc;
}

/* The members of object `name` whose values differ between the two
 * documents: [{"name", "a", "b"}]. */
static cJSON *changed(const side *a, const side *b, const char *name)
{
    const cJSON *oa = cJSON_GetObjectItemCaseSensitive(a->doc, name);
    const cJSON *ob = cJSON_GetObjectItemCaseSensitive(b->doc, name);
    cJSON *out = cJSON_CreateArray(), *e;
    cJSON_ArrayForEach(e, oa) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(ob, e->string);
        if (f != NULL && cJSON_Compare(e, f, true))
            continue;
        cJSON *d = cJSON_CreateObject();
        cJSON_AddStringToObject(d, "name", e->string);
        cJSON_AddItemToObject(d, "a", cJSON_Duplicate(e, true));
        cJSON_AddItemToObject(d, "b", f ? cJSON_Duplicate(f, true) : cJSON_CreateNull());
        cJSON_AddItemToArray(out, d);
    }
    return out;
}

/* Per family: common count and the keys only in one side. */
static cJSON *families(const side *a, const side *b, size_t *only_a, size_t *only_b,
                       size_t *common)
{
    cJSON *out = cJSON_CreateArray();
    for (int f = 0; f < KW_K_NFAMILIES; f++) {
        cJSON *fa = cJSON_CreateArray(), *fb = cJSON_CreateArray();
        size_t same = 0;
        for (size_t i = 0; i < a->set.nkeys; i++) {
            const kw_keys_key *k = &a->set.keys[i];
            if ((int)k->family != f)
                continue;
            if (has_key(&b->set, k->digest))
                same++;
            else
                cJSON_AddItemToArray(fa, kw_keys_key_json(k));
        }
        for (size_t i = 0; i < b->set.nkeys; i++) {
            const kw_keys_key *k = &b->set.keys[i];
            if ((int)k->family == f && !has_key(&a->set, k->digest))
                cJSON_AddItemToArray(fb, kw_keys_key_json(k));
        }
        *only_a += (size_t)cJSON_GetArraySize(fa);
        *only_b += (size_t)cJSON_GetArraySize(fb);
        *common += same;
        cJSON *e = cJSON_CreateObject();
        cJSON_AddStringToObject(e, "family", kw_keys_family_name((kw_k_family)f));
        cJSON_AddNumberToObject(e, "common", (double)same);
        cJSON_AddItemToObject(e, "only_in_a", fa);
        cJSON_AddItemToObject(e, "only_in_b", fb);
        cJSON_AddItemToArray(out, e);
    }
    return out;
}

/* Prints one key of a family's list: arch, 16 digits, fields. */
static void print_key(const char *sign, const cJSON *k)
{
    char *fields = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(k, "fields"));
    printf("    %s %-6s %.16s %s\n", sign,
           cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(k, "arch")),
           cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(k, "digest")),
           fields ? fields : "");
    free(fields);
}

/* At most MAX_LISTED keys of a list are printed (--json has them all). */
#define MAX_LISTED 12

static void print_keys(const char *sign, const cJSON *list)
{
    int n = 0;
    const cJSON *k;
    cJSON_ArrayForEach(k, list) {
        if (n++ < MAX_LISTED)
            print_key(sign, k);
    }
    if (n > MAX_LISTED)
        printf("    %s ... and %d more (--json lists them all)\n", sign,
               n - MAX_LISTED);
}

static void print_changes(const char *title, const cJSON *list)
{
    const cJSON *e;
    if (cJSON_GetArraySize(list) > 0)
        printf("%s that differ:\n", title);
    cJSON_ArrayForEach(e, list) {
        char *va = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(e, "a"));
        char *vb = cJSON_PrintUnformatted(cJSON_GetObjectItemCaseSensitive(e, "b"));
        printf("  %-24s %s -> %s\n",
               cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "name")),
               va ? va : "?", vb ? vb : "?");
        free(va);
        free(vb);
    }
}

static void print_text(const side *a, const side *b, const cJSON *doc)
{
    printf("A: %s (text config %s), %zu keys\nB: %s (text config %s), %zu keys\n",
           a->a.cfg.path, a->a.cfg.text_config, a->set.nkeys, b->a.cfg.path,
           b->a.cfg.text_config, b->set.nkeys);
    print_changes("settings", cJSON_GetObjectItemCaseSensitive(doc, "settings"));
    print_changes("deployment values",
                  cJSON_GetObjectItemCaseSensitive(doc, "deployment"));
    printf("%-26s %7s %7s %7s\n", "family", "common", "only A", "only B");
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItemCaseSensitive(doc, "families")) {
        const cJSON *fa = cJSON_GetObjectItemCaseSensitive(f, "only_in_a");
        const cJSON *fb = cJSON_GetObjectItemCaseSensitive(f, "only_in_b");
        printf("%-26s %7.0f %7d %7d\n",
               cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(f, "family")),
               cJSON_GetObjectItemCaseSensitive(f, "common")->valuedouble,
               cJSON_GetArraySize(fa), cJSON_GetArraySize(fb));
        print_keys("-", fa);
        print_keys("+", fb);
    }
    const cJSON *nb = cJSON_GetObjectItemCaseSensitive(doc, "only_in_b");
    printf("%s: %.0f new compiles for B, %.0f keys of A no longer needed\n",
           cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(doc, "equal"))
               ? "equal" : "different",
           nb->valuedouble,
           cJSON_GetObjectItemCaseSensitive(doc, "only_in_a")->valuedouble);
}

int kw__cli_diff(int argc, char **argv)
{
    side a = {0}, b = {0};
    bool json = false;
    kw__cli_model_init(&a.a);
    kw__cli_model_init(&b.a);
    int rc = parse(&a, &b, &json, argc, argv);
    bool go = rc < 0; /* --help and bad flags end here, with their code */
    if (go && (rc = load(&a)) == KW_CLI_OK)
        rc = load(&b);
    if (go && rc == KW_CLI_OK) {
        size_t oa = 0, ob = 0, common = 0;
        cJSON *doc = cJSON_CreateObject();
        cJSON *fam = families(&a, &b, &oa, &ob, &common);
        cJSON_AddBoolToObject(doc, "equal", oa == 0 && ob == 0);
        cJSON_AddNumberToObject(doc, "only_in_a", (double)oa);
        cJSON_AddNumberToObject(doc, "only_in_b", (double)ob);
        cJSON_AddNumberToObject(doc, "common", (double)common);
        cJSON_AddItemToObject(doc, "settings", changed(&a, &b, "settings"));
        cJSON_AddItemToObject(doc, "deployment", changed(&a, &b, "deployment"));
        cJSON_AddItemToObject(doc, "families", fam);
        char *text = json ? cJSON_Print(doc) : NULL;
        if (json)
            printf("%s\n", text ? text : "{}");
        else
            print_text(&a, &b, doc);
        free(text);
        rc = oa == 0 && ob == 0 ? KW_CLI_OK : KW_CLI_RUNTIME;
        cJSON_Delete(doc);
    }
    for (side *s = &a; s != NULL; s = s == &a ? &b : NULL) {
        cJSON_Delete(s->doc);
        kw_keys_set_destroy(&s->set);
        kw__cli_model_destroy(&s->a);
    }
    return rc;
}
