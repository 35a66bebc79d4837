/* test_metrics.c: kwarmd's Prometheus endpoint (issue 13, point 1).
 *
 * Against a real kwarmd (daemon_util.h) started with --metrics-listen on a
 * free loopback port: a real HTTP client (python3's urllib) scrapes
 * /metrics, the Prometheus client library's own text parser
 * (python3-prometheus-client) reads it, and the values are checked
 * against `kwarm stats --json` taken in the same test, and against the
 * warmup's own manifest; `promtool check metrics` lints the text; a real
 * Prometheus server scrapes kwarmd and answers a query for a kwarm
 * counter.  Compiles are instant stand-ins (KWARM_TEST_INSTANT_COMPILE)
 * and one family's worker crashes (KWARM_TEST_CRASH_FAMILY), so every
 * result appears and the suite needs no GPU.
 */
#include "daemon_util.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <math.h>
#include <netinet/in.h>

TestSuite(metrics, .fini = kwd_cleanup, .timeout = 120);

#define V32 "deepseek-v3.2-exp.json"
#define V4 "deepseek-v4-flash.json"  /* has the crashing family, V32 not */
#define CRASH_FAMILY "compressed_slot_mapping"
#define PROM_WAIT_MS 60000 /* Prometheus start, first scrape, query */

/* python3 with the Debian modules (a pyenv shim first in PATH may lack
 * them), else the first in PATH. */
static const char *python(void)
{
    return access("/usr/bin/python3", X_OK) == 0 ? "/usr/bin/python3" : "python3";
}

/* Scrapes URL (or reads "file:PATH") and parses it with
 * prometheus_client's text parser; prints {"content_type", "families":
 * {name: type}, "samples": [[name, {labels}, value]...]}.  SAVE ("-":
 * none) gets the raw text. */
static const char scrape_py[] =
    "import json, sys, urllib.request\n"
    "from prometheus_client.parser import text_string_to_metric_families\n"
    "url, save = sys.argv[1], sys.argv[2]\n"
    "ctype = ''\n"
    "if url.startswith('file:'):\n"
    "    text = open(url[5:]).read()\n"
    "else:\n"
    "    with urllib.request.urlopen(url, timeout=10) as r:\n"
    "        ctype = r.headers.get('Content-Type')\n"
    "        text = r.read().decode()\n"
    "if save != '-':\n"
    "    open(save, 'w').write(text)\n"
    "out = {'content_type': ctype, 'families': {}, 'samples': []}\n"
    "for fam in text_string_to_metric_families(text):\n"
    "    out['families'][fam.name] = fam.type\n"
    "    for s in fam.samples:\n"
    "        out['samples'].append([s.name, s.labels, s.value])\n"
    "print(json.dumps(out))\n";

/* Skips the test when python3 cannot import prometheus_client (deps.sh
 * installs python3-prometheus-client). */
static void need_parser(void)
{
    const char *argv[] = {python(), "-c", "import prometheus_client", NULL};
    if (kw_test_run(argv, NULL, NULL) != 0)
        cr_skip_test("python3-prometheus-client is not installed");
}

/* The path of program name in PATH (buf), or NULL. */
static const char *which(const char *name, char *buf, size_t cap)
{
    const char *path = getenv("PATH");
    char dirs[4096];
    snprintf(dirs, sizeof dirs, "%s", path ? path : "/usr/bin:/bin");
    for (char *save = NULL, *d = strtok_r(dirs, ":", &save); d != NULL;
         d = strtok_r(NULL, ":", &save)) {
        snprintf(buf, cap, "%s/%s", d, name);
        if (access(buf, X_OK) == 0)
            return buf;
    }
    return NULL;
}

/* A loopback TCP port nobody listens on now (bound to port 0, read back,
 * closed). */
static int free_port(int family)
{
    struct sockaddr_storage ss = {0};
    socklen_t len;
    if (family == AF_INET6) {
        struct sockaddr_in6 *s = (struct sockaddr_in6 *)&ss;
        s->sin6_family = AF_INET6;
        s->sin6_addr = in6addr_loopback;
        len = sizeof *s;
    } else {
        struct sockaddr_in *s = (struct sockaddr_in *)&ss;
        s->sin_family = AF_INET;
        s->sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        len = sizeof *s;
    }
    int fd = socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
    cr_assert(fd >= 0, "socket: %s", strerror(errno));
    cr_assert_eq(bind(fd, (struct sockaddr *)&ss, len), 0, "bind: %s",
                 strerror(errno));
    cr_assert_eq(getsockname(fd, (struct sockaddr *)&ss, &len), 0);
    int port = ntohs(family == AF_INET6 ? ((struct sockaddr_in6 *)&ss)->sin6_port
                                        : ((struct sockaddr_in *)&ss)->sin_port);
    close(fd);
    return port;
}

