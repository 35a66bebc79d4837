/* test_cli_readonly.c: `kwarm get`, `ls` and `stats` with --cache on a
 * cache the user cannot write (issue 12 point 4): as `nobody` on a root
 * cache of mode 0755, and on a read-only bind mount (both root only;
 * skipped otherwise).  Also what get does
 * on a miss (point 10): by family, fields and arch it compiles and stores;
 * by digest it cannot, and says so with a hint; on a read-only cache it
 * never compiles.  And the 16 hex digits `kwarm keys` prints work as
 * --digest (point 6).
 */
#define _DEFAULT_SOURCE /* setgroups */
#include <fcntl.h>
#include <grp.h>
#include <pwd.h>
#include <sys/mount.h>
#include <sys/wait.h>

#include "cli_util.h"
#include "kw_cache.h"

static char cache[128];

static void setup(void)
{
    tmp_setup();
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
}

static void teardown(void)
{
    tmp_teardown();
}

/* The first key of `kwarm keys --model V32 --json`: its digest (64 hex),
 * and --fields text for get. */
static void first_key(char hex[65], char *fields, size_t cap)
{
    result r = kwarm(ARGS("keys", "--model", V32, "--json"));
    cr_assert_eq(r.status, 0, "%s", r.err);
    cJSON *doc = cJSON_Parse(r.out);
    const cJSON *k = cJSON_GetArrayItem(cJSON_GetObjectItem(doc, "keys"), 0);
    cr_assert_str_eq(cJSON_GetObjectItem(k, "family")->valuestring,
                     "prefill_chunk_metadata");
    snprintf(hex, 65, "%s", cJSON_GetObjectItem(k, "digest")->valuestring);
    fields[0] = '\0';
    const cJSON *f;
    cJSON_ArrayForEach(f, cJSON_GetObjectItem(k, "fields")) {
        size_t n = strlen(fields);
        if (cJSON_IsBool(f))
            snprintf(fields + n, cap - n, "%s%s=%s", n ? "," : "", f->string,
                     cJSON_IsTrue(f) ? "true" : "false");
        else
            snprintf(fields + n, cap - n, "%s%s=%.0f", n ? "," : "", f->string,
                     f->valuedouble);
    }
    cJSON_Delete(doc);
    result_free(&r);
}

/* Makes the cache with one made-up entry under digest hex. */
static void fill(const char *hex)
{
    kw_cache_opts o = {.dir = cache};
    kw_cache *c = NULL;
    char err[256];
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), 0, "%s", err);
    uint8_t d[KW_CACHE_DIGEST_LEN], blob[4096];
    for (size_t i = 0; i < sizeof d; i++)
        cr_assert_eq(sscanf(hex + 2 * i, "%2hhx", &d[i]), 1);
    memset(blob, 0x42, sizeof blob);
    kw_cache_info info = {.family = "prefill_chunk_metadata", .arch = "sm_90",
                          .entry = "kw_k_made_up", .nvrtc = "13.0", .nfields = 8};
    cr_assert_eq(kw_cache_put(c, d, &info, blob, sizeof blob, false, NULL), 0);
    kw_cache_close(c);
}

Test(cli_readonly, keys_16_digits_are_a_digest_prefix, .init = setup,
     .fini = teardown)
{
    char hex[65], fields[512], out[200], short16[17];
    first_key(hex, fields, sizeof fields);
    fill(hex);
    snprintf(short16, sizeof short16, "%.16s", hex);
    snprintf(out, sizeof out, "%s/k.cubin", tmpdir);
    result r = kwarm(ARGS("get", "--digest", short16, "--cache", cache, "-o", out));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.out, "4096 bytes") != NULL, "%s", r.out);
    result_free(&r);
    expect_bad_input("not hex", ARGS("get", "--digest", "xyzxyzxyz", "--cache",
                                     cache, "-o", out), NEEDLES("--digest"));
}

Test(cli_readonly, get_by_digest_miss_says_a_digest_cannot_be_compiled,
     .init = setup, .fini = teardown)
{
    char hex[65], fields[512], out[200];
    first_key(hex, fields, sizeof fields);
    fill("00000000000000000000000000000000000000000000000000000000000000ff");
    snprintf(out, sizeof out, "%s/k.cubin", tmpdir);
    result r = kwarm(ARGS("get", "--digest", hex, "--cache", cache, "-o", out));
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "not cached") && strstr(r.err, "cannot be compiled") &&
              strstr(r.err, "--family, --fields and --arch"), "%s", r.err);
    cr_expect_eq(lines(r.err), 1, "%s", r.err);
    result_free(&r);
    cr_expect_eq(access(out, F_OK), -1, "a miss wrote -o");
}

