/* test_ops.c: libkwarm's kw_ops through a real kwarmd, on a stand-in
 * device that runs each launch's CPU reference (issue 22).
 *
 * kw_ops_load() warms a deployment's rank and loads every key of it; a
 * call is dispatched, checked and launched with the kernel parameters
 * the contract lays out, and its outputs equal the reference called
 * directly with the arguments the caller meant; a key not loaded is
 * fetched, counted, logged once and audited by kwarmd with this pid
 * outside capture, and refused, with nothing fetched or loaded, while
 * the stream captures.  kwarmd compiles instantly here (the kwarm-compile
 * test hook), so the cubins are stand-ins: nothing is loaded into CUDA.
 */
#include "daemon_util.h"
#include "kw_client.h"
#include "kw_kernels.h"
#include "kw_ops.h"

#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

TestSuite(ops, .fini = kwd_cleanup);

/* The stand-in device: launches run kw_k_cpu_launch() on host pointers;
 * capturing is a flag the test sets. */
typedef struct standin {
    bool capturing;
    bool concurrent; /* launches from several threads: last not kept */
    _Atomic unsigned launches;
    kw_launch_geo last;
    int logs;
    char log[2048];
} standin;

static int standin_launch(void *ctx, int fam, const int64_t *fields,
                          const kw_launch_geo *geo, void **args,
                          uintptr_t stream)
{
    standin *s = ctx;
    (void)stream;
    s->launches++;
    if (!s->concurrent)
        s->last = *geo;
    return kw_k_cpu_launch((kw_k_family)fam, fields, args);
}

static int standin_capturing(void *ctx, uintptr_t stream, bool *out)
{
    (void)stream;
    *out = ((standin *)ctx)->capturing;
    return 0;
}

static void standin_log(void *ctx, const char *line)
{
    standin *s = ctx;
    s->logs++;
    snprintf(s->log, sizeof(s->log), "%s", line);
}

static char *fixture_text(const char *name)
{
    char path[512];
    snprintf(path, sizeof(path), "%s/%s", KW_FIXTURES, name);
    char *t = kw_test_read_file(path, NULL);
    cr_assert_not_null(t, "%s", path);
    return t;
}

/* kwarmd with instant compiles, and kw_ops for V3.2 at dcp_world 2,
 * rank 1, on the stand-in. */
static kw_ops *start(kwd *d, standin *s, kw_ops_device *dev, char **config)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    kwd_init(d, "ops");
    kwd_start(d, 2, NULL);
    *dev = (kw_ops_device){s, standin_launch, standin_capturing};
    *config = fixture_text("deepseek-v3.2-exp.json");
    kw_ops_opts o = {.socket = d->sock, .config_json = *config,
                     .deployment_json = "{\"dcp_world\": 2, \"dcp_rank\": 1}",
                     .name = "deepseek-v3.2-exp.json", .arch = "sm_90",
                     .device = dev, .log = standin_log, .log_ctx = s};
    kw_ops *ops = NULL;
    char err[512] = "";
    cr_assert_eq(kw_ops_load(&ops, &o, err, sizeof(err)), 0, "%s", err);
    return ops;
}