/* Starts kwarmd (instant compiles, one crashing family) with
 * --metrics-listen listen; c connected. */
static void up(kwd *d, kwc *c, const char *tag, const char *listen)
{
    cr_assert_eq(setenv("KWARM_TEST_INSTANT_COMPILE", "1", 1), 0);
    cr_assert_eq(setenv("KWARM_TEST_CRASH_FAMILY", CRASH_FAMILY, 1), 0);
    const char *extra[] = {"--metrics-listen", listen, NULL};
    kwd_up(d, tag, 2, extra, c);
}

/* Scrapes url with the parser script, SAVE as in scrape_py; the parsed
 * document (cJSON_Delete it). */
static cJSON *scrape(const char *url, const char *save)
{
    const char *argv[] = {python(), "-c", scrape_py, url, save, NULL};
    char *out = NULL, *err = NULL;
    int st = kw_test_run(argv, &out, &err);
    cr_assert_eq(st, 0, "scrape %s: exit %d: %s", url, st, err);
    cJSON *doc = cJSON_Parse(out);
    cr_assert(cJSON_IsObject(doc), "scrape %s: %.300s", url, out);
    free(out);
    free(err);
    return doc;
}

/* True when sample labels hold every "k=v" of want ("a=b,c=d"; "" any). */
static bool labels_match(const cJSON *labels, const char *want)
{
    char buf[256];
    snprintf(buf, sizeof buf, "%s", want);
    for (char *save = NULL, *kv = strtok_r(buf, ",", &save); kv != NULL;
         kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        cr_assert_not_null(eq);
        *eq = '\0';
        const char *v = cJSON_GetStringValue(
            cJSON_GetObjectItemCaseSensitive(labels, kv));
        if (v == NULL || strcmp(v, eq + 1) != 0)
            return false;
    }
    return true;
}

/* The sum of the samples called name whose labels match want; fails the
 * test when there is none. */
static double msum(const cJSON *doc, const char *name, const char *want)
{
    const cJSON *s;
    double sum = 0;
    int n = 0;
    cJSON_ArrayForEach(s, cJSON_GetObjectItemCaseSensitive(doc, "samples")) {
        const cJSON *nm = cJSON_GetArrayItem(s, 0);
        if (strcmp(nm->valuestring, name) != 0 ||
            !labels_match(cJSON_GetArrayItem(s, 1), want))
            continue;
        sum += cJSON_GetArrayItem(s, 2)->valuedouble;
        n++;
    }
    cr_assert(n > 0, "no sample %s{%s}", name, want);
    return sum;
}

/* A number of a stats --json document. */
static double jnum(const cJSON *j, const char *name)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(j, name);
    cr_assert(cJSON_IsNumber(v), "stats --json lacks %s", name);
    return v->valuedouble;
}

/* Runs kwarm with args (after argv[0]); its stdout (free() it). */
static char *kwarm(const char *const *args, int want_status)
{
    char *out = NULL, *err = NULL;
    int st = kw_test_kwarm(args, &out, &err);
    cr_assert_eq(st, want_status, "kwarm %s: exit %d: %s", args[0], st, err);
    free(err);
    return out;
}

/* `promtool check metrics` on file: exit 0 and no complaint, or a skip
 * when promtool is not installed (deps.sh installs prometheus). */
static void promtool_passes(const char *file)
{
    char tool[512], cmd[1200];
    if (which("promtool", tool, sizeof tool) == NULL)
        cr_skip_test("promtool is not installed");
    snprintf(cmd, sizeof cmd, "'%s' check metrics < '%s'", tool, file);
    const char *argv[] = {"/bin/sh", "-c", cmd, NULL};
    char *out = NULL, *err = NULL;
    int st = kw_test_run(argv, &out, &err);
    cr_expect_eq(st, 0, "promtool check metrics: exit %d: %s%s", st, out, err);
    cr_expect_str_empty(err, "promtool: %s", err);
    free(out);
    free(err);
}

/* A warmup of fixture through kwarm (pinned as pin unless NULL), exiting
 * with want; its --json document. */
