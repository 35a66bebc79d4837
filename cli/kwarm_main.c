/* kwarm_main.c: the kwarm command line, one function per command. */
#include <stdio.h>
#include <string.h>

#include "cli.h"

#include "kw_proto.h"

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
    const char *summary;
} command;

static const command commands[] = {
    {"keys", kw__cli_keys, "print the compile keys of a model and deployment"},
    {"diff", kw__cli_diff, "compare the keys of two models or deployments"},
    {"misses", kw__cli_misses, "list kwarmd's cache misses, and why each missed"},
    {"prewarm", kw__cli_prewarm, "compile every missing key into a cache directory"},
    {"get", kw__cli_get, "write one cubin to a file (compiling a miss by key)"},
    {"stats", kw__cli_stats, "print a cache's statistics"},
    {"ls", kw__cli_ls, "list a cache's entries"},
    {"evict", kw__cli_evict, "remove entries from a cache"},
    {"pins", kw__cli_pins, "list a cache's named pin sets"},
    {"unpin", kw__cli_unpin, "delete a named pin set"},
    {"resize", kw__cli_resize, "change a cache's stored size limit"},
    {"warmup", kw__cli_warmup, "ask a running kwarmd to compile every missing key"},
    {"ping", kw__cli_ping, "check that kwarmd answers, and print its version"},
    {"verify", kw__cli_verify, "run every key's kernel against its CPU reference (GPU)"},
};
#define NCOMMANDS (sizeof commands / sizeof commands[0])

static void usage(FILE *out)
{
    fprintf(out, "usage: kwarm COMMAND [ARGS]   (kwarm help COMMAND, or kwarm "
                 "COMMAND --help, for more)\n\n"
                 "kwarm derives, compiles and caches the JIT kernels of sparse-MLA\n"
                 "models (DeepSeek-V3.2/V4, GLM-5) so serving never compiles.\n\n"
                 "Commands:\n");
    for (size_t i = 0; i < NCOMMANDS; i++)
        fprintf(out, "  %-10s %s\n", commands[i].name, commands[i].summary);
    fprintf(out, "\nOptions:\n"
                 "  --version      print kwarm's version\n"
                 "  -h, --help     this text\n"
                 "  help COMMAND   COMMAND's help (kwarm COMMAND --help)\n"
                 "\nExit status: 0 ok, 1 runtime failure, 2 bad input.\n");
}

/* --version: everything that enters a key's digest, and the protocol. */
static int print_version(void)
{
    int major = 0, minor = 0;
    uint8_t src[KW_KEYS_DIGEST_LEN];
    char hex[KW_KEYS_HEX_LEN];
    if (kw_jit_version(&major, &minor) < 0 || kw_keys_sources_digest(src) < 0) {
        fprintf(stderr, "kwarm: --version: the NVRTC version query failed\n");
        return KW_CLI_RUNTIME;
    }
    kw_keys_hex(src, hex);
    printf("kwarm %s\nkey schema %d\nNVRTC %d.%d\nkernel sources %.16s\n"
           "protocol %u\n", KW_VERSION, KW_KEYS_SCHEMA, major, minor, hex,
           KW_PROTO_VERSION);
    return KW_CLI_OK;
}

/* The command named name, or NULL. */
static const command *find(const char *name)
{
    for (size_t i = 0; i < NCOMMANDS; i++)
        if (strcmp(name, commands[i].name) == 0)
            return &commands[i];
    return NULL;
}

/* "unknown command", with the nearest command when one is near. */
static int unknown_command(const char *arg)
{
    char name[65];
    snprintf(name, sizeof name, "%s", arg);
    for (char *p = name; *p != '\0'; p++) /* keep the error one line */
        if ((unsigned char)*p < 0x20)
            *p = '?';
    const char *names[NCOMMANDS];
    for (size_t i = 0; i < NCOMMANDS; i++)
        names[i] = commands[i].name;
    const char *near = kw_opt_nearest(name, names, NCOMMANDS);
    if (near != NULL)
        fprintf(stderr, "kwarm: unknown command '%s'; did you mean '%s'? (see "
                "kwarm --help)\n", name, near);
    else
        fprintf(stderr, "kwarm: unknown command '%s' (see kwarm --help)\n",
                name);
    return KW_CLI_USAGE;
}

/* kwarm help [CMD]: the general usage, or CMD's own --help. */
static int help(int argc, char **argv)
{
    if (argc < 3) {
        usage(stdout);
        return KW_CLI_OK;
    }
    const command *c = find(argv[2]);
    if (c == NULL || argc > 3)
        return c ? (fprintf(stderr, "kwarm help: one command at most\n"),
                    KW_CLI_USAGE)
                 : unknown_command(argv[2]);
    char *sub[] = {argv[2], "--help", NULL};
    return c->run(2, sub);
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return KW_CLI_USAGE;
    }
    if (strcmp(argv[1], "-h") == 0 || strcmp(argv[1], "--help") == 0) {
        usage(stdout);
        return KW_CLI_OK;
    }
    if (strcmp(argv[1], "help") == 0)
        return help(argc, argv);
    if (strcmp(argv[1], "--version") == 0)
        return print_version();
    const command *c = find(argv[1]);
    return c ? c->run(argc - 1, argv + 1) : unknown_command(argv[1]);
}
