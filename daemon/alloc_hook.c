/* alloc_hook.c: the allocation-failure test hooks of kwarmd (internal.h).
 *
 * Two hooks, both for tests only: KWARMD_TEST_FAIL_ALLOC=TYPE fails every
 * cJSON allocation made while a thread serves a request of that type;
 * KWARMD_TEST_ALLOC_HOOK arms common/kw_alloc.h's N-th-allocation
 * failure for one request that asks for it ("test_fail_alloc": N), and
 * kw__alloc_hook_done records whether it fired (issue 23).
 */
#include "internal.h"

#include <stdlib.h>
#include <string.h>

#include "kw_alloc.h"

_Thread_local bool kw__alloc_fail;
uint16_t kw__alloc_fail_type;

/* cJSON's allocator while KWARMD_TEST_FAIL_ALLOC names a request type:
 * fails while this thread serves a request of that type. */
static void *hook_malloc(size_t n)
{
    return kw__alloc_fail ? NULL : kw_malloc(n);
}

void kw__alloc_hook_init(void)
{
    static const char *const names[] = {"ping", "keys", "warmup", "get",
                                        "stats", "evict", "misses", "ls",
                                        "pins", "unpin", "resize"};
    const char *v = getenv("KWARMD_TEST_FAIL_ALLOC");
    for (size_t i = 0; v != NULL && i < sizeof names / sizeof *names; i++)
        if (strcmp(v, names[i]) == 0) {
            kw__alloc_fail_type = (uint16_t)(i + 1); /* KW_PROTO_PING... */
            cJSON_Hooks hooks = {hook_malloc, free};
            cJSON_InitHooks(&hooks);
        }
}

void kw__alloc_hook_done(kw__daemon *d)
{
    atomic_store(&d->alloc_fired, kw_alloc_failed());
    kw_alloc_fail_at(0);
}

bool kw__alloc_hook_arm(kw__daemon *d, const cJSON *header)
{
    const cJSON *n = d->alloc_hook
                         ? cJSON_GetObjectItemCaseSensitive(header,
                                                            "test_fail_alloc")
                         : NULL;
    if (!cJSON_IsNumber(n) || n->valuedouble < 1)
        return false;
    kw_alloc_fail_at((uint64_t)n->valuedouble);
    return true;
}
