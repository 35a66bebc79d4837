/* kw_queue.h: the one FIFO of kwarm (prefix kw_queue_), as libuv's
 * uv__queue serves every list of libuv.
 *
 * Intrusive and singly linked: an element embeds a kw_queue_node and is
 * found back from it with KW_QUEUE_ENTRY (container_of).  No allocation,
 * O(1) push, pop and take-all.  Not thread-safe by itself: each queue is
 * guarded by the lock its owner names beside it (STYLE rule 15).
 */
#ifndef KW_QUEUE_H
#define KW_QUEUE_H

#include <stdbool.h>
#include <stddef.h>

typedef struct kw_queue_node {
    struct kw_queue_node *next;
} kw_queue_node;

typedef struct kw_queue {
    kw_queue_node *head, *tail;
} kw_queue;

/* The element of type that embeds node n as member. */
#define KW_QUEUE_ENTRY(n, type, member)                                    \
    ((type *)(void *)((char *)(n) - offsetof(type, member)))

static inline bool kw_queue_empty(const kw_queue *q)
{
    return q->head == NULL;
}

/* Appends n at the tail. */
static inline void kw_queue_push(kw_queue *q, kw_queue_node *n)
{
    n->next = NULL;
    if (q->tail != NULL)
        q->tail->next = n;
    else
        q->head = n;
    q->tail = n;
}

/* Takes the head off; NULL when empty. */
static inline kw_queue_node *kw_queue_pop(kw_queue *q)
{
    kw_queue_node *n = q->head;
    if (n == NULL)
        return NULL;
    q->head = n->next;
    if (q->head == NULL)
        q->tail = NULL;
    n->next = NULL;
    return n;
}

/* Takes up to max nodes (0: all) off the head as one list, linked by
 * next and ended by NULL; *count (may be NULL) gets how many. */
static inline kw_queue_node *kw_queue_take(kw_queue *q, size_t max,
                                           size_t *count)
{
    kw_queue_node *first = q->head, *last = first;
    size_t n = first != NULL;
    while (last != NULL && last->next != NULL && (max == 0 || n < max)) {
        last = last->next;
        n++;
    }
    if (last != NULL) {
        q->head = last->next;
        last->next = NULL;
        if (q->head == NULL)
            q->tail = NULL;
    }
    if (count != NULL)
        *count = first != NULL ? n : 0;
    return first;
}

#endif /* KW_QUEUE_H */
