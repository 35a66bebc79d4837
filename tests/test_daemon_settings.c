/* test_daemon_settings.c: a setting given to kwarmd that is not the one in
 * force is said, as prewarm says it (issue 24): --max-size on a cache
 * that already stores another limit.  The limit in force, given again, or
 * no --max-size at all, says nothing.  A cache where no claims file can
 * be made is served, with one line saying single flight with other
 * processes is off. */
#include "daemon_util.h"

TestSuite(daemon_settings, .fini = kwd_cleanup);

#define NOT_APPLIED "--max-size 2147483648 not applied: cache "

/* Starts kwarmd on a cache of the default limit (1G, made by the first
 * start) with extra, stops it, and returns its log (free it). */
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

Test(daemon_settings, max_size_on_a_cache_of_another_limit_is_said_not_applied)
{
    kwd d;
    kwd_init(&d, "kwd-settings");
    char *log = log_of_start(&d, NULL); /* creates the cache: 1G */
    cr_expect(strstr(log, "not applied") == NULL, "%s", log);
    free(log);
    log = log_of_start(&d, (const char *const[]){"--max-size", "2G", NULL});
    cr_expect(strstr(log, NOT_APPLIED) != NULL &&
                  strstr(log, "stores a limit of 1073741824 bytes") != NULL &&
                  strstr(log, d.cache) != NULL,
              "%s", log);
    free(log);
    log = log_of_start(&d, (const char *const[]){"--max-size", "1G", NULL});
    cr_expect(strstr(log, "not applied") == NULL, "the limit in force: %s",
              log);
    free(log);
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
