/* test_build.c: every key of every fixture compiles into a CUDA ELF that
 * holds its entry (issue 3), from several threads at once. */
#include <criterion/criterion.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kw_config.h"
#include "kw_err.h"
#include "kw_keys.h"
#include "kw_test_util.h"

#define EM_CUDA 190

static const char *const fixtures[] = {
    "composite-text-config.json", "deepseek-v3.2-exp.json",
    "deepseek-v4-flash.json", "glm-5-next-kpool.json", "glm-5.2.json",
};
static const char *const worlds[] = {"1", "2", "8"};

typedef struct keylist {
    kw_keys_key *keys;
    size_t n, cap;
} keylist;

/* Appends the keys of one fixture and world whose digest is new. */
static void add_keys(keylist *l, const char *fixture, const char *world)
{
    char path[512], err[KW_CONFIG_ERRLEN];
    kw_config_model m;
    kw_config_deploy d;
    kw_keys_set s;
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, fixture);
    kw_config_deploy_init(&d);
    cr_assert_eq(kw_config_deploy_set_flag(&d, KW_CONFIG_DCP_WORLD, world, err,
                                           sizeof err), 0, "%s", err);
    cr_assert_eq(kw_config_load(&m, path, NULL, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kw_config_resolve(&d, &m, err, sizeof err), 0, "%s", err);
    cr_assert_eq(kw_keys_derive(&m, &d, &s, err, sizeof err), 0, "%s", err);
    for (size_t i = 0; i < s.nkeys; i++) {
        bool seen = false;
        for (size_t j = 0; j < l->n && !seen; j++)
            seen = memcmp(l->keys[j].digest, s.keys[i].digest,
                          KW_KEYS_DIGEST_LEN) == 0;
        if (seen)
            continue;
        if (l->n == l->cap) {
            l->cap = l->cap ? l->cap * 2 : 256;
            l->keys = realloc(l->keys, l->cap * sizeof *l->keys);
            cr_assert_not_null(l->keys);
        }
        l->keys[l->n++] = s.keys[i];
    }
    kw_keys_set_destroy(&s);
    kw_config_model_destroy(&m);
    kw_config_deploy_destroy(&d);
}

typedef struct work {
    const keylist *l;
    _Atomic size_t next;
    _Atomic size_t bad; /* keys whose compile or ELF check failed */
    int first_rc;       /* written only by the first failure */
    _Atomic int claimed;
} work;

/* Compiles keys until none is left; checks machine and entry symbol. */
static void *compile_worker(void *arg)
{
    work *w = arg;
    for (size_t i; (i = atomic_fetch_add(&w->next, 1)) < w->l->n;) {
        kw_jit_result r;
        int rc = kw_keys_compile(&w->l->keys[i], false, &r);
        bool ok = rc == 0 && kw_test_elf_machine(r.cubin, r.cubin_len) == EM_CUDA &&
                  r.lowered_name != NULL &&
                  kw_test_elf_has_symbol(r.cubin, r.cubin_len, r.lowered_name);
        if (!ok) {
            atomic_fetch_add(&w->bad, 1);
            if (atomic_exchange(&w->claimed, 1) == 0)
                w->first_rc = rc;
        }
        kw_jit_result_destroy(&r);
    }
    return NULL;
}

/* Compiles every key of l on 4 threads; fails the test unless all do. */
static void expect_all_compile(keylist *l)
{
    work w = {.l = l};
    pthread_t t[4];
    for (int i = 0; i < 4; i++)
        cr_assert_eq(pthread_create(&t[i], NULL, compile_worker, &w), 0);
    for (int i = 0; i < 4; i++)
        pthread_join(t[i], NULL);
    cr_expect_eq(atomic_load(&w.bad), 0, "%zu of %zu keys failed (first: %s)",
                 atomic_load(&w.bad), l->n, kw_strerror(w.first_rc));
}

Test(build, every_fixture_key_compiles_to_cuda_elf_with_its_entry, .timeout = 1200)
{
    keylist l = {0};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++)
        for (size_t w = 0; w < sizeof worlds / sizeof *worlds; w++)
            add_keys(&l, fixtures[f], worlds[w]);
    cr_assert_gt(l.n, 100, "expected the fixtures to give many keys");
    expect_all_compile(&l);
    free(l.keys);
}