static cJSON *warmup(const kwd *d, const char *fixture, const char *pin,
                     int want)
{
    char path[512];
    snprintf(path, sizeof path, "%s/%s", KW_FIXTURES, fixture);
    const char *argv[] = {KW_KWARM_BIN, "warmup", "--model", path, "--socket",
                          d->sock, "--json", pin ? "--pin" : NULL, pin, NULL};
    char *out = NULL, *err = NULL;
    int st = kw_test_run(argv, &out, &err);
    cr_assert_eq(st, want, "warmup %s: exit %d: %s", fixture, st, err);
    cJSON *doc = cJSON_Parse(out);
    cr_assert(cJSON_IsObject(doc), "warmup --json: %.300s", out);
    free(out);
    free(err);
    return doc;
}

/* How many results of the warmups (an array of --json documents) have
 * family and status. */
static double manifest_count(const cJSON *docs, const char *family,
                             const char *status)
{
    const cJSON *e, *doc;
    double n = 0;
    cJSON_ArrayForEach(doc, docs)
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "manifest")) {
        const char *f = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "family"));
        const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "status"));
        n += f && s && strcmp(f, family) == 0 && strcmp(s, status) == 0;
    }
    return n;
}

/* Traffic of every kind: pings, a pinned warmup that compiles every key,
 * one whose family crashes, a get that hits and one that errs, a keys
 * request, a protocol error.  Returns the warmups' documents (an array);
 * *digest gets a compiled key's digest. */
static cJSON *traffic(kwd *d, kwc *c, char digest[65])
{
    kwc_expect_pong(c, "ping 1");
    kwc_expect_pong(c, "ping 2");
    cJSON *docs = cJSON_CreateArray();
    cJSON *doc = warmup(d, V32, "p1", 0);
    cJSON_AddItemToArray(docs, doc);
    cJSON_AddItemToArray(docs, warmup(d, V4, NULL, 1));
    const cJSON *e;
    digest[0] = '\0';
    cJSON_ArrayForEach(e, cJSON_GetObjectItemCaseSensitive(doc, "manifest")) {
        const char *s = cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(e, "status"));
        if (digest[0] == '\0' && s && strcmp(s, "compiled") == 0)
            snprintf(digest, 65, "%s", cJSON_GetStringValue(
                                           cJSON_GetObjectItemCaseSensitive(e, "digest")));
    }
    cr_assert(digest[0] != '\0', "no key compiled");
    cJSON *h = cJSON_CreateObject();
    cJSON_AddStringToObject(h, "digest", digest);
    kwr r = kwc_call(c, KW_PROTO_GET, h, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "get (hit)");
    kwr_free(&r);
    cJSON_ReplaceItemInObject(h, "digest", cJSON_CreateString("zz"));
    r = kwc_call(c, KW_PROTO_GET, h, NULL);
    kwr_expect_type(&r, KW_PROTO_ERROR, "get (bad digest)");
    kwr_free(&r);
    cJSON_Delete(h);
    h = kwd_model_hdr(V32, 0);
    r = kwc_call(c, KW_PROTO_KEYS, h, NULL);
    kwr_expect_type(&r, KW_PROTO_RESULT, "keys");
    kwr_free(&r);
    cJSON_Delete(h);
    kwc bad; /* a frame with a wrong magic: an ERROR frame, then a close */
    kwc_must_open(&bad, d->sock);
    cr_assert_eq(kwc_send_raw(&bad, "GET / HTTP/1.0\r\n\r\n", 18), 0);
    r = kwc_must_recv(&bad, KWD_REPLY_MS);
    kwr_expect_type(&r, KW_PROTO_ERROR, "bad frame");
    kwr_free(&r);
    kwc_close(&bad);
    return docs;
}

