/* test_pool_frame.c: the pipe protocol between warm/'s pool and
 * kwarm-compile (pool.h): one negative test per parser rule, and how the
 * helper ends on EOF and on a malformed request (issue 10, point 2). */
#include <criterion/criterion.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "kw_err.h"
#include "kw_keys.h"
#include "kw_test_util.h"
#include "pool.h"
#include "pool_frame.h"
#include "pool_util.h"

static uint32_t hdr_len_of(uint16_t type, uint32_t len, int *rc)
{
    uint8_t b[KW__POOL_HDR_LEN];
    uint32_t got = 0;
    kw__pool_hdr_put(b, type, len);
    *rc = kw__pool_hdr_parse(b, type, &got);
    return got;
}

Test(pool_frame, header_round_trips_and_checks_magic_version_type)
{
    uint8_t b[KW__POOL_HDR_LEN];
    uint32_t len;
    int rc;
    cr_assert_eq(hdr_len_of(KW__POOL_T_REQUEST, KW__POOL_REQ_LEN, &rc),
                 KW__POOL_REQ_LEN);
    cr_assert_eq(rc, 0);
    kw__pool_hdr_put(b, KW__POOL_T_REQUEST, KW__POOL_REQ_LEN);
    b[0] ^= 1;
    cr_assert_eq(kw__pool_hdr_parse(b, KW__POOL_T_REQUEST, &len), KW_EPROTO);
    kw__pool_hdr_put(b, KW__POOL_T_REQUEST, KW__POOL_REQ_LEN);
    b[4] = KW__POOL_VERSION + 1;
    cr_assert_eq(kw__pool_hdr_parse(b, KW__POOL_T_REQUEST, &len), KW_EPROTO);
    kw__pool_hdr_put(b, KW__POOL_T_REQUEST, KW__POOL_REQ_LEN);
    cr_assert_eq(kw__pool_hdr_parse(b, KW__POOL_T_RESPONSE, &len), KW_EPROTO);
}

Test(pool_frame, header_lengths_are_exact_or_capped)
{
    int rc;
    hdr_len_of(KW__POOL_T_HELLO, KW__POOL_HELLO_LEN + 1, &rc);
    cr_assert_eq(rc, KW_EPROTO);
    hdr_len_of(KW__POOL_T_REQUEST, KW__POOL_REQ_LEN - 1, &rc);
    cr_assert_eq(rc, KW_EPROTO);
    hdr_len_of(KW__POOL_T_RESPONSE, KW__POOL_RESP_FIXED - 1, &rc);
    cr_assert_eq(rc, KW_EPROTO);
    hdr_len_of(KW__POOL_T_RESPONSE, KW__POOL_MAX_RESP + 1, &rc);
    cr_assert_eq(rc, KW_E2BIG);
    cr_assert_eq(hdr_len_of(KW__POOL_T_RESPONSE, KW__POOL_MAX_RESP, &rc),
                 KW__POOL_MAX_RESP);
    cr_assert_eq(rc, 0);
}

Test(pool_frame, request_round_trips_a_key)
{
    kw_keys_key k = fake_key(KW_K_DCP_STABLE_TOPK, 7), back;
    k.fields[0] = -5;
    k.fields[1] = INT64_MAX;
    uint8_t b[KW__POOL_REQ_LEN];
    kw__pool_req_put(b, &k);
    cr_assert_eq(kw__pool_req_parse(b, &back), 0);
    cr_assert_eq(memcmp(&k, &back, sizeof k), 0);
}

Test(pool_frame, request_rejects_unknown_family_wrong_nfields_unterminated_arch)
{
    kw_keys_key k = fake_key(KW_K_DCP_STABLE_TOPK, 7), back;
    uint8_t b[KW__POOL_REQ_LEN];
    kw__pool_req_put(b, &k);
    b[0] = KW_K_NFAMILIES;
    cr_assert_eq(kw__pool_req_parse(b, &back), KW_EPROTO);
    kw__pool_req_put(b, &k);
    b[4] += 1;
    cr_assert_eq(kw__pool_req_parse(b, &back), KW_EPROTO);
    kw__pool_req_put(b, &k);
    memset(b + 8 + 8 * KW_KEYS_MAX_FIELDS, 'x', KW_CONFIG_ARCH_LEN);
    cr_assert_eq(kw__pool_req_parse(b, &back), KW_EPROTO);
}