Test(cli_readonly, get_by_key_compiles_a_miss_and_stores_it, .init = setup,
     .fini = teardown)
{
    char hex[65], fields[512], out[200];
    first_key(hex, fields, sizeof fields);
    fill("00000000000000000000000000000000000000000000000000000000000000ff");
    snprintf(out, sizeof out, "%s/k.cubin", tmpdir);
    result r = kwarm(ARGS("get", "--family", "prefill_chunk_metadata", "--fields",
                          fields, "--arch", "sm_90", "--cache", cache,
                          "--no-compile", "-o", out));
    cr_expect_eq(r.status, 1, "--no-compile compiled: %s", r.err);
    result_free(&r);
    r = kwarm(ARGS("get", "--family", "prefill_chunk_metadata", "--fields",
                   fields, "--arch", "sm_90", "--cache", cache, "-o", out));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.err, "compiled") != NULL, "%s", r.err);
    result_free(&r);
    size_t len = 0;
    char *cubin = kw_test_read_file(out, &len);
    cr_assert_not_null(cubin);
    cr_expect_eq(kw_test_elf_machine((const uint8_t *)cubin, len), 190);
    free(cubin);
    /* Stored under the digest kwarm keys printed. */
    r = kwarm(ARGS("get", "--digest", hex, "--cache", cache, "-o", out));
    cr_expect_eq(r.status, 0, "%s", r.err);
    result_free(&r);
}

/* ---- as nobody ---------------------------------------------------------- */

/* A copy of the kwarm binary in tmpdir (mode 0755): the build tree may lie
 * under a directory nobody cannot enter (a home of mode 0700). */
static const char *kwarm_copy(void)
{
    static char path[200];
    snprintf(path, sizeof path, "%s/kwarm", tmpdir);
    size_t len = 0;
    char *bin = kw_test_read_file(KW_KWARM_BIN, &len);
    cr_assert_not_null(bin, "%s: %s", KW_KWARM_BIN, strerror(errno));
    int fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0755);
    cr_assert(fd >= 0 && write(fd, bin, len) == (ssize_t)len && close(fd) == 0,
              "%s: %s", path, strerror(errno));
    free(bin);
    return path;
}

/* Runs kwarm args as nobody:nogroup; stdout and stderr go to files in
 * tmpdir opened here (as root), read back into the result.  Exit 126: the
 * child could not become nobody; 127: it could not run the binary. */
static result kwarm_as_nobody(const char *const *args)
{
    struct passwd *pw = getpwnam("nobody");
    cr_assert_not_null(pw, "no user nobody");
    char outp[200], errp[200];
    snprintf(outp, sizeof outp, "%s/nobody.out", tmpdir);
    snprintf(errp, sizeof errp, "%s/nobody.err", tmpdir);
    int out = open(outp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    int err = open(errp, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    cr_assert(out >= 0 && err >= 0);
    const char *bin = kwarm_copy();
    const char *argv[MAX_ARGS + 2] = {bin};
    size_t n = 0;
    for (; args[n] != NULL; n++)
        argv[n + 1] = args[n];
    argv[n + 1] = NULL;
    fflush(NULL);
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        if (setgroups(0, NULL) < 0 || setgid(pw->pw_gid) < 0 ||
            setuid(pw->pw_uid) < 0 || dup2(out, 1) < 0 || dup2(err, 2) < 0)
            _exit(126);
        execv(bin, (char *const *)argv);
        _exit(127);
    }
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    close(out);
    close(err);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 127)
        cr_skip_test("nobody cannot run %s (a noexec /tmp?)", bin);
    result r = {WIFEXITED(st) ? WEXITSTATUS(st) : -1,
                kw_test_read_file(outp, NULL), kw_test_read_file(errp, NULL)};
    cr_assert(r.out && r.err);
    return r;
}

/* chmod every file under the cache (and tmpdir) to a+rX, nothing writable
 * by others: another user's world-readable cache. */
static void share_read_only(void)
{
    char cmd[400];
    snprintf(cmd, sizeof cmd, "chmod 0755 '%s' '%s' && chmod 0644 '%s'/*",
             tmpdir, cache, cache);
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    cr_assert_eq(kw_test_run(argv, NULL, NULL), 0);
}