/* Every loop, cache, warm and fleet value of scrape m against stats j. */
static void expect_agree(const cJSON *m, const cJSON *j)
{
    cr_expect_eq(msum(m, "kwarm_requests_total", ""), jnum(j, "requests"));
    cr_expect_eq(msum(m, "kwarm_protocol_errors_total", ""),
                 jnum(j, "protocol_errors"));
    cr_expect_eq(msum(m, "kwarm_refused_connections_total", "reason=peer"),
                 jnum(j, "refused"));
    static const char *const same[][2] = {
        {"kwarm_cache_entries", "entries"}, {"kwarm_cache_bytes", "bytes"},
        {"kwarm_cache_max_bytes", "max_size"}, {"kwarm_cache_hits_total", "hits"},
        {"kwarm_cache_misses_total", "misses"},
        {"kwarm_cache_evictions_total", "evictions"},
        {"kwarm_cache_corrupt_total", "corrupt"},
        {"kwarm_warm_keys_total", "warm_keys"}, {"kwarm_warm_hits_total", "warm_hits"},
        {"kwarm_warm_misses_total", "warm_misses"},
        {"kwarm_warm_joined_total", "warm_joined"},
        {"kwarm_warm_cancelled_total", "cancelled"},
        {"kwarm_store_failures_total", "store_failures"},
        {"kwarm_compiles_queued", "compiles_queued"},
        {"kwarm_compile_workers_busy", "compiles_inflight"},
        {"kwarm_warm_jobs_active", "warm_jobs_active"}};
    for (size_t i = 0; i < sizeof same / sizeof same[0]; i++)
        cr_expect_eq(msum(m, same[i][0], ""), jnum(j, same[i][1]), "%s vs %s",
                     same[i][0], same[i][1]);
    /* A fresh cache: the persistent compile counts are kwarmd's own. */
    cr_expect_eq(msum(m, "kwarm_compiles_total", "result=compiled"),
                 jnum(j, "compiles"));
    cr_expect_eq(msum(m, "kwarm_compiles_total", "result=failed"),
                 jnum(j, "compile_failures"));
    cr_expect_eq(msum(m, "kwarm_compiles_total", "result=remote_hit"),
                 jnum(j, "remote_hits"));
    cr_expect_eq(msum(m, "kwarm_compile_duration_seconds_count", ""),
                 jnum(j, "compiles") + jnum(j, "compile_failures"));
    static const char *const remote[][2] = {
        {"op=fetch,result=hit", "remote_fetches"},
        {"op=fetch,result=miss", "remote_misses"},
        {"op=fetch,result=refused", "remote_refused"},
        {"op=put,result=ok", "remote_puts"},
        {"op=any,result=error", "remote_errors"}};
    for (size_t i = 0; i < 5; i++)
        cr_expect_eq(msum(m, "kwarm_remote_operations_total", remote[i][0]),
                     jnum(j, remote[i][1]), "%s", remote[i][1]);
}

/* Per family: the warmup's compiled and failed keys, as counted. */
static void expect_families(const cJSON *m, const cJSON *doc)
{
    static const char *const fams[] = {"prefill_chunk_metadata",
                                       "index_conversion", "indexer_logits",
                                       "indexer_topk", CRASH_FAMILY};
    for (size_t i = 0; i < 5; i++) {
        char want[128];
        snprintf(want, sizeof want, "family=%s,result=compiled", fams[i]);
        cr_expect_eq(msum(m, "kwarm_compiles_total", want),
                     manifest_count(doc, fams[i], "compiled"), "%s", want);
        snprintf(want, sizeof want, "family=%s,result=failed", fams[i]);
        cr_expect_eq(msum(m, "kwarm_compiles_total", want),
                     manifest_count(doc, fams[i], "failed"), "%s", want);
    }
    cr_expect_gt(manifest_count(doc, CRASH_FAMILY, "failed"), 0);
    cr_expect_gt(manifest_count(doc, "index_conversion", "compiled"), 0);
}