Test(ops, loads_every_key_of_its_rank_and_only_those)
{
    kwd d;
    standin s = {0};
    kw_ops_device dev;
    char *config;
    kw_ops *ops = start(&d, &s, &dev, &config);
    /* `kwarm keys ... --dcp-world 2 --dcp-rank 1` counts the same. */
    char path[512];
    snprintf(path, sizeof(path), "%s/deepseek-v3.2-exp.json", KW_FIXTURES);
    const char *argv[] = {KW_KWARM_BIN, "keys", "--model", path,
                          "--dcp-world", "2", "--dcp-rank", "1", "--json",
                          NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_run(argv, &out, &err), 0, "%s", err);
    cJSON *doc = cJSON_Parse(out);
    size_t want = (size_t)cJSON_GetArraySize(
        cJSON_GetObjectItemCaseSensitive(doc, "keys"));
    kw_ops_stats st;
    kw_ops_stats_get(ops, &st);
    cr_assert_eq(st.loaded, want, "loaded %llu of %zu keys",
                 (unsigned long long)st.loaded, want);
    cr_assert_eq(kw_ops_each(ops, NULL, NULL), want);
    cr_assert_eq(st.runtime_misses, 0);
    const kw_launch_deploy *dp = kw_ops_deploy(ops);
    cr_assert_eq(dp->dcp_world, 2);
    cr_assert_eq(dp->dcp_rank, 1);
    cr_assert_eq(dp->index_topk, 2048);
    cr_assert_eq(dp->index_n_heads, 64);
    cJSON_Delete(doc);
    free(out);
    free(err);
    kw_ops_free(ops);
    free(config);
    kwd_stop(&d);
}

/* indexer_topk, windowed and by row end, as the reference computes it
 * from the arguments the caller meant. */
Test(ops, indexer_topk_runs_with_the_parameters_the_caller_meant)
{
    kwd d;
    standin s = {0};
    kw_ops_device dev;
    char *config;
    kw_ops *ops = start(&d, &s, &dev, &config);
    enum { ROWS = 3, STRIDE = 3000, TOPK = 2048 };
    static float logits[ROWS * STRIDE];
    static int32_t got[ROWS * TOPK], want[ROWS * TOPK];
    for (int i = 0; i < ROWS * STRIDE; i++)
        logits[i] = (float)((i * 7919) % 1009) - 500.0f;
    int32_t ks[ROWS] = {0, 100, 2999}, ke[ROWS] = {3000, 2500, 3000};
    for (int win = 0; win < 2; win++) {
        kw_launch_call c = {0};
        c.a[KW_LAUNCH_TOPK_LOGITS] = (int64_t)(uintptr_t)logits;
        c.a[KW_LAUNCH_TOPK_KS] = win ? (int64_t)(uintptr_t)ks : 0;
        c.a[KW_LAUNCH_TOPK_KE] = win ? (int64_t)(uintptr_t)ke : 0;
        c.a[KW_LAUNCH_TOPK_ROW_END] = win ? 0 : (int64_t)(uintptr_t)ke;
        c.a[KW_LAUNCH_TOPK_NUM_ROWS] = ROWS;
        c.a[KW_LAUNCH_TOPK_STRIDE] = STRIDE;
        c.a[KW_LAUNCH_TOPK_TOPK_POS] = (int64_t)(uintptr_t)got;
        memset(got, 0x5a, sizeof(got));
        cr_assert_eq(kw_ops_run(ops, KW_LAUNCH_INDEXER_TOPK, &c, 0), 0, "%s",
                     kw_ops_last_error(ops));
        kw_k_itopk_args r = {.topk = TOPK, .windowed = win, .num_rows = ROWS,
                             .stride = STRIDE, .logits = logits,
                             .ks = ks, .ke = ke, .row_end = ke,
                             .topk_pos = want};
        cr_assert_eq(kw_k_ref_indexer_topk(&r), 0);
        cr_assert_arr_eq(got, want, sizeof(got), "windowed %d differs", win);
        cr_assert_eq(s.last.grid[0], ROWS);
        cr_assert_eq(s.last.block[0], 512);
        cr_assert_eq(s.last.shmem, kw_k_shmem_bytes(KW_K_INDEXER_TOPK,
                                                    (int64_t[]){TOPK, win}));
    }
    kw_ops_stats st;
    kw_ops_stats_get(ops, &st);
    cr_assert_eq(st.launches, 2);
    cr_assert_eq(st.runtime_misses, 0, "both forms were warmed");
    kw_ops_free(ops);
    free(config);
    kwd_stop(&d);
}

/* index_conversion in the deployment's geometry, counted and compacted:
 * the rank, world and interleave come from the deployment, the key's
 * booleans from which pointers are given. */
