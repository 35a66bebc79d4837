/* case.c: the check harness's plumbing: a case's arrays, their device
 * copies, the launch and the comparison with the CPU reference.  What the
 * arrays hold is up to the generators (gen.c, gen_dcp.c). */
#include "kw_kernels.h"

#include "internal.h"
#include "kw_launch.h"
#include "kw_err.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define POISON 0xA5

static size_t elem_size(kw__k_elem t)
{
    return t == KW__K_I64 ? 8 : t == KW__K_U8 ? 1 : 4;
}

static size_t buf_bytes(const kw__k_buf *b)
{
    return b->count * elem_size(b->type);
}

int kw__k_case_buf(kw_k_case *c, const char *name, kw__k_elem type,
                   size_t count, bool output, void **host)
{
    *host = NULL;
    if (c->nbufs == KW__K_MAX_BUFS || c->nargs == KW__K_MAX_ARGS)
        return KW_EINVAL;
    kw__k_buf *b = &c->bufs[c->nbufs];
    *b = (kw__k_buf){.name = name, .type = type, .count = count,
                     .output = output};
    if (count > 0 && !(b->host = calloc(count, elem_size(type))))
        return KW_ENOMEM;
    c->args[c->nargs++] = (kw__k_arg){.buf = (int)c->nbufs++};
    *host = b->host;
    return 0;
}

int kw__k_case_int(kw_k_case *c, int32_t val)
{
    if (c->nargs == KW__K_MAX_ARGS)
        return -1;
    c->args[c->nargs] = (kw__k_arg){.buf = -1, .val = val};
    return (int)c->nargs++;
}

static bool shape_ok(const kw_k_shape *s)
{
    return s && s->rows >= 0 && s->rows <= INT32_MAX && s->batch >= 0 &&
           s->batch <= (1 << 20) && s->cols >= 0 && s->cols <= (1 << 24) &&
           s->max_len >= 0 && s->max_len <= (1 << 24);
}

static int contract_geometry(kw_k_case *c);

int kw_k_case_new(kw_k_case **out, kw_k_family f, const int64_t *fields,
                  const kw_k_shape *shape, uint64_t seed)
{
    int rc = kw_k_fields_check(f, fields);
    if (rc < 0)
        return rc;
    if (!out || !shape_ok(shape))
        return KW_EINVAL;
    kw_k_case *c = calloc(1, sizeof(*c));
    if (!c)
        return KW_ENOMEM;
    c->fam = f;
    memcpy(c->fields, fields, kw_k_nfields(f) * sizeof(*fields));
    kw__k_rng g = {seed};
    if ((rc = kw__k_family_gen(c, shape, &g)) < 0 ||
        (rc = contract_geometry(c)) < 0) {
        kw_k_case_free(c, NULL);
        return rc;
    }
    *out = c;
    return 0;
}

int kw_k_case_upload(kw_k_case *c, const kw_k_dev *dev)
{
    if (!c || !dev || c->upload_tried)
        return KW_EINVAL;
    c->upload_tried = true; /* kw_k_case_free() releases partial uploads */
    for (size_t i = 0; i < c->nbufs; i++) {
        kw__k_buf *b = &c->bufs[i];
        if (b->count == 0)
            continue;
        int rc = dev->alloc(dev->ctx, buf_bytes(b) + b->misalign, &b->base);
        if (rc < 0)
            return rc;
        b->dptr = b->base + b->misalign;
        if (b->output)
            memset(b->host, POISON, buf_bytes(b));
        if ((rc = dev->h2d(dev->ctx, b->dptr, b->host, buf_bytes(b))) < 0)
            return rc;
    }
    c->uploaded = true;
    return 0;
}

/* cuLaunchKernel-style parameters: pointers read from store[] (device
 * addresses, or host addresses for the reference), ints from the args. */
static void build_params(kw_k_case *c, bool host, uint64_t *store,
                         void **params)
{
    for (size_t i = 0; i < c->nargs; i++) {
        kw__k_arg *a = &c->args[i];
        if (a->buf < 0) {
            params[i] = &a->val;
            continue;
        }
        const kw__k_buf *b = &c->bufs[a->buf];
        if (!host)
            store[i] = b->dptr;
        else
            store[i] = (uint64_t)(uintptr_t)(b->output ? b->expect : b->host);
        params[i] = &store[i];
    }
}

/* The launch geometry of the case, from the launch contract (kw_launch.h)
 * that serving processes use, so every check of a key on a GPU also
 * checks the contract's grid, block and shared memory for it. */
static int contract_geometry(kw_k_case *c)
{
    uint64_t store[KW__K_MAX_ARGS];
    void *params[KW__K_MAX_ARGS];
    build_params(c, true, store, params);
    kw_launch_op op = kw_launch_op_of_key((int)c->fam, c->fields);
    kw_launch_call call;
    kw_launch_geo geo;
    int rc = kw_launch_call_from_params(op, c->fields, params, &call);
    if (rc == 0)
        rc = kw_launch_geometry(op, c->fields, &call, 0, &geo);
    if (rc < 0)
        return rc;
    memcpy(c->grid, geo.grid, sizeof(c->grid));
    memcpy(c->block, geo.block, sizeof(c->block));
    c->shmem = geo.shmem;
    return 0;
}