Test(metrics, a_scrape_agrees_with_stats_json_and_passes_promtool)
{
    need_parser();
    kwd d;
    kwc c;
    char listen[64], url[128], digest[65], saved[300];
    int port = free_port(AF_INET);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    snprintf(url, sizeof url, "http://%s/metrics", listen);
    up(&d, &c, "metrics", listen);
    cJSON *doc = traffic(&d, &c, digest);
    /* stats --json, then the scrape: nothing runs in between, and the
     * stats request itself has ended (counted) before its reply left. */
    const char *sargs[] = {"stats", "--socket", d.sock, "--json", NULL};
    char *sj = kwarm(sargs, 0);
    cJSON *j = cJSON_Parse(sj);
    cr_assert(cJSON_IsObject(j), "%s", sj);
    cr_expect_null(cJSON_GetObjectItemCaseSensitive(j, "prometheus"),
                   "stats --json carries the Prometheus text");
    snprintf(saved, sizeof saved, "%s/scrape.txt", d.dir);
    cJSON *m = scrape(url, saved);
    cr_expect_str_eq(cJSON_GetStringValue(cJSON_GetObjectItemCaseSensitive(m, "content_type")),
                     "text/plain; version=0.0.4; charset=utf-8");
    expect_agree(m, j);
    expect_families(m, doc);
    cr_expect_eq(msum(m, "kwarm_requests_total", "type=ping,result=ok"), 2);
    cr_expect_eq(msum(m, "kwarm_requests_total", "type=get,result=ok"), 1);
    cr_expect_eq(msum(m, "kwarm_requests_total", "type=get,result=error"), 1);
    cr_expect_eq(msum(m, "kwarm_requests_total", "type=warmup,result=ok"), 2);
    cr_expect_eq(msum(m, "kwarm_get_duration_seconds_count", ""), 2);
    /* Pins: the first warmup's keys, as the cache itself counts them
     * (stats --cache reads the same LMDB). */
    const char *cargs[] = {"stats", "--cache", d.cache, "--json", NULL};
    char *cj = kwarm(cargs, 0);
    cJSON *cs = cJSON_Parse(cj);
    cr_assert(cJSON_IsObject(cs), "%s", cj);
    cr_expect_eq(msum(m, "kwarm_cache_pinned_entries", ""), jnum(cs, "pinned_entries"));
    cr_expect_eq(msum(m, "kwarm_cache_pinned_bytes", ""), jnum(cs, "pinned_bytes"));
    cr_expect_eq(jnum(cs, "pinned_entries"),
                 (double)kwd_count_keys(V32, 0));
    cr_expect_eq(msum(m, "kwarm_cache_entries", ""), jnum(cs, "entries"));
    cJSON_Delete(cs);
    free(cj);
    /* Connections: the CLI's and the bad client's are closing on their
     * own; wait (bounded) until ours is the only one, then ask ours. */
    int64_t deadline = kwd_now_ms() + 10000;
    double conns;
    while ((conns = msum(m, "kwarm_connections", "")) != 1 &&
           kwd_now_ms() < deadline) {
        cJSON_Delete(m);
        m = scrape(url, "-");
    }
    cr_expect_eq(conns, 1);
    cr_expect_eq(kwc_stat(&c, "connections"), 1);
    promtool_passes(saved);
    cJSON_Delete(m);
    cJSON_Delete(j);
    cJSON_Delete(doc);
    free(sj);
    kwd_down(&d, &c);
}

Test(metrics, kwarm_stats_prometheus_prints_the_text_of_metrics)
{
    need_parser();
    kwd d;
    kwc c;
    char listen[64], url[128], digest[65], file[300], furl[320];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", free_port(AF_INET));
    snprintf(url, sizeof url, "http://%s/metrics", listen);
    up(&d, &c, "metrics-cli", listen);
    cJSON *doc = traffic(&d, &c, digest);
    const char *pargs[] = {"stats", "--socket", d.sock, "--prometheus", NULL};
    char *text = kwarm(pargs, 0);
    snprintf(file, sizeof file, "%s/cli.txt", d.dir);
    char path[400];
    cr_assert_eq(kw_test_write_file(d.dir, "cli.txt", text, strlen(text), path,
                                    sizeof path), 0);
    snprintf(furl, sizeof furl, "file:%s", file);
    cJSON *p = scrape(furl, "-"), *m = scrape(url, "-");
    /* The same families with the same types, and the same values where
     * nothing changed between the two (the stats request itself was still
     * under way in the CLI's text). */
    const cJSON *fam;
    int nfam = 0;
    cJSON_ArrayForEach(fam, cJSON_GetObjectItemCaseSensitive(m, "families")) {
        const cJSON *other = cJSON_GetObjectItemCaseSensitive(
            cJSON_GetObjectItemCaseSensitive(p, "families"), fam->string);
        cr_expect(cJSON_IsString(other) && strcmp(other->valuestring, fam->valuestring) == 0,
                  "--prometheus lacks %s", fam->string);
        nfam++;
    }
    cr_expect_eq(nfam, cJSON_GetArraySize(cJSON_GetObjectItemCaseSensitive(p, "families")));
    cr_expect_gt(nfam, 20);
    static const char *const stable[] = {
        "kwarm_cache_entries", "kwarm_cache_bytes", "kwarm_cache_pinned_entries",
        "kwarm_compiles_total", "kwarm_compile_duration_seconds_count",
        "kwarm_warm_keys_total", "kwarm_get_duration_seconds_count"};
    for (size_t i = 0; i < sizeof stable / sizeof *stable; i++)
        cr_expect_eq(msum(p, stable[i], ""), msum(m, stable[i], ""), "%s",
                     stable[i]);
    cr_expect_eq(msum(p, "kwarm_requests_total", "type=stats"), 0);
    cr_expect_eq(msum(m, "kwarm_requests_total", "type=stats,result=ok"), 1);
    expect_families(p, doc);
    promtool_passes(file);
    cJSON_Delete(p);
    cJSON_Delete(m);
    cJSON_Delete(doc);
    free(text);
    kwd_down(&d, &c);
}