Test(ops, index_conversion_runs_in_the_deployments_geometry)
{
    kwd d;
    standin s = {0};
    kw_ops_device dev;
    char *config;
    kw_ops *ops = start(&d, &s, &dev, &config);
    enum { ROWS = 5, REQS = 3, WIDTH = 32, TOPK = 2048 };
    static int32_t req_id[ROWS], table[REQS * WIDTH], pos[ROWS * TOPK];
    static int32_t got[ROWS * TOPK], want[ROWS * TOPK];
    static int32_t cnt_got[ROWS], cnt_want[ROWS];
    for (int i = 0; i < ROWS; i++)
        req_id[i] = i % REQS;
    for (int i = 0; i < REQS * WIDTH; i++)
        table[i] = 1000 + i * 3;
    for (int i = 0; i < ROWS * TOPK; i++)
        pos[i] = (i * 37) % 5000 - 1;
    kw_launch_call c = {0};
    c.a[KW_LAUNCH_IC_REQ_ID] = (int64_t)(uintptr_t)req_id;
    c.a[KW_LAUNCH_IC_BLOCK_TABLE] = (int64_t)(uintptr_t)table;
    c.a[KW_LAUNCH_IC_TOPK_POS] = (int64_t)(uintptr_t)pos;
    c.a[KW_LAUNCH_IC_NUM_ROWS] = ROWS;
    c.a[KW_LAUNCH_IC_NUM_REQS] = REQS;
    c.a[KW_LAUNCH_IC_WIDTH] = WIDTH;
    c.a[KW_LAUNCH_IC_OUT] = (int64_t)(uintptr_t)got;
    c.a[KW_LAUNCH_IC_VALID_COUNT] = (int64_t)(uintptr_t)cnt_got;
    c.a[KW_LAUNCH_IC_COMPACT_TO_FRONT] = 1;
    cr_assert_eq(kw_ops_run(ops, KW_LAUNCH_INDEX_CONVERSION, &c, 0), 0, "%s",
                 kw_ops_last_error(ops));
    kw_k_ic_args r = {.block_size = 64, .block_stride_rows = 64,
                      .count_valid = true, .compact_to_front = true,
                      .dcp_size = 2, .dcp_rank = 1, .dcp_interleave = 1,
                      .topk = TOPK, .num_rows = ROWS, .num_reqs = REQS,
                      .width = WIDTH, .req_id = req_id, .block_table = table,
                      .topk_pos = pos, .out = want, .valid_count = cnt_want};
    cr_assert_eq(kw_k_ref_index_conversion(&r), 0);
    cr_assert_arr_eq(got, want, sizeof(got));
    cr_assert_arr_eq(cnt_got, cnt_want, sizeof(cnt_got));
    cr_assert_eq(s.last.block[0], 256, "count_valid, topk a power of 2: "
                                      "8 warps");
    kw_ops_free(ops);
    free(config);
    kwd_stop(&d);
}

/* The misses kwarmd's audit holds for this process, of kind ("runtime",
 * "capture"; NULL: any). */
static int audited(const char *sock, const char *kind)
{
    kw_client *c = NULL;
    cr_assert_eq(kw_client_connect(&c, sock, 5000, NULL, 0), 0);
    char *doc = NULL;
    cr_assert_eq(kw_client_misses(c, 0, &doc), 0, "%s",
                 kw_client_last_error(c));
    cJSON *j = cJSON_Parse(doc);
    int n = 0;
    const cJSON *m;
    cJSON_ArrayForEach(m, cJSON_GetObjectItemCaseSensitive(j, "misses")) {
        const cJSON *pid = cJSON_GetObjectItemCaseSensitive(m, "pid");
        const char *k = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(m, "kind"));
        n += cJSON_IsNumber(pid) && (pid_t)pid->valuedouble == getpid() &&
             (!kind || (k && strcmp(k, kind) == 0));
    }
    cJSON_Delete(j);
    free(doc);
    kw_client_close(c);
    return n;
}

