/* test_cache_claim.c: claims on digests across processes (issue 24, Done
 * when 3): a claim excludes every other claim of its digest, in this
 * process or another, a holder killed by SIGKILL releases its claims, a
 * wait ends when asked to, and a cache whose claims file cannot be made
 * still works, without claims, and says why.
 *
 * A child reports each step through a pipe (one byte), so the parent
 * acts on what the child did, never on time. */
#include <criterion/criterion.h>
#include <errno.h>
#include <signal.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kw_cache.h"
#include "kw_err.h"
#include "kw_test_util.h"
#include "test_cache_util.h"

static char dir[256];

static void setup(void)
{
    cr_assert_eq(kw_test_mkdtemp(dir, sizeof dir, "cache-claim"), 0);
}

static void teardown(void)
{
    kw_test_rmtree(dir);
}

TestSuite(claim, .init = setup, .fini = teardown);

/* Claims digest i on c; returns the code, *cl the claim. */
static int take(kw_cache *c, uint64_t i, bool wait, kw_cache_claim **cl)
{
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(i, d);
    return kw_cache_claim_take(c, d, wait, NULL, NULL, cl);
}

Test(claim, a_claim_excludes_its_digest_only_until_dropped)
{
    kw_cache *c = tc_open(dir, 8u << 20, false);
    cr_assert_null(kw_cache_claims_note(c));
    kw_cache_claim *a = NULL, *b = NULL, *other = NULL;
    cr_assert_eq(take(c, 1, false, &a), 0);
    cr_assert_not_null(a);
    cr_expect_eq(take(c, 1, false, &b), -EAGAIN, "one digest, two claims");
    cr_expect_null(b);
    cr_expect_eq(take(c, 2, false, &other), 0, "another digest is free");
    cr_expect_not_null(other);
    kw_cache_claim_drop(a);
    cr_expect_eq(take(c, 1, false, &b), 0, "free again once dropped");
    cr_expect_not_null(b);
    kw_cache_claim_drop(b);
    kw_cache_claim_drop(other);
    kw_cache_claim_drop(NULL);
    kw_cache_close(c);
}

/* Stops a wait once it has been asked n times. */
static bool stop_after(void *arg)
{
    int *n = arg;
    return --*n <= 0;
}

Test(claim, a_wait_ends_when_stop_says_so)
{
    kw_cache *c = tc_open(dir, 8u << 20, false);
    kw_cache_claim *a = NULL, *b = NULL;
    cr_assert_eq(take(c, 7, false, &a), 0);
    uint8_t d[KW_CACHE_DIGEST_LEN];
    tc_digest(7, d);
    int asked = 3;
    cr_expect_eq(kw_cache_claim_take(c, d, true, stop_after, &asked, &b),
                 -ECANCELED);
    cr_expect_eq(asked, 0, "asked between tries until it said stop");
    cr_expect_null(b);
    kw_cache_claim_drop(a);
    kw_cache_close(c);
}

/* The child: claims digests 10 and 11, says so on fd, then waits to be
 * killed.  Exit 1 when a claim fails. */
static void holder_child(int fd)
{
    kw_cache *c = tc_open(dir, 8u << 20, false);
    kw_cache_claim *a = NULL, *b = NULL;
    if (take(c, 10, false, &a) != 0 || take(c, 11, false, &b) != 0 ||
        a == NULL || b == NULL)
        _exit(1);
    char one = 1;
    if (write(fd, &one, 1) != 1)
        _exit(2);
    for (;;)
        pause();
}

Test(claim, a_holder_killed_by_sigkill_releases_its_claims)
{
    int p[2];
    cr_assert_eq(pipe(p), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        close(p[0]);
        holder_child(p[1]);
    }
    close(p[1]);
    char got = 0;
    cr_assert_eq(read(p[0], &got, 1), 1, "the holder never claimed");
    kw_cache *c = tc_open(dir, 8u << 20, false);
    kw_cache_claim *a = NULL, *b = NULL;
    cr_expect_eq(take(c, 10, false, &a), -EAGAIN, "held by another process");
    cr_expect_eq(take(c, 12, false, &b), 0, "a digest it does not hold");
    kw_cache_claim_drop(b);
    cr_assert_eq(kill(pid, SIGKILL), 0);
    int ws;
    cr_assert_eq(waitpid(pid, &ws, 0), pid);
    cr_assert(WIFSIGNALED(ws), "holder exit 0x%x", ws);
    cr_expect_eq(take(c, 10, true, &a), 0, "the dead holder's claim");
    cr_expect_eq(take(c, 11, false, &b), 0, "and its other one");
    kw_cache_claim_drop(a);
    kw_cache_claim_drop(b);
    kw_cache_close(c);
    close(p[0]);
}

Test(claim, a_read_only_handle_takes_no_claims_and_needs_none)
{
    kw_cache_close(tc_open(dir, 8u << 20, false));
    kw_cache *c = tc_open(dir, 8u << 20, true);
    kw_cache_claim *a = (kw_cache_claim *)&a;
    cr_expect_eq(take(c, 1, false, &a), 0);
    cr_expect_null(a, "no claim from a handle that compiles nothing");
    cr_expect_null(kw_cache_claims_note(c));
    kw_cache_close(c);
}

Test(claim, no_claims_file_leaves_a_working_cache_and_a_note_naming_it)
{
    /* A directory where the file goes: open(O_RDWR) fails, as for root,
     * whom permissions do not stop, as for anyone. */
    char path[300];
    snprintf(path, sizeof path, "%s/claims", dir);
    cr_assert_eq(mkdir(path, 0700), 0);
    kw_cache *c = tc_open(dir, 8u << 20, false);
    const char *note = kw_cache_claims_note(c);
    cr_assert_not_null(note);
    cr_expect(strstr(note, path) != NULL, "note: %s", note);
    kw_cache_claim *a = (kw_cache_claim *)&a;
    cr_expect_eq(take(c, 1, false, &a), 0);
    cr_expect_null(a, "unclaimed, and the caller goes on");
    cr_expect(tc_put(c, 1, 1000, false), "the cache itself works");
    cr_expect_eq(tc_get_check(c, 1, 1000), 0);
    kw_cache_close(c);
}