/* Forks and execs prog with argv (stdout and stderr to log), tracked for
 * kwd_cleanup and killed with the test process. */
static pid_t spawn_logged(const char *const *argv, const char *log)
{
    int logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    cr_assert(logfd >= 0, "%s: %s", log, strerror(errno));
    pid_t parent = getpid();
    fflush(NULL);
    pid_t pid = fork();
    cr_assert(pid >= 0, "fork: %s", strerror(errno));
    if (pid == 0) {
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (getppid() != parent || dup2(logfd, 1) < 0 || dup2(logfd, 2) < 0)
            _exit(127);
        execv(argv[0], (char *const *)argv);
        _exit(127);
    }
    close(logfd);
    kwd_track(pid, true);
    return pid;
}

/* Asks Prometheus at port for query until it has a sample, within
 * PROM_WAIT_MS (polls every 200 ms); prints the value, or exits 1. */
static const char query_py[] =
    "import json, sys, time, urllib.parse, urllib.request\n"
    "port, query, wait = sys.argv[1], sys.argv[2], float(sys.argv[3])\n"
    "url = 'http://127.0.0.1:%s/api/v1/query?' % port + \\\n"
    "      urllib.parse.urlencode({'query': query})\n"
    "deadline, last = time.monotonic() + wait, 'no answer'\n"
    "while time.monotonic() < deadline:\n"
    "    try:\n"
    "        with urllib.request.urlopen(url, timeout=5) as r:\n"
    "            doc = json.load(r)\n"
    "        res = doc['data']['result']\n"
    "        if doc['status'] == 'success' and res:\n"
    "            print(res[0]['value'][1])\n"
    "            sys.exit(0)\n"
    "        last = json.dumps(doc)\n"
    "    except OSError as e:\n"
    "        last = str(e)\n"
    "    time.sleep(0.2)\n"
    "print(last, file=sys.stderr)\n"
    "sys.exit(1)\n";

Test(metrics, a_prometheus_server_scrapes_kwarmd_and_answers_a_query)
{
    char prom[512];
    if (which("prometheus", prom, sizeof prom) == NULL)
        cr_skip_test("prometheus is not installed");
    kwd d;
    kwc c;
    char listen[64], cfg[2048], cfg_path[400], data[400], web[64], log[400];
    snprintf(listen, sizeof listen, "127.0.0.1:%d", free_port(AF_INET));
    up(&d, &c, "metrics-prom", listen);
    for (int i = 0; i < 3; i++)
        kwc_expect_pong(&c, "ping");
    snprintf(cfg, sizeof cfg,
             "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
             "scrape_configs:\n  - job_name: kwarmd\n    scrape_interval: 1s\n"
             "    static_configs:\n      - targets: ['%s']\n", listen);
    cr_assert_eq(kw_test_write_file(d.dir, "prometheus.yml", cfg, strlen(cfg),
                                    cfg_path, sizeof cfg_path), 0);
    snprintf(data, sizeof data, "--storage.tsdb.path=%s/tsdb", d.dir);
    int port = free_port(AF_INET);
    snprintf(web, sizeof web, "--web.listen-address=127.0.0.1:%d", port);
    snprintf(log, sizeof log, "%s/prometheus.log", d.dir);
    char cfg_arg[420];
    snprintf(cfg_arg, sizeof cfg_arg, "--config.file=%s", cfg_path);
    const char *argv[] = {prom, cfg_arg, data, web, NULL};
    pid_t pid = spawn_logged(argv, log);
    char p[16], wait[16];
    snprintf(p, sizeof p, "%d", port);
    snprintf(wait, sizeof wait, "%d", PROM_WAIT_MS / 1000);
    const char *q[] = {python(), "-c", query_py, p,
                       "kwarm_requests_total{job=\"kwarmd\",type=\"ping\",result=\"ok\"}",
                       wait, NULL};
    char *out = NULL, *err = NULL;
    int st = kw_test_run(q, &out, &err);
    char *plog = kwd_log(log);
    cr_expect_eq(st, 0, "no answer from Prometheus: %s\nits log:\n%s", err, plog);
    cr_expect_eq(strtod(out ? out : "", NULL), 3.0, "ping count: %s", out);
    free(plog);
    free(out);
    free(err);
    cr_assert_eq(kill(pid, SIGTERM), 0);
    int status = 0;
    cr_expect(kwd_wait_exit(pid, 20000, &status), "prometheus did not stop");
    kwd_down(&d, &c);
}