/* kwarmd's count of compiles started. */
static double compiles(const char *sock)
{
    kw_client *c = NULL;
    cr_assert_eq(kw_client_connect(&c, sock, 5000, NULL, 0), 0);
    char *doc = NULL;
    cr_assert_eq(kw_client_stats(c, &doc), 0);
    cJSON *j = cJSON_Parse(doc);
    double n = cJSON_GetNumberValue(
        cJSON_GetObjectItemCaseSensitive(j, "compiles_started"));
    cJSON_Delete(j);
    free(doc);
    kw_client_close(c);
    return n;
}

/* A prefill logits call at 32 heads on a 64-head deployment: its key was
 * not warmed. */
static kw_launch_call unwarmed_call(float *out)
{
    static uint8_t q[4 * 32 * 128], k[10 * 128];
    static float w[4 * 32], ksc[10];
    static int32_t ks[4], ke[4];
    for (int i = 0; i < 4; i++)
        ke[i] = 10;
    kw_launch_call c = {.a = {(int64_t)(uintptr_t)q, (int64_t)(uintptr_t)w,
                              (int64_t)(uintptr_t)k, (int64_t)(uintptr_t)ksc,
                              (int64_t)(uintptr_t)ks, (int64_t)(uintptr_t)ke,
                              4, 10, 10, (int64_t)(uintptr_t)out, 32, 128}};
    return c;
}

Test(ops, a_miss_during_capture_loads_nothing_and_outside_is_served_once)
{
    kwd d;
    standin s = {0};
    kw_ops_device dev;
    char *config;
    kw_ops *ops = start(&d, &s, &dev, &config);
    float out[40];
    kw_launch_call c = unwarmed_call(out);
    int64_t f[KW_LAUNCH_MAX_FIELDS];
    bool loaded = true;
    cr_assert_eq(kw_ops_dispatch(ops, KW_LAUNCH_INDEXER_LOGITS, &c, f,
                                 &loaded), 0);
    cr_assert(!loaded);
    size_t before = kw_ops_each(ops, NULL, NULL);
    int audit0 = audited(d.sock, NULL);
    double compiled0 = compiles(d.sock);

    s.capturing = true;
    int rc = kw_ops_run(ops, KW_LAUNCH_INDEXER_LOGITS, &c, 0);
    cr_assert_eq(rc, KW_ECAPTURE, "%s", kw_strerror(rc));
    const char *e = kw_ops_last_error(ops);
    cr_assert(strstr(e, "\"heads\": 32") && strstr(e, "index_n_heads") &&
                  strstr(e, "capturing"),
              "the error names the key and the setting: %s", e);
    cr_assert_eq(kw_ops_each(ops, NULL, NULL), before, "nothing loaded");
    cr_assert_eq(s.launches, 0);
    cr_assert_eq(audited(d.sock, "capture"), 1, "kwarmd audits the capture");
    cr_assert_eq(compiles(d.sock), compiled0, "and compiles nothing for it");

    s.capturing = false;
    for (int i = 0; i < 3; i++)
        cr_assert_eq(kw_ops_run(ops, KW_LAUNCH_INDEXER_LOGITS, &c, 0), 0,
                     "%s", kw_ops_last_error(ops));
    kw_ops_stats st;
    kw_ops_stats_get(ops, &st);
    cr_assert_eq(st.runtime_misses, 1, "fetched once, then loaded");
    cr_assert_eq(st.capture_misses, 1);
    cr_assert_eq(st.launches, 3);
    cr_assert_eq(kw_ops_each(ops, NULL, NULL), before + 1);
    cr_assert_eq(s.logs, 1, "logged once");
    cr_assert(strstr(s.log, "runtime miss") && strstr(s.log, "\"heads\": 32"),
              "%s", s.log);
    cr_assert_eq(audited(d.sock, "runtime"), 1,
                 "kwarmd audits the runtime miss with this pid");
    cr_assert_eq(audited(d.sock, NULL), audit0 + 2);

    /* A second process's handle misses the same key: kwarmd now holds it,
     * and still audits the miss. */
    kw_ops_opts o2 = {.socket = d.sock, .config_json = config,
                      .deployment_json = "{\"dcp_world\": 2, \"dcp_rank\": 0}",
                      .arch = "sm_90", .device = &dev};
    kw_ops *ops2 = NULL;
    char err[512] = "";
    cr_assert_eq(kw_ops_load(&ops2, &o2, err, sizeof(err)), 0, "%s", err);
    double compiled1 = compiles(d.sock);
    cr_assert_eq(kw_ops_run(ops2, KW_LAUNCH_INDEXER_LOGITS, &c, 0), 0, "%s",
                 kw_ops_last_error(ops2));
    cr_assert_eq(compiles(d.sock), compiled1, "a hit in kwarmd's cache");
    cr_assert_eq(audited(d.sock, "runtime"), 2, "audited all the same");
    kw_ops_free(ops2);
    kw_ops_free(ops);
    free(config);
    kwd_stop(&d);
}