static int resp_parse(kw__pool_resp_head h, uint32_t body_len)
{
    uint8_t b[KW__POOL_RESP_FIXED];
    kw__pool_resp_head back;
    kw__pool_resp_put(b, &h);
    return kw__pool_resp_parse(b, body_len, &back);
}

Test(pool_frame, response_round_trips)
{
    kw__pool_resp_head h = {.rc = KW_ENVRTC, .seconds = 1.25, .entry_len = 0,
                            .log_len = 100}, back;
    uint8_t b[KW__POOL_RESP_FIXED];
    kw__pool_resp_put(b, &h);
    cr_assert_eq(kw__pool_resp_parse(b, KW__POOL_RESP_FIXED + 100, &back), 0);
    cr_assert_eq(back.rc, KW_ENVRTC);
    cr_assert_eq(back.seconds, 1.25);
    cr_assert_eq(back.log_len, 100);
}

Test(pool_frame, response_rejects_fields_over_their_caps)
{
    uint32_t fixed = KW__POOL_RESP_FIXED;
    kw__pool_resp_head e = {.rc = 0, .entry_len = KW__POOL_ENTRY_LEN,
                            .cubin_len = 1};
    cr_assert_eq(resp_parse(e, fixed + KW__POOL_ENTRY_LEN + 1), KW_E2BIG);
    kw__pool_resp_head l = {.rc = KW_ENVRTC, .log_len = KW__POOL_MAX_LOG + 1};
    cr_assert_eq(resp_parse(l, fixed + KW__POOL_MAX_LOG + 1), KW_E2BIG);
    kw__pool_resp_head c = {.rc = 0, .cubin_len = KW__POOL_MAX_CUBIN + 1};
    cr_assert_eq(resp_parse(c, fixed + KW__POOL_MAX_CUBIN + 1), KW_E2BIG);
}

Test(pool_frame, response_rejects_lengths_that_do_not_add_up)
{
    uint32_t fixed = KW__POOL_RESP_FIXED;
    kw__pool_resp_head h = {.rc = 0, .entry_len = 3, .cubin_len = 10};
    cr_assert_eq(resp_parse(h, fixed + 12), KW_EPROTO);
    cr_assert_eq(resp_parse(h, fixed + 14), KW_EPROTO);
    cr_assert_eq(resp_parse(h, fixed + 13), 0);
}

Test(pool_frame, response_rejects_a_cubin_on_failure_and_none_on_success)
{
    uint32_t fixed = KW__POOL_RESP_FIXED;
    kw__pool_resp_head f = {.rc = KW_ENVRTC, .cubin_len = 10};
    cr_assert_eq(resp_parse(f, fixed + 10), KW_EPROTO);
    kw__pool_resp_head s = {.rc = 0};
    cr_assert_eq(resp_parse(s, fixed), KW_EPROTO);
}

/* Runs the helper with `input` on its stdin and its stderr on errfd
 * (-1: ours); returns its wait status. */
static int run_helper_err(const void *input, size_t len, int errfd)
{
    int in[2], out[2];
    cr_assert_eq(pipe(in), 0);
    cr_assert_eq(pipe(out), 0);
    pid_t pid = fork();
    cr_assert_geq(pid, 0);
    if (pid == 0) {
        dup2(in[0], 0);
        dup2(out[1], 1);
        if (errfd >= 0)
            dup2(errfd, 2);
        close(in[1]);
        close(out[0]);
        execl(KW_COMPILE_HELPER_BIN, KW_COMPILE_HELPER_BIN, (char *)NULL);
        _exit(126);
    }
    close(in[0]);
    close(out[1]);
    cr_assert_eq(write(in[1], input, len), (ssize_t)len);
    close(in[1]);
    uint8_t buf[256];
    size_t got = 0;
    for (ssize_t n; (n = read(out[0], buf + got, sizeof buf - got)) > 0;)
        got += (size_t)n;
    close(out[0]);
    int st;
    cr_assert_eq(waitpid(pid, &st, 0), pid);
    uint32_t hl;
    cr_assert_eq(got, KW__POOL_HDR_LEN + KW__POOL_HELLO_LEN, "only HELLO");
    cr_assert_eq(kw__pool_hdr_parse(buf, KW__POOL_T_HELLO, &hl), 0);
    return st;
}