/* kwarmd with args exits with want and names --metrics-listen. */
static void expect_refused(const char *const *args, int want, const char *text)
{
    const char *argv[16] = {KW_KWARMD_BIN};
    size_t n = 1;
    for (; args[n - 1] != NULL; n++)
        argv[n] = args[n - 1];
    argv[n] = NULL;
    char *out = NULL, *err = NULL;
    int st = kw_test_run(argv, &out, &err);
    cr_expect_eq(st, want, "%s: exit %d: %s", args[1], st, err);
    cr_expect(strstr(err, "--metrics-listen") != NULL && strstr(err, text) != NULL,
              "%s: stderr lacks --metrics-listen and '%s': %s", args[1], text, err);
    free(out);
    free(err);
}

Test(metrics, bad_listen_values_exit_2_and_a_taken_port_exits_1)
{
    static const char *const bad[] = {"localhost:9464", "127.0.0.1", "127.0.0.1:0",
                                      "127.0.0.1:65536", "::1:9464", "[::1]",
                                      "[::1]:x", "1.2.3:80", ""};
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        const char *args[] = {"--metrics-listen", bad[i], NULL};
        expect_refused(args, 2, "is not");
    }
    /* A port someone listens on: exit 1 at start, with the reason. */
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET,
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof sa;
    cr_assert(fd >= 0 && bind(fd, (struct sockaddr *)&sa, sizeof sa) == 0 &&
              listen(fd, 1) == 0 && getsockname(fd, (struct sockaddr *)&sa, &len) == 0);
    kwd d;
    kwd_init(&d, "metrics-taken");
    char listen_at[64];
    snprintf(listen_at, sizeof listen_at, "127.0.0.1:%d", ntohs(sa.sin_port));
    const char *args[] = {"--metrics-listen", listen_at, "--socket", d.sock,
                          "--cache", d.cache, "--jobs", "1", NULL};
    expect_refused(args, 1, "Address already in use");
    struct stat stt;
    cr_expect(stat(d.sock, &stt) < 0, "a failed start left the socket file");
    close(fd);
}

Test(metrics, ipv6_loopback_serves_metrics_and_refuses_other_requests)
{
    need_parser();
    kwd d;
    kwc c;
    char listen[64], url[128];
    int port = free_port(AF_INET6);
    snprintf(listen, sizeof listen, "[::1]:%d", port);
    up(&d, &c, "metrics-v6", listen);
    snprintf(url, sizeof url, "http://%s/metrics", listen);
    cJSON *m = scrape(url, "-");
    cr_expect_eq(msum(m, "kwarm_connections", ""), 1);
    cr_expect_eq(msum(m, "kwarm_build_info", ""), 1);
    cJSON_Delete(m);
    /* Other paths: 404; other methods: 405.  Only [::1] is bound. */
    char script[1024];
    snprintf(script, sizeof script,
             "import urllib.request, urllib.error, socket\n"
             "def status(url, data=None):\n"
             "    try:\n"
             "        return urllib.request.urlopen(url, data=data, timeout=10).status\n"
             "    except urllib.error.HTTPError as e:\n"
             "        return e.code\n"
             "print(status('http://[::1]:%d/'), status('http://[::1]:%d/metrics', b'x'))\n"
             "s = socket.socket()\n"
             "print(s.connect_ex(('127.0.0.1', %d)) != 0)\n",
             port, port, port);
    const char *argv[] = {python(), "-c", script, NULL};
    char *out = NULL, *err = NULL;
    cr_assert_eq(kw_test_run(argv, &out, &err), 0, "%s", err);
    cr_expect_str_eq(out, "404 405\nTrue\n");
    free(out);
    free(err);
    kwd_down(&d, &c);
}

/* ---- process_* series (issue 24) ---------------------------------------- */

/* GET /metrics over plain HTTP/1.0 from 127.0.0.1:port; the whole reply,
 * headers included (free it).  No python: this needs no parser. */