Test(ops, refuses_a_deployment_it_cannot_serve_before_any_work)
{
    kwd d;
    standin s = {0};
    kw_ops_device dev;
    char *config;
    kw_ops *ops = start(&d, &s, &dev, &config);
    kw_ops_free(ops);
    const struct {
        const char *dep, *arch, *names;
    } bad[] = {{"{\"dcp_world\": 2}", "sm_90", "dcp_rank"},
               {"{\"dcp_world\": 2, \"dcp_rank\": \"all\"}", "sm_90",
                "dcp_rank"},
               {"{\"arch\": \"sm_100\"}", "sm_90", "arch"},
               {"{\"arch\": [\"sm_90\"]}", "sm_90", "arch"},
               {"[1]", "sm_90", "deployment"}};
    for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++) {
        kw_ops_opts o = {.socket = d.sock, .config_json = config,
                         .deployment_json = bad[i].dep, .arch = bad[i].arch,
                         .device = &dev};
        char err[512] = "";
        kw_ops *x = NULL;
        int rc = kw_ops_load(&x, &o, err, sizeof(err));
        cr_assert_lt(rc, 0, "%s accepted", bad[i].dep);
        cr_assert_null(x);
        cr_assert(strstr(err, bad[i].names), "%s: %s", bad[i].dep, err);
    }
    /* Fetch only, from a kwarmd that has not compiled this deployment. */
    kw_ops_opts cold = {.socket = d.sock, .config_json = config,
                        .deployment_json = "{\"dcp_world\": 4, "
                                           "\"dcp_rank\": 3}",
                        .arch = "sm_90", .device = &dev, .no_warmup = true};
    char cerr[512] = "";
    kw_ops *y = NULL;
    cr_assert_eq(kw_ops_load(&y, &cold, cerr, sizeof(cerr)), KW_ENOTFOUND,
                 "%s", cerr);
    cr_assert(strstr(cerr, "is not in kwarmd's cache"), "%s", cerr);
    cold.no_warmup = false; /* the same, warming: served */
    cr_assert_eq(kw_ops_load(&y, &cold, cerr, sizeof(cerr)), 0, "%s", cerr);
    kw_ops_free(y);
    kw_ops_opts none = {.socket = d.sock, .config_json = config};
    char err[256] = "";
    kw_ops *x = NULL;
    cr_assert_eq(kw_ops_load(&x, &none, err, sizeof(err)), KW_EINVAL);
    cr_assert(strstr(err, "device"), "%s", err);
    free(config);
    kwd_stop(&d);
}

/* ---- on a GPU (skipped without a driver) ------------------------------- */

