/* test_cli_install.c: libkwarm as a user installs it (issue 12 point 8,
 * issue 10 point 7).  The build tree this suite belongs to is installed
 * into a fresh prefix (`cmake --install BUILD --prefix TMP`, what `make
 * install PREFIX=TMP` runs); the README's C client example is compiled
 * with `pkg-config --cflags --libs kwarm` from that prefix, and run
 * against a real kwarmd.  The installed headers include nothing outside
 * their folder but the C library and cJSON, and name nothing of kernels/
 * (kw_k_), jit/ or cache/.
 */
#include "daemon_util.h" /* first: it asks for _GNU_SOURCE */

#include <dirent.h>
#include <libgen.h>

#include "cli_util.h"

#define README KW_FIXTURES "/../../README.md"

/* In the ASan/UBSan build libkwarm is instrumented, so the example that
 * loads it must be too (the ASan runtime comes first or not at all). */
#ifdef __SANITIZE_ADDRESS__
#define EXAMPLE_CFLAGS "-fsanitize=address,undefined"
#else
#define EXAMPLE_CFLAGS ""
#endif

static char prefix[64];

static void setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(prefix, sizeof prefix, "install"), 0);
}

static void teardown(void)
{
    kw_test_rmtree(prefix);
    kwd_cleanup();
}

/* Runs a shell script with $1.. = args; returns its exit status, stdout
 * in *out (free it; may be NULL to discard). */
static int sh(const char *script, const char *const *args, char **out)
{
    const char *argv[12] = {"/bin/sh", "-c", script, "sh"};
    size_t n = 4;
    for (size_t i = 0; args[i] != NULL; i++) {
        cr_assert(n < 11);
        argv[n++] = args[i];
    }
    argv[n] = NULL;
    char *o = NULL, *e = NULL;
    int st = kw_test_run(argv, &o, &e);
    if (st != 0)
        cr_log_error("%s\nstdout: %s\nstderr: %s", script, o ? o : "",
                     e ? e : "");
    if (out != NULL)
        *out = o;
    else
        free(o);
    free(e);
    return st;
}

/* Installs this build tree into prefix. */
static void install(void)
{
    char bin[512];
    snprintf(bin, sizeof bin, "%s", KW_KWARM_BIN);
    const char *build = dirname(bin);
    cr_assert_eq(sh("cmake --install \"$1\" --prefix \"$2\" >/dev/null",
                    ARGS(build, prefix), NULL), 0, "cmake --install failed");
}

/* The first ```c block of the README that includes <kwarm/kw_client.h>,
 * with the list indentation taken off (a new string). */
static char *readme_example(void)
{
    char *doc = kw_test_read_file(README, NULL);
    cr_assert_not_null(doc, "%s: %s", README, strerror(errno));
    char *p = doc, *code = NULL;
    while (code == NULL && (p = strstr(p, "```c\n")) != NULL) {
        char *start = p + 5, *end = strstr(start, "```");
        cr_assert_not_null(end, "unterminated code block");
        *end = '\0';
        if (strstr(start, "<kwarm/kw_client.h>") != NULL)
            code = strdup(start);
        *end = '`';
        p = end + 3;
    }
    free(doc);
    cr_assert_not_null(code, "README has no C example including <kwarm/kw_client.h>");
    /* Drop the indentation the block has inside its list item. */
    size_t indent = strspn(code, " ");
    char *w = code;
    for (char *line = code; *line != '\0';) {
        char *nl = strchr(line, '\n');
        size_t len = nl ? (size_t)(nl - line + 1) : strlen(line);
        size_t skip = strspn(line, " ") < indent ? strspn(line, " ") : indent;
        memmove(w, line + skip, len - skip);
        w += len - skip;
        line += len;
    }
    *w = '\0';
    return code;
}

Test(install, readme_client_example_builds_with_pkg_config_from_the_prefix,
     .init = setup, .fini = teardown)
{
    install();
    char *code = readme_example();
    char src[128], exe[128];
    snprintf(src, sizeof src, "%s/serve.c", prefix);
    snprintf(exe, sizeof exe, "%s/serve", prefix);
    FILE *f = fopen(src, "w");
    cr_assert_not_null(f);
    fputs(code, f);
    fclose(f);
    free(code);
    /* Only this prefix's kwarm.pc: PKG_CONFIG_LIBDIR replaces the search
     * path, so an installed system copy cannot stand in for it. */
    char *libdir = NULL;
    cr_assert_eq(sh("pc=$(find \"$1\" -name kwarm.pc) && [ -n \"$pc\" ] && "
                    "export PKG_CONFIG_LIBDIR=\"$(dirname \"$pc\"):"
                    "$(pkg-config --variable pc_path pkg-config)\" && "
                    "cc -Wall -Wextra -Werror $4 \"$2\" -o \"$3\" "
                    "$(pkg-config --cflags --libs kwarm) && "
                    "pkg-config --variable libdir kwarm",
                    ARGS(prefix, src, exe, EXAMPLE_CFLAGS), &libdir), 0,
                 "the README example does not build from %s", prefix);
    libdir[strcspn(libdir, "\n")] = '\0';
    cr_expect(strncmp(libdir, prefix, strlen(prefix)) == 0,
              "kwarm.pc's libdir %s is outside the prefix %s", libdir, prefix);
    kwd d;
    kwd_init(&d, "install-d");
    kwd_start(&d, 1, NULL);
    char *out = NULL;
    cr_expect_eq(sh("KWARM_SOCKET=\"$1\" LD_LIBRARY_PATH=\"$2\" \"$3\"",
                    ARGS(d.sock, libdir, exe), &out), 0);
    cr_expect(out && strncmp(out, "kwarmd ", 7) == 0, "serve printed: %s", out);
    free(out);
    free(libdir);
    kwd_stop(&d);
}

