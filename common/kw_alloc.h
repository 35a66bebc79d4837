/* kw_alloc.h: the allocator of daemon/ and warm/ (prefix kw_alloc_), with
 * a fault-injection hook for tests (SQLite's test_malloc.c).
 *
 * kw_malloc, kw_calloc, kw_realloc and kw_strdup behave as their libc
 * namesakes, except that once kw_alloc_fail_at(n) armed the hook, the
 * n-th allocation made through them from then on (any thread) fails and
 * returns NULL; every later one succeeds again.  Unarmed, the cost is one
 * relaxed atomic load.  Thread-safe.
 */
#ifndef KW_ALLOC_H
#define KW_ALLOC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

void *kw_malloc(size_t n);
void *kw_calloc(size_t count, size_t size);
void *kw_realloc(void *p, size_t n);
char *kw_strdup(const char *s);

/* Pause and resume the hook on the calling thread (nestable): code that
 * calls into a module whose own failure paths are not under test (jit/,
 * whose cJSON trees leak when an allocation inside them fails) brackets
 * the call, so the hook fails only the caller's allocations. */
void kw_alloc_pause(void);
void kw_alloc_resume(void);

/* Arms the hook: the n-th allocation from now fails (n >= 1); 0 disarms. */
void kw_alloc_fail_at(uint64_t n);

/* True once the armed failure happened (and until the next arming). */
bool kw_alloc_failed(void);

#endif /* KW_ALLOC_H */