Test(build, key_renders_its_family_source_headers_and_name_expression)
{
    kw_keys_key k = {.family = KW_K_DCP_STABLE_TOPK, .fields = {2048, 16384}};
    memcpy(k.arch, "sm_90", 6);
    kw_keys_build b;
    kw_jit_req req;
    cr_assert_eq(kw_keys_jit_req(&k, &b, &req), 0);
    cr_assert_str_eq(req.name_expr, "kw_k_dcp_stable_topk<2048,16384>");
    cr_assert_str_eq(req.source_name, "dcp_stable_topk.cu");
    cr_assert_str_eq(req.arch, "sm_90");
    cr_assert_eq(req.nheaders, 0, "it includes no kernels/ header");
    /* NVRTC gets the headers a source includes, and only those, in the
     * order of kernels/ */
    keylist l = {0};
    add_keys(&l, "glm-5.2.json", "2");
    int seen[2] = {0, 0};
    for (size_t i = 0; i < l.n; i++) {
        int which = l.keys[i].family == KW_K_INDEX_CONVERSION ? 0
                    : l.keys[i].family == KW_K_INDEXER_LOGITS ? 1 : -1;
        if (which < 0)
            continue;
        static const char *const want[2][2] = {
            {"kw_k_dcp.cuh", NULL}, {"kw_k_il_fold.cuh", "kw_k_il_ptx.cuh"}};
        size_t nwant = want[which][1] != NULL ? 2 : 1;
        cr_assert_eq(kw_keys_jit_req(&l.keys[i], &b, &req), 0);
        cr_assert_eq(req.nheaders, nwant, "%s: %zu headers", want[which][0],
                     req.nheaders);
        for (size_t h = 0; h < nwant; h++)
            cr_assert_str_eq(req.headers[h].name, want[which][h]);
        seen[which]++;
    }
    cr_assert(seen[0] > 0 && seen[1] > 0, "both families among the keys");
    free(l.keys);
}

Test(build, invalid_key_fields_are_refused_before_nvrtc)
{
    /* rep fields hold only 1, 2 or 16 (spec §3). */
    kw_keys_key k = {.family = KW_K_PREFILL_CHUNK_METADATA,
                     .fields = {3, 1, 16, 1, 1, 1024, 1, 1}};
    memcpy(k.arch, "sm_90", 6);
    kw_jit_result r;
    cr_assert_eq(kw_keys_compile(&k, false, &r), KW_EINVAL);
    kw_jit_result_destroy(&r);
}

/* The indexer keys of every fixture compile for each arch a deployment may
 * name, not only sm_90: below sm_80 there is no cp.async and below sm_89
 * no fp8 conversion, and `kwarm prewarm --arch sm_75` once failed both
 * indexer_logits keys inside ptxas. */
Test(build, indexer_keys_compile_for_every_arch, .timeout = 1200)
{
    static const char *const archs[] = {"sm_75", "sm_80", "sm_89", "sm_90",
                                        "sm_100"};
    const size_t na = sizeof archs / sizeof *archs;
    keylist all = {0}, l = {0};
    for (size_t f = 0; f < sizeof fixtures / sizeof *fixtures; f++)
        add_keys(&all, fixtures[f], "1");
    l.keys = calloc(all.n * na, sizeof *l.keys);
    cr_assert_not_null(l.keys);
    for (size_t i = 0; i < all.n; i++) {
        if (all.keys[i].family != KW_K_INDEXER_LOGITS &&
            all.keys[i].family != KW_K_INDEXER_TOPK)
            continue;
        for (size_t a = 0; a < na; a++) {
            l.keys[l.n] = all.keys[i];
            snprintf(l.keys[l.n].arch, sizeof l.keys[l.n].arch, "%s", archs[a]);
            l.n++;
        }
    }
    cr_assert_geq(l.n, 4 * na, "expected indexer keys in the fixtures");
    expect_all_compile(&l);
    free(l.keys);
    free(all.keys);
}
