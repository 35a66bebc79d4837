/* test_daemon_settings.c: a setting kwarmd cannot put in force is said
 * (issue 24): a cache where no claims file can be made is served, with
 * one line saying single flight with other processes is off.  (--max-size
 * on a cache of another limit: test_daemon_flags.c.) */
#include "daemon_util.h"

TestSuite(daemon_settings, .fini = kwd_cleanup);

/* Starts kwarmd with extra, stops it, and returns its log (free it). */
static char *log_of_start(kwd *d, const char *const *extra)
{
    kwd_start(d, 1, extra);
    kwc c;
    kwc_must_open(&c, d->sock);
    kwd_down(d, &c);
    char *log = kwd_log(d->log);
    cr_assert_eq(truncate(d->log, 0), 0);
    return log;
}

Test(daemon_settings, a_cache_without_claims_is_served_and_said_so)
{
    kwd d;
    kwd_init(&d, "kwd-noclaims");
    char path[300];
    cr_assert_eq(mkdir(d.cache, 0700), 0);
    snprintf(path, sizeof path, "%s/claims", d.cache);
    cr_assert_eq(mkdir(path, 0700), 0); /* no file can be opened there */
    char *log = log_of_start(&d, NULL);
    cr_expect(strstr(log, "warn: no claims: ") != NULL &&
                  strstr(log, path) != NULL, "%s", log);
    free(log);
}