Test(cli_readonly, nobody_reads_a_root_cache_it_cannot_write, .init = setup,
     .fini = teardown)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to run a command as nobody");
    char hex[65], fields[512];
    first_key(hex, fields, sizeof fields);
    fill(hex);
    share_read_only();
    result r = kwarm_as_nobody(ARGS("get", "--digest", hex, "--cache", cache,
                                    "-o", "-"));
    cr_expect_eq(r.status, 0, "get: %s", r.err);
    cr_expect(r.out[0] == 0x42 && strlen(r.out) == 4096, "get wrote %zu bytes",
              strlen(r.out));
    result_free(&r);

    r = kwarm_as_nobody(ARGS("ls", "--cache", cache, "--json"));
    cr_expect_eq(r.status, 0, "ls: %s", r.err);
    cJSON *doc = cJSON_Parse(r.out);
    cr_expect_eq(cJSON_GetObjectItem(doc, "count")->valueint, 1, "%s", r.out);
    cJSON_Delete(doc);
    result_free(&r);

    r = kwarm_as_nobody(ARGS("stats", "--cache", cache, "--json"));
    cr_expect_eq(r.status, 0, "stats: %s", r.err);
    doc = cJSON_Parse(r.out);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(doc, "read_only")), "%s", r.out);
    cr_expect_eq(cJSON_GetObjectItem(doc, "entries")->valueint, 1);
    cJSON_Delete(doc);
    result_free(&r);

    /* A miss by key is never compiled on a read-only cache. */
    r = kwarm_as_nobody(ARGS("get", "--family", "dcp_stable_topk", "--fields",
                             "topk=2048,num_candidates=16384", "--arch", "sm_90",
                             "--cache", cache, "-o", "-"));
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "read-only") != NULL, "%s", r.err);
    result_free(&r);
    /* Writers refuse, saying why. */
    r = kwarm_as_nobody(ARGS("evict", "--cache", cache, "--unpinned"));
    cr_expect_eq(r.status, 1, "%s", r.err);
    result_free(&r);
    struct stat st;
    cr_assert_eq(stat(cache, &st), 0);
    cr_expect_eq(st.st_uid, 0);
}

/* ---- on a read-only mount ----------------------------------------------- */

static char mnt[200];

static void teardown_mount(void)
{
    if (mnt[0] != '\0')
        umount2(mnt, MNT_DETACH);
    mnt[0] = '\0';
    tmp_teardown();
}

Test(cli_readonly, readers_serve_from_a_read_only_mount, .init = setup,
     .fini = teardown_mount)
{
    if (geteuid() != 0)
        cr_skip_test("needs root to mount");
    char hex[65], fields[512], ro[200];
    first_key(hex, fields, sizeof fields);
    fill(hex);
    snprintf(ro, sizeof ro, "%s/ro", tmpdir);
    cr_assert_eq(mkdir(ro, 0755), 0);
    if (mount(cache, ro, NULL, MS_BIND, NULL) != 0)
        cr_skip_test("bind mount refused: %s", strerror(errno));
    snprintf(mnt, sizeof mnt, "%s", ro);
    cr_assert_eq(mount(NULL, ro, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL), 0,
                 "remount read-only: %s", strerror(errno));
    cr_assert_eq(access(ro, W_OK), -1, "the mount is writable");

    result r = kwarm(ARGS("get", "--digest", hex, "--cache", ro, "-o", "-"));
    cr_expect_eq(r.status, 0, "get: %s", r.err);
    cr_expect(r.out[0] == 0x42, "get did not write the cubin");
    result_free(&r);
    r = kwarm(ARGS("ls", "--cache", ro));
    cr_expect(r.status == 0 && strstr(r.out, "1 entries"), "ls: %s%s", r.out, r.err);
    result_free(&r);
    r = kwarm(ARGS("stats", "--cache", ro, "--json"));
    cr_expect_eq(r.status, 0, "stats: %s", r.err);
    cJSON *doc = cJSON_Parse(r.out);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItem(doc, "read_only")), "%s", r.out);
    cJSON_Delete(doc);
    result_free(&r);
    r = kwarm(ARGS("get", "--family", "dcp_stable_topk", "--fields",
                   "topk=2048,num_candidates=16384", "--arch", "sm_90",
                   "--cache", ro, "-o", "-"));
    cr_expect_eq(r.status, 1);
    cr_expect(strstr(r.err, "read-only") != NULL, "%s", r.err);
    result_free(&r);
    r = kwarm(ARGS("resize", "--cache", ro, "2G"));
    cr_expect_eq(r.status, 1, "resize on a read-only mount: %s", r.err);
    result_free(&r);
}