static char *http_metrics(int port)
{
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons((uint16_t)port),
                             .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    cr_assert(fd >= 0 && connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0,
              "connect :%d: %s", port, strerror(errno));
    static const char req[] = "GET /metrics HTTP/1.0\r\nHost: x\r\n\r\n";
    cr_assert_eq(write(fd, req, sizeof req - 1), (ssize_t)(sizeof req - 1));
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    for (ssize_t r; (r = read(fd, buf + n, cap - n - 1)) != 0;) {
        cr_assert(r > 0 || errno == EINTR, "read: %s", strerror(errno));
        n += r > 0 ? (size_t)r : 0;
        if (n + 1 == cap)
            cr_assert_not_null(buf = realloc(buf, cap *= 2));
    }
    buf[n] = '\0';
    close(fd);
    cr_assert(strncmp(buf, "HTTP/1.", 7) == 0 && strstr(buf, " 200 "), "%.200s", buf);
    return buf;
}

/* The value of the unlabelled sample name in text; fails when absent,
 * or when its HELP and TYPE gauge lines are. */
static double sample(const char *text, const char *name)
{
    char key[96], type[112];
    snprintf(key, sizeof key, "\n%s ", name);
    snprintf(type, sizeof type, "# TYPE %s gauge\n", name);
    const char *p = strstr(text, key);
    cr_assert_not_null(p, "no %s in:\n%s", name, text);
    cr_expect_not_null(strstr(text, type), "no TYPE line for %s", name);
    return strtod(p + strlen(key), NULL);
}

/* A "Name:  N kB" line of /proc/PID/status, in bytes. */
static double proc_status_bytes(pid_t pid, const char *field)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/status", (int)pid);
    char *s = kw_test_read_file(path, NULL);
    cr_assert_not_null(s, "%s", path);
    const char *p = strstr(s, field);
    cr_assert_not_null(p, "%s: no %s", path, field);
    double v = strtod(p + strlen(field), NULL) * 1024;
    free(s);
    return v;
}

/* Entries of /proc/PID/fd (kwarmd runs as this user, so they are ours
 * to list). */
static double proc_fds(pid_t pid)
{
    char path[64];
    snprintf(path, sizeof path, "/proc/%d/fd", (int)pid);
    DIR *d = opendir(path);
    cr_assert_not_null(d, "%s: %s", path, strerror(errno));
    double n = 0;
    for (struct dirent *e; (e = readdir(d)) != NULL;)
        n += e->d_name[0] != '.';
    closedir(d);
    return n;
}

Test(metrics, process_series_describe_kwarmd_itself)
{
    kwd d;
    kwc c, more[8];
    char listen[64];
    int port = free_port(AF_INET);
    snprintf(listen, sizeof listen, "127.0.0.1:%d", port);
    time_t before = time(NULL);
    up(&d, &c, "metrics-proc", listen);
    char *t0 = http_metrics(port);
    /* Started between our clock before the spawn and now (ticks: 10 ms). */
    double start = sample(t0, "process_start_time_seconds");
    cr_expect(start >= (double)before - 1 && start <= (double)time(NULL) + 1,
              "start %.2f, spawned at %lld", start, (long long)before);
    double rss = sample(t0, "process_resident_memory_bytes");
    double vmrss = proc_status_bytes(d.pid, "VmRSS:");
    cr_expect(rss > (1 << 20) && rss > vmrss / 2 && rss < vmrss * 2,
              "resident %.0f, /proc says %.0f", rss, vmrss);
    /* Open fds follow the connections kwarmd holds: eight more, each
     * answered (so accepted), are eight more fds. */
    double fds0 = sample(t0, "process_open_fds");
    cr_expect(fds0 >= 4 && fabs(fds0 - proc_fds(d.pid)) <= 2,
              "open fds %.0f, /proc/%d/fd has %.0f", fds0, (int)d.pid,
              proc_fds(d.pid));
    for (size_t i = 0; i < 8; i++) {
        kwc_must_open(&more[i], d.sock);
        kwc_expect_pong(&more[i], "an extra connection");
    }
    char *t1 = http_metrics(port);
    double fds1 = sample(t1, "process_open_fds");
    cr_expect(fds1 >= fds0 + 8, "open fds %.0f, then %.0f with 8 more clients",
              fds0, fds1);
    cr_expect_eq(sample(t1, "process_start_time_seconds"), start);
    for (size_t i = 0; i < 8; i++)
        kwc_close(&more[i]);
    free(t0);
    free(t1);
    kwd_down(&d, &c);
}