/* indexer_topk and a runtime miss of index_conversion on the device, with
 * kernels NVRTC really compiled: the path a C serving process takes. */
Test(ops, gpu_loaded_kernels_match_the_reference, .timeout = 600)
{
    kw_cuda *cu = NULL;
    char err[512] = "";
    if (kw_cuda_open(&cu, 0, err, sizeof(err)) < 0)
        cr_skip_test("no CUDA device: %s", err);
    kwd d;
    kwd_init(&d, "ops-gpu");
    kwd_start(&d, 8, NULL);
    char *config = fixture_text("deepseek-v3.2-exp.json");
    kw_ops_opts o = {.socket = d.sock, .config_json = config,
                     .timeout_ms = 300000, .cuda = cu};
    kw_ops *ops = NULL;
    cr_assert_eq(kw_ops_load(&ops, &o, err, sizeof(err)), 0, "%s", err);
    enum { ROWS = 5, STRIDE = 5000, TOPK = 2048 };
    static float logits[ROWS * STRIDE];
    static int32_t got[ROWS * TOPK], want[ROWS * TOPK];
    int32_t row_end[ROWS] = {5000, 17, 0, 2048, 4999};
    for (int i = 0; i < ROWS * STRIDE; i++)
        logits[i] = (float)((i * 7919) % 1013) * (i % 3 ? 1.0f : -1.0f);
    uint64_t dl, dr, dp;
    cr_assert_eq(kw_cuda_alloc(cu, sizeof(logits), &dl), 0);
    cr_assert_eq(kw_cuda_alloc(cu, sizeof(row_end), &dr), 0);
    cr_assert_eq(kw_cuda_alloc(cu, sizeof(got), &dp), 0);
    cr_assert_eq(kw_cuda_h2d(cu, dl, logits, sizeof(logits)), 0);
    cr_assert_eq(kw_cuda_h2d(cu, dr, row_end, sizeof(row_end)), 0);
    kw_launch_call c = {.a = {(int64_t)dl, 0, 0, ROWS, STRIDE, (int64_t)dp,
                              (int64_t)dr}};
    cr_assert_eq(kw_ops_run(ops, KW_LAUNCH_INDEXER_TOPK, &c, 0), 0, "%s",
                 kw_ops_last_error(ops));
    cr_assert_eq(kw_cuda_sync(cu), 0, "%s", kw_cuda_last_error(cu));
    cr_assert_eq(kw_cuda_d2h(cu, got, dp, sizeof(got)), 0);
    kw_k_itopk_args r = {.topk = TOPK, .num_rows = ROWS, .stride = STRIDE,
                         .logits = logits, .row_end = row_end,
                         .topk_pos = want};
    cr_assert_eq(kw_k_ref_indexer_topk(&r), 0);
    cr_assert_arr_eq(got, want, sizeof(got));
    kw_ops_stats st;
    kw_ops_stats_get(ops, &st);
    cr_assert_eq(st.runtime_misses, 0);

    /* Compacting without counting: a class V3.2 does not warm.  Fetched
     * (kwarmd compiles it), loaded, and right. */
    enum { REQS = 2, WIDTH = 1280 };
    static int32_t req_id[ROWS], table[REQS * WIDTH], out[ROWS * TOPK],
        ref[ROWS * TOPK];
    for (int i = 0; i < ROWS; i++)
        req_id[i] = i % REQS;
    for (int i = 0; i < REQS * WIDTH; i++)
        table[i] = (i * 13) % 7777;
    uint64_t dq, dt, dout;
    cr_assert_eq(kw_cuda_alloc(cu, sizeof(req_id), &dq), 0);
    cr_assert_eq(kw_cuda_alloc(cu, sizeof(table), &dt), 0);
    cr_assert_eq(kw_cuda_alloc(cu, sizeof(out), &dout), 0);
    cr_assert_eq(kw_cuda_h2d(cu, dq, req_id, sizeof(req_id)), 0);
    cr_assert_eq(kw_cuda_h2d(cu, dt, table, sizeof(table)), 0);
    kw_launch_call ic = {0};
    ic.a[KW_LAUNCH_IC_REQ_ID] = (int64_t)dq;
    ic.a[KW_LAUNCH_IC_BLOCK_TABLE] = (int64_t)dt;
    ic.a[KW_LAUNCH_IC_TOPK_POS] = (int64_t)dp; /* the top-k just computed */
    ic.a[KW_LAUNCH_IC_NUM_ROWS] = ROWS;
    ic.a[KW_LAUNCH_IC_NUM_REQS] = REQS;
    ic.a[KW_LAUNCH_IC_WIDTH] = WIDTH;
    ic.a[KW_LAUNCH_IC_OUT] = (int64_t)dout;
    ic.a[KW_LAUNCH_IC_COMPACT_TO_FRONT] = 1;
    cr_assert_eq(kw_ops_run(ops, KW_LAUNCH_INDEX_CONVERSION, &ic, 0), 0,
                 "%s", kw_ops_last_error(ops));
    cr_assert_eq(kw_cuda_sync(cu), 0, "%s", kw_cuda_last_error(cu));
    cr_assert_eq(kw_cuda_d2h(cu, out, dout, sizeof(out)), 0);
    kw_k_ic_args ir = {.block_size = 64, .block_stride_rows = 64,
                       .compact_to_front = true, .dcp_size = 1,
                       .dcp_interleave = 1, .topk = TOPK, .num_rows = ROWS,
                       .num_reqs = REQS, .width = WIDTH, .req_id = req_id,
                       .block_table = table, .topk_pos = want, .out = ref};
    cr_assert_eq(kw_k_ref_index_conversion(&ir), 0);
    cr_assert_arr_eq(out, ref, sizeof(out));
    kw_ops_stats_get(ops, &st);
    cr_assert_eq(st.runtime_misses, 1);
    kw_cuda_free(cu, dq);
    kw_cuda_free(cu, dt);
    kw_cuda_free(cu, dout);
    kw_cuda_free(cu, dl);
    kw_cuda_free(cu, dr);
    kw_cuda_free(cu, dp);
    kw_ops_free(ops);
    free(config);
    kwd_stop(&d);
    kw_cuda_close(cu);
}

