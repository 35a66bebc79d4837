/* ops.c: the eight ops' arguments, dispatch, checks, geometry and kernel
 * parameters (kw_launch.h; docs/spec/launch.md says the same in prose). */
#include "kw_launch.h"

#include "internal.h"
#include "kw_err.h"

#include <stdio.h>
#include <string.h>

#define IN KW_LAUNCH_IN
#define OUT KW_LAUNCH_OUT
#define OPT_IN KW_LAUNCH_OPT_IN
#define OPT_OUT KW_LAUNCH_OPT_OUT
#define SIZE KW_LAUNCH_SIZE
#define FLAG KW_LAUNCH_FLAG

typedef struct arg_desc {
    const char *name;
    kw_launch_arg_kind kind;
} arg_desc;

typedef struct op_desc {
    const char *name;
    int fam;
    size_t nargs;
    arg_desc args[KW_LAUNCH_MAX_ARGS];
    kw__launch_dispatch_fn dispatch;
    kw__launch_check_fn check;
    kw__launch_grid_fn grid;
    kw__launch_params_fn params;
    /* The call argument behind each kernel parameter, in parameter order
     * (-1: a value the deployment gives), for kw_launch_call_from_params. */
    size_t nparams;
    int8_t param_arg[KW_LAUNCH_MAX_PARAMS];
} op_desc;

