/* test_cli_output.c: where `kwarm get --cache DIR -o PATH` writes (issue 12
 * point 7).  A regular file is replaced atomically; a FIFO and a character
 * device are written in place (as root, /dev/null stays a device); "-" is
 * standard output and refused on a terminal; a directory is refused.
 *
 * The cache holds one entry put through the library (a made-up 100 KiB
 * blob, larger than a pipe's buffer), so no compile is needed.
 */
#define _XOPEN_SOURCE 700 /* posix_openpt, ptsname */
#include <fcntl.h>
#include <signal.h>
#include <stdint.h>
#include <sys/sysmacros.h>
#include <sys/wait.h>

#include "cli_util.h"
#include "kw_cache.h"

#define BLOB_LEN (100u * 1024)

static char cache[128], hex[65];
static uint8_t blob[BLOB_LEN];

/* A temporary directory with a cache holding one entry, its digest in hex. */
static void setup(void)
{
    tmp_setup();
    snprintf(cache, sizeof cache, "%s/cache", tmpdir);
    kw_cache_opts o = {.dir = cache};
    kw_cache *c = NULL;
    char err[256];
    cr_assert_eq(kw_cache_open(&c, &o, err, sizeof err), 0, "%s", err);
    uint8_t digest[KW_CACHE_DIGEST_LEN];
    for (size_t i = 0; i < sizeof digest; i++)
        digest[i] = (uint8_t)(0xa0 + i);
    for (size_t i = 0; i < sizeof blob; i++)
        blob[i] = (uint8_t)(i * 31 + 7);
    kw_cache_info info = {.family = "prefill_chunk_metadata", .arch = "sm_90",
                          .entry = "kw_k_made_up", .nvrtc = "13.0"};
    cr_assert_eq(kw_cache_put(c, digest, &info, blob, sizeof blob, false, NULL), 0);
    kw_cache_close(c);
    for (size_t i = 0; i < sizeof digest; i++)
        snprintf(hex + 2 * i, 3, "%02x", digest[i]);
}

static void teardown(void)
{
    tmp_teardown();
}

/* Checks that path holds exactly the blob. */
static void expect_blob_at(const char *path)
{
    size_t len = 0;
    char *got = kw_test_read_file(path, &len);
    cr_assert_not_null(got, "%s: %s", path, strerror(errno));
    cr_expect(len == sizeof blob && memcmp(got, blob, len) == 0,
              "%s: %zu bytes, not the cached blob", path, len);
    free(got);
}

/* Starts kwarm get -o out with stdout on out_fd (-1: inherited). */
static pid_t spawn_get(const char *out, int out_fd)
{
    pid_t pid = fork();
    cr_assert_neq(pid, -1);
    if (pid == 0) {
        if (out_fd >= 0 && dup2(out_fd, STDOUT_FILENO) < 0)
            _exit(126);
        execl(KW_KWARM_BIN, KW_KWARM_BIN, "get", "--digest", hex, "--cache",
              cache, "-o", out, (char *)NULL);
        _exit(127);
    }
    return pid;
}

static int wait_exit(pid_t pid)
{
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    cr_assert(WIFEXITED(st), "kwarm died of a signal");
    return WEXITSTATUS(st);
}

Test(cli_output, regular_and_absent_files_are_replaced_whole, .init = setup,
     .fini = teardown)
{
    char *path = tmp_file("old.cubin", "old contents", 12);
    result r = kwarm(ARGS("get", "--digest", hex, "--cache", cache, "-o", path));
    cr_expect_eq(r.status, 0, "%s", r.err);
    cr_expect(strstr(r.out, path) != NULL, "summary lacks the path: %s", r.out);
    expect_blob_at(path);
    result_free(&r);
    char fresh[200];
    snprintf(fresh, sizeof fresh, "%s/new.cubin", tmpdir);
    r = kwarm(ARGS("get", "--digest", hex, "--cache", cache, "-o", fresh));
    cr_expect_eq(r.status, 0, "%s", r.err);
    expect_blob_at(fresh);
    result_free(&r);
    free(path);
}

Test(cli_output, fifo_is_written_in_place, .init = setup, .fini = teardown)
{
    char fifo[200];
    snprintf(fifo, sizeof fifo, "%s/pipe", tmpdir);
    cr_assert_eq(mkfifo(fifo, 0600), 0, "mkfifo: %s", strerror(errno));
    int devnull = open("/dev/null", O_WRONLY);
    pid_t pid = spawn_get(fifo, devnull);
    close(devnull);
    /* Blocks until kwarm opens the FIFO for writing, then reads to EOF. */
    int fd = open(fifo, O_RDONLY);
    cr_assert_geq(fd, 0);
    static uint8_t got[BLOB_LEN + 1];
    size_t n = 0;
    for (ssize_t r; (r = read(fd, got + n, sizeof got - n)) != 0;) {
        cr_assert(r > 0 || errno == EINTR, "read: %s", strerror(errno));
        if (r > 0)
            n += (size_t)r;
    }
    close(fd);
    cr_expect_eq(wait_exit(pid), 0);
    cr_expect(n == sizeof blob && memcmp(got, blob, n) == 0, "read %zu bytes", n);
    struct stat st;
    cr_assert_eq(stat(fifo, &st), 0);
    cr_expect(S_ISFIFO(st.st_mode), "the FIFO was replaced");
}