/* Eight threads call an unwarmed key at once, 50 times each: one fetch,
 * every launch made, the table never torn. */
typedef struct hammer {
    kw_ops *ops;
    int failures;
} hammer;

static void *hammer_run(void *arg)
{
    hammer *h = arg;
    float out[40];
    kw_launch_call c = unwarmed_call(out);
    for (int i = 0; i < 50; i++)
        h->failures += kw_ops_run(h->ops, KW_LAUNCH_INDEXER_LOGITS, &c, 0) != 0;
    return NULL;
}

Test(ops, threads_that_miss_at_once_fetch_the_key_once)
{
    kwd d;
    standin s = {0};
    kw_ops_device dev;
    char *config;
    kw_ops *ops = start(&d, &s, &dev, &config);
    s.concurrent = true;
    pthread_t t[8];
    hammer h[8];
    for (int i = 0; i < 8; i++) {
        h[i] = (hammer){ops, 0};
        cr_assert_eq(pthread_create(&t[i], NULL, hammer_run, &h[i]), 0);
    }
    for (int i = 0; i < 8; i++) {
        pthread_join(t[i], NULL);
        cr_assert_eq(h[i].failures, 0, "%s", kw_ops_last_error(ops));
    }
    kw_ops_stats st;
    kw_ops_stats_get(ops, &st);
    cr_assert_eq(st.runtime_misses, 1);
    cr_assert_eq(st.launches, 400);
    cr_assert_eq(s.launches, 400);
    cr_assert_eq(s.logs, 1, "logged once");
    kw_ops_free(ops);
    free(config);
    kwd_stop(&d);
}