static const op_desc ops[KW_LAUNCH_NOPS] = {
    {"prefill_chunk_metadata", 0, 12,
     {{"query_start_loc", IN}, {"seq_lens", IN}, {"cu_k", IN},
      {"num_reqs", SIZE}, {"slice_start", SIZE}, {"slice_stop", SIZE},
      {"total_k", SIZE}, {"ks", OUT}, {"ke", OUT}, {"token_to_seq", OUT},
      {"compress_ratio", SIZE}, {"dcp_local", FLAG}},
     kw__launch_dispatch_pcm, kw__launch_check_pcm, kw__launch_grid_pcm,
     kw__launch_params_pcm, 13, {0, 1, 2, 3, 4, 5, -1, -1, -1, 6, 7, 8, 9}},
    {"compressed_slot_mapping", 1, 11,
     {{"slot_mapping", IN}, {"query_start_loc", IN}, {"seq_lens", IN},
      {"block_table", IN}, {"num_tokens", SIZE}, {"num_reqs", SIZE},
      {"width", SIZE}, {"block_size", SIZE}, {"out", OUT},
      {"compress_ratio", SIZE}, {"dcp_local", FLAG}},
     kw__launch_dispatch_csm, kw__launch_check_csm, kw__launch_grid_csm,
     kw__launch_params_csm, 9, {0, 1, 2, 3, 4, 5, 6, 7, 8}},
    {"index_conversion", 2, 14,
     {{"req_id", IN}, {"block_table", IN}, {"topk_pos", IN},
      {"prefill_req", OPT_IN}, {"workspace_start", OPT_IN},
      {"num_rows", SIZE}, {"num_reqs", SIZE}, {"num_prefill", SIZE},
      {"width", SIZE}, {"workspace_rank_stride", SIZE}, {"out", OUT},
      {"valid_count", OPT_OUT}, {"compact_to_front", FLAG},
      {"dcp_local", FLAG}},
     kw__launch_dispatch_ic, kw__launch_check_ic, kw__launch_grid_ic,
     kw__launch_params_ic, 12, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11}},
    {"dcp_pack_topk_candidates", 3, 6,
     {{"logits", IN}, {"topk_local", IN}, {"row_starts", OPT_IN},
      {"num_rows", SIZE}, {"cols", SIZE}, {"packed", OUT}},
     kw__launch_dispatch_pack, kw__launch_check_pack, kw__launch_grid_pack,
     kw__launch_params_pack, 6, {0, 1, 2, 3, 4, 5}},
    {"dcp_stable_topk", 4, 3,
     {{"gathered", IN}, {"num_rows", SIZE}, {"out", OUT}},
     kw__launch_dispatch_stable, kw__launch_check_stable,
     kw__launch_grid_stable, kw__launch_params_stable, 3, {0, 1, 2}},
    {"indexer_logits", 5, 12,
     {{"q", IN}, {"w", IN}, {"k", IN}, {"k_scale", IN}, {"ks", IN},
      {"ke", IN}, {"num_rows", SIZE}, {"num_k", SIZE}, {"stride", SIZE},
      {"logits", OUT}, {"heads", SIZE}, {"head_dim", SIZE}},
     kw__launch_dispatch_logits, kw__launch_check_logits,
     kw__launch_grid_logits, kw__launch_params_logits, 10,
     {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
    {"indexer_topk", 6, 7,
     {{"logits", IN}, {"ks", OPT_IN}, {"ke", OPT_IN}, {"num_rows", SIZE},
      {"stride", SIZE}, {"topk_pos", OUT}, {"row_end", OPT_IN}},
     kw__launch_dispatch_itopk, kw__launch_check_itopk,
     kw__launch_grid_itopk, kw__launch_params_itopk, 6, {0, 1, 2, 3, 4, 5}},
    {"indexer_logits_paged", 5, 14,
     {{"q", IN}, {"w", IN}, {"k_pages", IN}, {"k_scale_pages", IN},
      {"block_table", IN}, {"row_end", IN}, {"num_reqs", SIZE},
      {"width", SIZE}, {"max_rows", SIZE}, {"logits", OUT},
      {"page_rows", SIZE}, {"next_n", SIZE}, {"heads", SIZE},
      {"head_dim", SIZE}},
     kw__launch_dispatch_paged, kw__launch_check_paged,
     kw__launch_grid_paged, kw__launch_params_paged, 10,
     {0, 1, 2, 3, 4, 5, 6, 7, 8, 9}},
};

static const op_desc *op_of(kw_launch_op op)
{
    return (int)op >= 0 && op < KW_LAUNCH_NOPS ? &ops[op] : NULL;
}

const char *kw_launch_op_name(kw_launch_op op)
{
    const op_desc *o = op_of(op);
    return o ? o->name : NULL;
}

int kw_launch_op_from_name(const char *name)
{
    for (int i = 0; name && i < KW_LAUNCH_NOPS; i++)
        if (strcmp(ops[i].name, name) == 0)
            return i;
    return -1;
}

int kw_launch_op_family(kw_launch_op op)
{
    const op_desc *o = op_of(op);
    return o ? o->fam : -1;
}

size_t kw_launch_nargs(kw_launch_op op)
{
    const op_desc *o = op_of(op);
    return o ? o->nargs : 0;
}

const char *kw_launch_arg_name(kw_launch_op op, size_t i)
{
    const op_desc *o = op_of(op);
    return o && i < o->nargs ? o->args[i].name : NULL;
}

kw_launch_arg_kind kw_launch_arg_kind_of(kw_launch_op op, size_t i)
{
    const op_desc *o = op_of(op);
    return o && i < o->nargs ? o->args[i].kind : KW_LAUNCH_SIZE;
}

int kw_launch_arg_index(kw_launch_op op, const char *name)
{
    const op_desc *o = op_of(op);
    for (size_t i = 0; o && name && i < o->nargs; i++)
        if (strcmp(o->args[i].name, name) == 0)
            return (int)i;
    return -1;
}

/* Sizes the kernel takes as int: within [lo, INT32_MAX]; flags 0 or 1. */
static int check_sizes(const op_desc *o, const int64_t *a, char *err,
                       size_t errlen)
{
    for (size_t i = 0; i < o->nargs; i++) {
        kw_launch_arg_kind k = o->args[i].kind;
        if (k == FLAG && a[i] != 0 && a[i] != 1)
            return kw__launch_fail(err, errlen, "%s %s: %lld is not 0 or 1",
                                   o->name, o->args[i].name,
                                   (long long)a[i]);
        if (k == SIZE && (a[i] < 0 || a[i] > INT32_MAX))
            return kw__launch_fail(err, errlen,
                                   "%s %s: %lld is outside [0, 2^31 - 1]",
                                   o->name, o->args[i].name,
                                   (long long)a[i]);
    }
    return 0;
}

int kw_launch_dispatch(kw_launch_op op, const kw_launch_deploy *d,
                       const kw_launch_call *call, int64_t *fields,
                       char *err, size_t errlen)
{
    const op_desc *o = op_of(op);
    if (!o || !d || !call || !fields)
        return kw__launch_fail(err, errlen, "kw_launch_dispatch: %s",
                               o ? "NULL argument" : "unknown op");
    int rc = check_sizes(o, call->a, err, errlen);
    if (rc < 0)
        return rc;
    memset(fields, 0, KW_LAUNCH_MAX_FIELDS * sizeof(*fields));
    if ((rc = o->dispatch(d, call->a, fields, err, errlen)) < 0)
        return rc;
    if (kw_launch_fields_check(o->fam, fields) < 0)
        return kw__launch_fail(err, errlen,
                               "%s: the call's sizes make no valid key",
                               o->name);
    return 0;
}

int kw_launch_check(kw_launch_op op, const kw_launch_deploy *d,
                    const int64_t *fields, const kw_launch_call *call,
                    char *err, size_t errlen)
{
    const op_desc *o = op_of(op);
    if (!o || !d || !fields || !call)
        return kw__launch_fail(err, errlen, "kw_launch_check: %s",
                               o ? "NULL argument" : "unknown op");
    if (kw_launch_fields_check(o->fam, fields) < 0)
        return kw__launch_fail(err, errlen, "%s: not a valid key", o->name);
    int rc = check_sizes(o, call->a, err, errlen);
    if (rc < 0)
        return rc;
    return o->check(d, fields, call->a, err, errlen);
}

int kw_launch_geometry(kw_launch_op op, const int64_t *fields,
                       const kw_launch_call *call, unsigned sm_count,
                       kw_launch_geo *out)
{
    const op_desc *o = op_of(op);
    if (!o || !fields || !call || !out ||
        kw_launch_fields_check(o->fam, fields) < 0)
        return KW_EINVAL;
    uint64_t grid[3] = {0, 1, 1};
    o->grid(fields, call->a, sm_count ? sm_count : 132, grid);
    if (grid[0] > INT32_MAX || grid[1] > 65535 || grid[2] > 65535)
        return KW_EINVAL;
    if (grid[1] == 0 || grid[2] == 0)
        grid[0] = 0;
    memset(out, 0, sizeof(*out));
    for (int i = 0; i < 3; i++)
        out->grid[i] = (unsigned)grid[i];
    out->block[0] = kw_launch_threads(o->fam, fields);
    out->block[1] = out->block[2] = 1;
    out->shmem = kw_launch_shmem(o->fam, fields);
    return 0;
}

void kw__launch_ptr(kw_launch_params *p, int64_t v)
{
    p->slot[p->n] = (uint64_t)v;
    p->args[p->n] = &p->slot[p->n];
    p->n++;
}

void kw__launch_int(kw_launch_params *p, int64_t v)
{
    int32_t i = (int32_t)v;
    p->slot[p->n] = 0;
    memcpy(&p->slot[p->n], &i, sizeof(i));
    p->args[p->n] = &p->slot[p->n];
    p->n++;
}

int kw_launch_params_build(kw_launch_op op, const int64_t *fields,
                           const kw_launch_deploy *d,
                           const kw_launch_call *call, kw_launch_params *p)
{
    const op_desc *o = op_of(op);
    if (!o || !fields || !d || !call || !p)
        return KW_EINVAL;
    p->n = 0;
    o->params(fields, d, call->a, p);
    return 0;
}

/* What the kernel parameters do not carry: the key's own choices. */
static void call_from_fields(kw_launch_op op, const int64_t *f, int64_t *a)
{
    switch (op) {
    case KW_LAUNCH_PREFILL_CHUNK_METADATA:
        a[KW_LAUNCH_PCM_COMPRESS_RATIO] = f[6];
        break;
    case KW_LAUNCH_COMPRESSED_SLOT_MAPPING:
        a[KW_LAUNCH_CSM_COMPRESS_RATIO] = f[0];
        break;
    case KW_LAUNCH_INDEX_CONVERSION:
        a[KW_LAUNCH_IC_COMPACT_TO_FRONT] = f[7];
        break;
    case KW_LAUNCH_INDEXER_LOGITS:
        a[KW_LAUNCH_LOGITS_HEADS] = f[0];
        a[KW_LAUNCH_LOGITS_HEAD_DIM] = f[1];
        break;
    case KW_LAUNCH_INDEXER_LOGITS_PAGED:
        a[KW_LAUNCH_PAGED_PAGE_ROWS] = f[3];
        a[KW_LAUNCH_PAGED_NEXT_N] = f[4];
        a[KW_LAUNCH_PAGED_HEADS] = f[0];
        a[KW_LAUNCH_PAGED_HEAD_DIM] = f[1];
        break;
    case KW_LAUNCH_INDEXER_TOPK:
        if (!f[1]) { /* not windowed: the second parameter is row_end */
            a[KW_LAUNCH_TOPK_ROW_END] = a[KW_LAUNCH_TOPK_KS];
            a[KW_LAUNCH_TOPK_KS] = a[KW_LAUNCH_TOPK_KE] = 0;
        }
        break;
    default:
        break;
    }
}

int kw_launch_call_from_params(kw_launch_op op, const int64_t *fields,
                               void *const *params, kw_launch_call *out)
{
    const op_desc *o = op_of(op);
    if (!o || !fields || !params || !out)
        return KW_EINVAL;
    memset(out, 0, sizeof(*out));
    for (size_t i = 0; i < o->nparams; i++) {
        int arg = o->param_arg[i];
        if (arg < 0)
            continue;
        kw_launch_arg_kind k = o->args[arg].kind;
        if (k == SIZE || k == FLAG) {
            int32_t v;
            memcpy(&v, params[i], sizeof(v));
            out->a[arg] = v;
        } else {
            uint64_t v;
            memcpy(&v, params[i], sizeof(v));
            out->a[arg] = (int64_t)v;
        }
    }
    call_from_fields(op, fields, out->a);
    return 0;
}

kw_launch_op kw_launch_op_of_key(int fam, const int64_t *fields)
{
    if (fam == 5 && fields && fields[2])
        return KW_LAUNCH_INDEXER_LOGITS_PAGED;
    return (kw_launch_op)fam;
}