/* /dev/null, and as root a null device made with mknod: each is still a
 * character device afterwards (renaming over it would make it a file). */
Test(cli_output, character_devices_stay_devices, .init = setup, .fini = teardown)
{
    char node[200];
    snprintf(node, sizeof node, "%s/null", tmpdir);
    bool root = geteuid() == 0;
    if (root)
        cr_assert_eq(mknod(node, S_IFCHR | 0666, makedev(1, 3)), 0,
                     "mknod: %s", strerror(errno));
    const char *paths[] = {"/dev/null", root ? node : NULL};
    for (size_t i = 0; i < N(paths) && paths[i] != NULL; i++) {
        result r = kwarm(ARGS("get", "--digest", hex, "--cache", cache, "-o",
                              paths[i]));
        cr_expect_eq(r.status, 0, "%s: %s", paths[i], r.err);
        struct stat st;
        cr_assert_eq(stat(paths[i], &st), 0);
        cr_expect(S_ISCHR(st.st_mode) && st.st_rdev == makedev(1, 3),
                  "%s is no longer the null device", paths[i]);
        result_free(&r);
    }
    if (!root)
        cr_log_warn("not root: only /dev/null checked (no write access to "
                    "replace it anyway)");
}

Test(cli_output, dash_and_dev_stdout_write_stdout, .init = setup,
     .fini = teardown)
{
    const char *outs[] = {"-", "/dev/stdout"};
    for (size_t i = 0; i < N(outs); i++) {
        char *out = NULL, *err = NULL;
        const char *argv[] = {KW_KWARM_BIN, "get", "--digest", hex, "--cache",
                              cache, "-o", outs[i], NULL};
        cr_expect_eq(kw_test_run(argv, &out, &err), 0, "%s: %s", outs[i], err);
        cr_assert_not_null(out);
        /* kw_test_run() NUL-terminates: compare the bytes before it. */
        cr_expect(memcmp(out, blob, sizeof blob) == 0 && out[sizeof blob] == '\0',
                  "-o %s: stdout is not the cubin alone", outs[i]);
        cr_expect(err && strstr(err, "102400 bytes") != NULL,
                  "-o %s: summary not on stderr: %s", outs[i], err);
        free(out);
        free(err);
    }
    char dash[200];
    snprintf(dash, sizeof dash, "%s/-", tmpdir);
    cr_expect_eq(access(dash, F_OK), -1, "a file named '-' was written");
}

Test(cli_output, dash_is_refused_when_stdout_is_a_terminal, .init = setup,
     .fini = teardown)
{
    int master = posix_openpt(O_RDWR | O_NOCTTY);
    cr_assert_geq(master, 0, "posix_openpt: %s", strerror(errno));
    cr_assert(grantpt(master) == 0 && unlockpt(master) == 0);
    int slave = open(ptsname(master), O_RDWR | O_NOCTTY);
    cr_assert_geq(slave, 0);
    pid_t pid = spawn_get("-", slave);
    close(slave);
    /* Drain the terminal so a wrong write could never block kwarm. */
    char buf[4096];
    size_t got = 0;
    for (ssize_t r; (r = read(master, buf, sizeof buf)) != 0;) {
        if (r < 0 && errno == EINTR)
            continue;
        if (r < 0) /* EIO: every slave end is closed, kwarm has exited */
            break;
        got += (size_t)r;
    }
    close(master);
    cr_expect_eq(wait_exit(pid), 2);
    cr_expect_eq(got, 0, "%zu bytes reached the terminal", got);
}

Test(cli_output, directory_is_refused, .init = setup, .fini = teardown)
{
    expect_bad_input("directory", ARGS("get", "--digest", hex, "--cache", cache,
                                       "-o", tmpdir),
                     NEEDLES("is a directory"));
    struct stat st;
    cr_assert_eq(stat(tmpdir, &st), 0);
    cr_expect(S_ISDIR(st.st_mode));
}

/* kwarm get reads its flags the same way through --cache and --socket
 * (one parser): a flag given twice, a missing -o and a directory for -o
 * are refused before any work, with exit 2, both ways. */
Test(cli_output, get_flags_are_checked_alike_through_cache_and_socket,
     .init = setup, .fini = teardown)
{
    static const char *const where[][2] = {{"--cache", NULL},
                                          {"--socket", "/nonexistent/kw.sock"}};
    for (int w = 0; w < 2; w++) {
        const char *place = w == 0 ? cache : where[w][1];
        expect_bad_input("twice", ARGS("get", "--digest", hex, "--digest", hex,
                                       where[w][0], place, "-o", "/tmp/kw-x"),
                         NEEDLES("--digest: given more than once"));
        expect_bad_input("no -o", ARGS("get", "--digest", hex, where[w][0], place),
                         NEEDLES("-o: required"));
        expect_bad_input("directory", ARGS("get", "--digest", hex, where[w][0],
                                           place, "-o", tmpdir),
                         NEEDLES("is a directory"));
    }
}
