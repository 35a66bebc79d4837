/* test_daemon_readonly.c: kwarmd on a cache it may not write (issue 12
 * point 4): --read-only, and on its own when the directory is not
 * writable (kwarmd as nobody on root's 0755 cache).  Hits are served, a
 * miss is "not cached (read-only cache)" and never compiled, stats says
 * read_only, and the cache is left as it was. */
#include "daemon_util.h"

#include <pwd.h>
#include <sys/mount.h>

/* Each test's daemons are killed and their directories removed. */
TestSuite(daemon_readonly, .fini = kwd_cleanup);

#define V32 KW_FIXTURES "/deepseek-v3.2-exp.json"

/* A cache of V32 prewarmed by us (root), readable by all. */
static void prewarm(const char *cache)
{
    const char *pw[] = {"prewarm", "--model", V32, "--cache", cache, "--quiet", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_kwarm(pw, &out, &err), 0, "%s", err);
    free(out);
    free(err);
    cr_assert_eq(chmod(cache, 0755), 0);
    char cmd[400];
    snprintf(cmd, sizeof cmd, "chmod -R a+rX '%s'", cache);
    cr_assert_eq(system(cmd), 0);
}

/* What a read-only kwarmd must do, over c. */
static void expect_read_only(kwc *c, const char *cache)
{
    const char *ls[] = {"ls", "--cache", cache, "--json", NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_kwarm(ls, &out, &err), 0, "%s", err);
    cJSON *doc = cJSON_Parse(out);
    const char *hex = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(
        cJSON_GetArrayItem(cJSON_GetObjectItemCaseSensitive(doc, "entries"), 0),
        "digest"));
    cJSON *g = cJSON_CreateObject();
    cJSON_AddStringToObject(g, "digest", hex);
    kwr r = kwc_call(c, KW_PROTO_GET, g, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "a hit on a read-only cache");
    kwr_free(&r);
    /* A key nobody warmed, by family and fields: not compiled. */
    cJSON *m = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(m, "fields");
    cJSON_AddStringToObject(m, "family", "dcp_stable_topk");
    cJSON_AddNumberToObject(f, "topk", 2048);
    cJSON_AddNumberToObject(f, "num_candidates", 12288);
    cJSON_AddStringToObject(m, "arch", "sm_90");
    r = kwc_call(c, KW_PROTO_GET, m, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, "a miss on a read-only cache");
    cr_expect_str_eq(kwr_str(&r, "code"), "KW_EROFS");
    cr_expect(strstr(kwr_str(&r, "error"), "not cached (read-only cache)"), "%s",
              kwr_str(&r, "error"));
    kwr_free(&r);
    kwr st = kwc_call(c, KW_PROTO_STATS, NULL, NULL);
    cr_expect(cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(st.hdr, "read_only")));
    cr_expect_eq(kwr_num(&st, "compiles_started"), 0, "nothing compiled");
    cr_expect_eq(kwr_num(&st, "entries"), cJSON_GetArraySize(
                     cJSON_GetObjectItemCaseSensitive(doc, "entries")));
    kwr_free(&st);
    cJSON_Delete(g);
    cJSON_Delete(m);
    cJSON_Delete(doc);
    free(out);
    free(err);
}

/* Connects to the started d, checks it is read-only, stops it, and finds
 * needle (why it is read-only) in its log. */
static void expect_read_only_daemon(kwd *d, const char *needle)
{
    kwc c;
    kwc_must_open(&c, d->sock);
    expect_read_only(&c, d->cache);
    kwd_down(d, &c);
    char *log = kwd_log(d->log);
    cr_expect(strstr(log, needle) != NULL, "%s", log);
    free(log);
}

Test(daemon_readonly, read_only_flag_serves_hits_and_compiles_nothing)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd d;
    kwd_init(&d, "kwro-flag");
    prewarm(d.cache);
    kwd_start(&d, 1, (const char *const[]){"--read-only", NULL});
    expect_read_only_daemon(&d, "is read-only (--read-only)");
}

Test(daemon_readonly, a_cache_it_cannot_write_makes_kwarmd_read_only)
{
    if (geteuid() != 0)
        cr_skip_test("not root: cannot run kwarmd as nobody");
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    struct passwd *pw = getpwnam("nobody");
    cr_assert_not_null(pw);
    kwd d;
    kwd_init(&d, "kwro-nobody");
    prewarm(d.cache);
    /* nobody needs its socket's directory and the notify socket. */
    cr_assert_eq(chmod(d.dir, 0777), 0);
    cr_assert_eq(chmod(d.notify, 0777), 0);
    const char *args[] = {"--socket", d.sock, "--cache", d.cache, "--jobs", "1",
                          NULL};
    char uid[16];
    snprintf(uid, sizeof uid, "%u", (unsigned)pw->pw_uid);
    cr_assert_eq(setenv("KWD_TEST_AS_UID", uid, 1), 0);
    d.pid = kwd_spawn(&d, args, d.log);
    kwd_wait_ready(&d);
    expect_read_only_daemon(&d, "is read-only (not writable here)");
}

/* ---- on a read-only bind mount (root only) -------------------------------- */

static char mnt[300];

static void umount_ro(void)
{
    if (mnt[0] != '\0')
        umount2(mnt, MNT_DETACH);
    mnt[0] = '\0';
    kwd_cleanup(); /* the directory, once nothing is mounted in it */
}

Test(daemon_readonly, a_read_only_mount_makes_kwarmd_read_only, .fini = umount_ro)
{
    if (geteuid() != 0)
        cr_skip_test("not root: cannot mount");
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd d;
    kwd_init(&d, "kwro-mount");
    char ro[200];
    snprintf(ro, sizeof ro, "%s/ro", d.dir);
    prewarm(d.cache);
    cr_assert_eq(mkdir(ro, 0755), 0);
    if (mount(d.cache, ro, NULL, MS_BIND, NULL) != 0)
        cr_skip_test("bind mount refused: %s", strerror(errno));
    snprintf(mnt, sizeof mnt, "%s", ro);
    cr_assert_eq(mount(NULL, ro, NULL, MS_REMOUNT | MS_BIND | MS_RDONLY, NULL), 0,
                 "remount read-only: %s", strerror(errno));
    cr_assert_eq(access(ro, W_OK), -1, "the mount is writable");
    /* kwarmd --cache ro, no --read-only: it must notice on its own. */
    snprintf(d.cache, sizeof d.cache, "%s", ro);
    kwd_start(&d, 1, NULL);
    expect_read_only_daemon(&d, "is read-only (not writable here)");
}
