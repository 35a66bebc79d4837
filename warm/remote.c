/* remote.c: opening the fleet tier from the flags kwarmd and prewarm take.
 *
 * The key file is checked here, so a bad one stops the command before it
 * does anything; a Redis that is down is not an error (the tier reconnects
 * with backoff, cache/kw_remote.h).
 */
#include "kw_warm.h"

#include <stdio.h>
#include <stdlib.h>

#include <sodium.h>

#include "kw_err.h"

int kw_warm_remote_open(kw_remote **out, const char *url, const char *key_file,
                        unsigned timeout_ms, unsigned lease_ms, char *err,
                        size_t errlen)
{
    kw_remote_opts ro = {.timeout_ms = timeout_ms, .lease_ms = lease_ms};
    const char *pw = getenv("KWARM_REMOTE_PASSWORD");
    *out = NULL;
    if (url == NULL || url[0] == '\0')
        return 0;
    int rc = kw_remote_parse_url(url, &ro.addr);
    if (rc < 0)
        snprintf(err, errlen, "--remote %s: not redis://HOST:PORT[/DB]", url);
    if (rc == 0 && (key_file == NULL || key_file[0] == '\0')) {
        snprintf(err, errlen, "--remote needs --remote-key-file");
        rc = KW_EINVAL;
    }
    if (rc == 0)
        rc = kw_remote_load_key(key_file, &ro, err, errlen);
    if (rc == 0 && ro.password[0] == '\0' && pw != NULL &&
        snprintf(ro.password, sizeof ro.password, "%s", pw) >=
            (int)sizeof ro.password) {
        snprintf(err, errlen, "$KWARM_REMOTE_PASSWORD: too long");
        rc = KW_EINVAL;
    }
    if (rc == 0)
        rc = kw_remote_open(out, &ro, err, errlen);
    sodium_memzero(&ro, sizeof ro);
    return rc;
}