int kw_k_case_launch(kw_k_case *c, const kw_k_dev *dev)
{
    if (!c || !dev || !c->uploaded)
        return KW_EINVAL;
    uint64_t store[KW__K_MAX_ARGS];
    void *params[KW__K_MAX_ARGS];
    build_params(c, false, store, params);
    if (c->grid[0] == 0)
        return 0; /* nothing to do: the contract launches nothing */
    return dev->launch(dev->ctx, c->grid, c->block, c->shmem, params);
}

unsigned kw_k_case_shmem(const kw_k_case *c)
{
    return c ? c->shmem : 0;
}

void kw_k_case_geometry(const kw_k_case *c, unsigned grid[3],
                        unsigned block[3])
{
    memcpy(grid, c->grid, sizeof(c->grid));
    memcpy(block, c->block, sizeof(c->block));
}

/* indexer_logits: the reference with its absolute-value sums, turned
 * into the spec's tolerance 2^-12 m + 2^-100 per element. */
static int logits_expect(kw_k_case *c, void **params)
{
    kw__k_buf *out = NULL;
    for (size_t i = 0; i < c->nbufs; i++)
        if (c->bufs[i].output && c->bufs[i].count > 0)
            out = &c->bufs[i];
    if (out && !out->tol && !(out->tol = calloc(out->count, sizeof(double))))
        return KW_ENOMEM;
    int rc = kw__k_cpu_logits_mag(c->fields, params, out ? out->tol : NULL);
    for (size_t i = 0; rc == 0 && out && i < out->count; i++)
        out->tol[i] = ldexp(out->tol[i], -12) + ldexp(1.0, -100);
    return rc;
}

/* Runs the CPU reference on the host inputs into each output's expect[]. */
static int compute_expect(kw_k_case *c)
{
    for (size_t i = 0; i < c->nbufs; i++) {
        kw__k_buf *b = &c->bufs[i];
        if (b->output && b->count > 0 && !b->expect &&
            !(b->expect = malloc(buf_bytes(b))))
            return KW_ENOMEM;
        /* What a reference leaves unwritten (columns past num_k) must
         * stay as the kernel's poison. */
        if (b->output && b->expect)
            memset(b->expect, POISON, buf_bytes(b));
    }
    uint64_t store[KW__K_MAX_ARGS];
    void *params[KW__K_MAX_ARGS];
    build_params(c, true, store, params);
    int rc = c->fam == KW_K_INDEXER_LOGITS ? logits_expect(c, params)
                                           : kw_k_cpu_launch(c->fam, c->fields,
                                                             params);
    c->have_expect = rc == 0;
    return rc;
}

/* Element i of b's array p as an int64 (floats as their bit pattern). */
static int64_t elem_value(const kw__k_buf *b, const void *p, size_t i)
{
    if (b->type == KW__K_I64)
        return ((const int64_t *)p)[i];
    if (b->type == KW__K_I32)
        return ((const int32_t *)p)[i];
    if (b->type == KW__K_U8)
        return ((const uint8_t *)p)[i];
    return ((const uint32_t *)p)[i];
}

/* Element i of a toleranced F32 output: infinities and NaN must match
 * bit for bit, finite values within tol[i]. */
static bool within_tol(const kw__k_buf *b, const void *e, const void *g,
                       size_t i)
{
    float x, y;
    memcpy(&x, (const char *)e + 4 * i, 4);
    memcpy(&y, (const char *)g + 4 * i, 4);
    if (isinf(x) || isnan(x))
        return memcmp((const char *)e + 4 * i, (const char *)g + 4 * i, 4) == 0;
    return !isnan(y) && !isinf(y) && fabs((double)y - (double)x) <= b->tol[i];
}

static void compare_buf(const kw__k_buf *b, kw_k_check_result *res)
{
    const size_t es = elem_size(b->type);
    const unsigned char *e = b->expect, *g = b->host;
    for (size_t i = 0; i < b->count; i++) {
        if (b->tol ? within_tol(b, e, g, i)
                   : memcmp(e + i * es, g + i * es, es) == 0)
            continue;
        if (res->mismatches++ == 0) {
            res->output = b->name;
            res->first_index = i;
            res->expected = elem_value(b, e, i);
            res->got = elem_value(b, g, i);
        }
    }
    res->checked += b->count;
}

int kw_k_case_compare(kw_k_case *c, const kw_k_dev *dev,
                      kw_k_check_result *res)
{
    if (!c || !dev || !res || !c->uploaded)
        return KW_EINVAL;
    int rc = dev->sync(dev->ctx);
    for (size_t i = 0; rc == 0 && i < c->nbufs; i++) {
        kw__k_buf *b = &c->bufs[i];
        if (b->output && b->count > 0)
            rc = dev->d2h(dev->ctx, b->host, b->dptr, buf_bytes(b));
    }
    if (rc < 0 || (!c->have_expect && (rc = compute_expect(c)) < 0))
        return rc;
    *res = (kw_k_check_result){0};
    for (size_t i = 0; i < c->nbufs; i++)
        if (c->bufs[i].output)
            compare_buf(&c->bufs[i], res);
    return res->mismatches ? KW_EMISMATCH : 0;
}

size_t kw_k_case_bytes(const kw_k_case *c)
{
    return c ? c->bytes : 0;
}

void kw_k_case_free(kw_k_case *c, const kw_k_dev *dev)
{
    if (!c)
        return;
    for (size_t i = 0; i < c->nbufs; i++) {
        kw__k_buf *b = &c->bufs[i];
        if (b->base && dev)
            dev->free(dev->ctx, b->base);
        free(b->host);
        free(b->expect);
        free(b->tol);
    }
    free(c);
}