/* Checks one installed header: quoted includes name files beside it; angle
 * includes are the C library or cJSON; no kernels/, jit/ or cache/ name. */
static void check_header(const char *dir, const char *name)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    char *text = kw_test_read_file(path, NULL);
    cr_assert_not_null(text);
    static const char *const allowed[] = {"stdbool.h", "stddef.h", "stdint.h",
                                          "cjson/cJSON.h"};
    static const char *const banned[] = {"kw_k_", "kw_kernels", "kw_keys",
                                         "kw_jit", "kw_cache", "kw_config"};
    for (char *p = text; (p = strstr(p, "#include")) != NULL; p++) {
        char inc[128] = "", open = 0;
        cr_assert_eq(sscanf(p + 8, " %c%127[^\">]", &open, inc), 2, "%s", name);
        if (open == '"') {
            char beside[700];
            snprintf(beside, sizeof beside, "%s/%s", dir, inc);
            cr_expect_eq(access(beside, R_OK), 0, "%s includes \"%s\", not "
                         "installed beside it", name, inc);
            continue;
        }
        bool ok = false;
        for (size_t i = 0; i < N(allowed); i++)
            ok = ok || strcmp(inc, allowed[i]) == 0;
        cr_expect(ok, "%s includes <%s>", name, inc);
    }
    for (size_t i = 0; i < N(banned); i++)
        cr_expect(strstr(text, banned[i]) == NULL, "%s names %s", name,
                  banned[i]);
    free(text);
}

Test(install, installed_headers_stand_alone, .init = setup, .fini = teardown)
{
    install();
    char dir[256];
    snprintf(dir, sizeof dir, "%s/include/kwarm", prefix);
    DIR *d = opendir(dir);
    cr_assert_not_null(d, "%s: %s", dir, strerror(errno));
    size_t n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;) {
        if (e->d_name[0] == '.')
            continue;
        check_header(dir, e->d_name);
        n++;
    }
    closedir(d);
    cr_expect_eq(n, 6, "want kw_client.h, kw_cuda.h, kw_proto.h, kw_ops.h, "
                       "kw_launch.h, kw_err.h");
}

/* Issue 12 point 9: systemd removes a service's RuntimeDirectory= when it
 * stops, and /run/kwarm holds the socket unit's socket. */
Test(install, service_keeps_the_socket_units_directory, .init = setup,
     .fini = teardown)
{
    install();
    char path[256];
    snprintf(path, sizeof path, "%s/lib/systemd/system/kwarmd.service", prefix);
    char *unit = kw_test_read_file(path, NULL);
    cr_assert_not_null(unit, "%s: %s", path, strerror(errno));
    bool runtime_dir = false, preserve = false;
    for (char *save = NULL, *l = strtok_r(unit, "\n", &save); l != NULL;
         l = strtok_r(NULL, "\n", &save)) {
        runtime_dir = runtime_dir || strncmp(l, "RuntimeDirectory=", 17) == 0;
        preserve = preserve || strcmp(l, "RuntimeDirectoryPreserve=yes") == 0;
    }
    cr_expect(!runtime_dir || preserve, "kwarmd.service sets RuntimeDirectory= "
              "without RuntimeDirectoryPreserve=yes");
    free(unit);
}

/* True when the unit text holds a line that starts with key. */
static bool unit_has(const char *unit, const char *key)
{
    size_t n = strlen(key);
    for (const char *l = unit; l != NULL && *l != '\0';) {
        if (strncmp(l, key, n) == 0)
            return true;
        l = strchr(l, '\n');
        l = l ? l + 1 : NULL;
    }
    return false;
}

/* Issue 24: PartOf=kwarmd.service took the socket down with every stop or
 * restart of the service, against the README; StateDirectory= was
 * created and never used; the cache was not readable by group kwarm. */
Test(install, the_socket_outlives_the_service_and_the_group_reads_the_cache,
     .init = setup, .fini = teardown)
{
    install();
    char path[256];
    snprintf(path, sizeof path, "%s/lib/systemd/system/kwarmd.socket", prefix);
    char *sock = kw_test_read_file(path, NULL);
    snprintf(path, sizeof path, "%s/lib/systemd/system/kwarmd.service", prefix);
    char *svc = kw_test_read_file(path, NULL);
    cr_assert(sock && svc, "units not installed under %s", prefix);
    cr_expect(!unit_has(sock, "PartOf=") && !unit_has(sock, "BindsTo="),
              "kwarmd.socket stops with the service:\n%s", sock);
    cr_expect(!unit_has(svc, "StateDirectory="), "unused StateDirectory=");
    cr_expect(unit_has(svc, "UMask=0027") &&
              unit_has(svc, "CacheDirectoryMode=2750"),
              "the cache is not group-readable:\n%s", svc);
    free(sock);
    free(svc);
}

/* Issue 24: make install installs the bash completion and the man pages. */
Test(install, completion_and_man_pages_are_installed, .init = setup,
     .fini = teardown)
{
    install();
    static const char *const files[] = {
        "share/bash-completion/completions/kwarm", "share/man/man1/kwarm.1",
        "share/man/man8/kwarmd.8"};
    for (size_t i = 0; i < sizeof files / sizeof *files; i++) {
        char path[256];
        snprintf(path, sizeof path, "%s/%s", prefix, files[i]);
        cr_expect_eq(access(path, R_OK), 0, "%s: %s", path, strerror(errno));
    }
}