static int run_helper_with_input(const void *input, size_t len)
{
    return run_helper_err(input, len, -1);
}

/* A request whose family is 255: malformed. */
static void bad_request(uint8_t *bad)
{
    kw_keys_key k = fake_key(KW_K_INDEX_CONVERSION, 1);
    kw__pool_hdr_put(bad, KW__POOL_T_REQUEST, KW__POOL_REQ_LEN);
    kw__pool_req_put(bad + KW__POOL_HDR_LEN, &k);
    bad[KW__POOL_HDR_LEN] = 0xff;
}

Test(pool_frame, helper_exits_0_at_eof_and_2_on_a_malformed_request)
{
    int st = run_helper_with_input("", 0);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 0, "status %#x", st);
    uint8_t bad[KW__POOL_HDR_LEN + KW__POOL_REQ_LEN];
    bad_request(bad);
    st = run_helper_with_input(bad, sizeof bad);
    cr_assert(WIFEXITED(st) && WEXITSTATUS(st) == 2, "status %#x", st);
}

/* Runs the helper on input with stderr to a file; returns what it wrote
 * there (free it) and its exit code in *code.  journal: JOURNAL_STREAM
 * names that file (as systemd names the journal's stream), else another. */
static char *helper_stderr(const void *input, size_t len, bool journal,
                           int *code)
{
    char path[] = "/tmp/kw-test-helper-err-XXXXXX";
    int fd = mkstemp(path);
    cr_assert_geq(fd, 0);
    struct stat st;
    cr_assert_eq(fstat(fd, &st), 0);
    char js[64];
    snprintf(js, sizeof js, "%llu:%llu", (unsigned long long)st.st_dev,
             (unsigned long long)st.st_ino + (journal ? 0 : 1));
    cr_assert_eq(setenv("JOURNAL_STREAM", js, 1), 0);
    int ws = run_helper_err(input, len, fd);
    cr_assert_eq(unsetenv("JOURNAL_STREAM"), 0);
    cr_assert(WIFEXITED(ws), "status %#x", ws);
    *code = WEXITSTATUS(ws);
    close(fd);
    char *text = kw_test_read_file(path, NULL);
    unlink(path);
    return text ? text : strdup("");
}

/* The journald priority prefix only when stderr is the journal's stream
 * (JOURNAL_STREAM's device:inode), and a pool gone mid-frame is no
 * malformed frame: nothing to say, exit 0 (issue 24: an interrupted
 * prewarm ended with "<3>kwarm-compile: malformed request frame" twice). */
Test(pool_frame, helper_prefixes_priorities_only_on_journald_and_is_quiet_at_eof)
{
    uint8_t bad[KW__POOL_HDR_LEN + KW__POOL_REQ_LEN];
    bad_request(bad);
    int code;
    char *off = helper_stderr(bad, sizeof bad, false, &code);
    cr_expect_eq(code, 2);
    cr_expect_str_eq(off, "kwarm-compile: malformed request frame\n");
    char *on = helper_stderr(bad, sizeof bad, true, &code);
    cr_expect_eq(code, 2);
    cr_expect_str_eq(on, "<3>kwarm-compile: malformed request frame\n");
    free(off);
    free(on);
    size_t cut[2] = {KW__POOL_HDR_LEN / 2, KW__POOL_HDR_LEN + 3};
    bad_request(bad);
    bad[KW__POOL_HDR_LEN] = KW_K_INDEX_CONVERSION; /* a good frame, cut */
    for (int i = 0; i < 2; i++) { /* the pool died mid-frame */
        char *err = helper_stderr(bad, cut[i], true, &code);
        cr_expect_eq(code, 0, "cut at %zu", cut[i]);
        cr_expect_str_eq(err, "", "cut at %zu", cut[i]);
        free(err);
    }
}
