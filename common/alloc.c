/* alloc.c: the allocator of daemon/ and warm/, and its test hook. */
#include "kw_alloc.h"

#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

/* Allocations left before the one that fails; 0: the hook is off. */
static _Atomic uint64_t countdown;
static _Atomic bool fired;
static _Thread_local unsigned paused; /* kw_alloc_pause() depth */

/* True when this allocation is the one to fail. */
static bool should_fail(void)
{
    uint64_t n = atomic_load_explicit(&countdown, memory_order_relaxed);
    if (paused > 0)
        return false;
    while (n > 0)
        if (atomic_compare_exchange_weak(&countdown, &n, n - 1)) {
            if (n == 1)
                atomic_store(&fired, true);
            return n == 1;
        }
    return false;
}

void *kw_malloc(size_t n)
{
    return should_fail() ? NULL : malloc(n);
}

void *kw_calloc(size_t count, size_t size)
{
    return should_fail() ? NULL : calloc(count, size);
}

void *kw_realloc(void *p, size_t n)
{
    return should_fail() ? NULL : realloc(p, n);
}

char *kw_strdup(const char *s)
{
    return should_fail() ? NULL : strdup(s);
}

void kw_alloc_pause(void)
{
    paused++;
}

void kw_alloc_resume(void)
{
    paused--;
}

void kw_alloc_fail_at(uint64_t n)
{
    atomic_store(&fired, false);
    atomic_store(&countdown, n);
}

bool kw_alloc_failed(void)
{
    return atomic_load(&fired);
}
