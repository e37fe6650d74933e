/*
 * cmd_loadgen.c — `tern loadgen`: drives any OpenAI-compatible server (tern serve, llama-server,
 * vLLM) with Poisson arrivals of streaming completion requests and reports throughput, TTFT and
 * TPOT percentiles and goodput (requests/s meeting both the TTFT and the TPOT objective, as in
 * DistServe). One thread per in-flight request; plain HTTP/1.0 over a socket (SSE parsed by hand,
 * JSON by jansson). Prompts are made of common words (about one token per word).
 */
#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <netdb.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"

typedef struct {
    int kind; /* 0 fixed, 1 uniform [a, b], 2 exponential mean a */
    double a, b;
} lg_dist;

typedef struct {
    double t_start, ttft, tpot, e2e;
    int status;   /* HTTP status; 0 = connection error */
    int n_prompt, n_out;
    bool ok;
} lg_result;

typedef struct lg_ctx {
    char host[256], port[16], prefix[256];
    const char *api_key, *model;
    bool chat;
    lg_dist plen, olen;
    double ttft_slo, tpot_slo, timeout;
    pthread_mutex_t mu;
    lg_result *res;
    int n_res, cap_res;
    atomic_int inflight;
    uint64_t rng;
    char *prompts;      /* --prompts FILE's text, its lines NUL-terminated in place */
    const char **lines; /* the non-empty lines */
    int n_lines;
} lg_ctx;

typedef struct {
    lg_ctx *L;
    int idx, plen, olen;
    const char *text; /* a --prompts line, or NULL: plen random words */
} lg_job;

static uint64_t lg_next(uint64_t *s) {
    uint64_t z = (*s += UINT64_C(0x9E3779B97F4A7C15));
    z = (z ^ (z >> 30)) * UINT64_C(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)) * UINT64_C(0x94D049BB133111EB);
    return z ^ (z >> 31);
}
static double lg_unif(uint64_t *s) { return ((double)(lg_next(s) >> 11) + 0.5) * 0x1.0p-53; }

static int lg_sample(const lg_dist *d, uint64_t *s) {
    double v = d->a;
    if (d->kind == 1) v = d->a + floor(lg_unif(s) * (d->b - d->a + 1));
    else if (d->kind == 2) v = -log(lg_unif(s)) * d->a;
    int n = (int)llround(v);
    return n < 1 ? 1 : n;
}

static bool lg_parse_dist(const char *s, lg_dist *d) {
    char *end;
    if (!strncmp(s, "exp:", 4)) {
        d->kind = 2;
        d->a = strtod(s + 4, &end);
        return !*end && d->a >= 1 && d->a <= 1e6;
    }
    d->a = strtod(s, &end);
    if (*end == '-' || *end == ':') {
        d->kind = 1;
        d->b = strtod(end + 1, &end);
        return !*end && d->a >= 1 && d->b >= d->a && d->b <= 1e6;
    }
    d->kind = 0;
    return !*end && d->a >= 1 && d->a <= 1e6;
}

static double lg_now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

static const char *lg_words[] = {"the", "cat", "sat", "on", "a", "mat", "and", "then", "it", "ran", "to", "see", "what",
                                 "was", "in", "house", "of", "old", "man", "who", "had", "big", "red", "door"};

static int lg_connect(lg_ctx *L, double timeout) {
    struct addrinfo hints = {0}, *ai = NULL;
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(L->host, L->port, &hints, &ai)) return -1;
    int fd = -1;
    for (struct addrinfo *p = ai; p; p = p->ai_next) {
        fd = socket(p->ai_family, p->ai_socktype, p->ai_protocol);
        if (fd < 0) continue;
        struct timeval tv = {(time_t)timeout, 0};
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
        setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof tv);
        if (!connect(fd, p->ai_addr, p->ai_addrlen)) break;
        close(fd);
        fd = -1;
    }
    freeaddrinfo(ai);
    return fd;
}

/* ---- response body: HTTP/1.1 chunked transfer coding (llama-server answers an HTTP/1.0 request
 * with it) or plain bytes, decoded incrementally into buf; then SSE events split at a blank line
 * (LF LF or CRLF CRLF). ---------------------------------------------------------------------- */
enum { LG_RAW = 1 << 16 };

typedef struct {
    char *buf;
    size_t len, cap, scan;
    bool chunked, failed;
    int state;       /* chunked: 0 size line, 1 data, 2 CRLF after data, 3 trailers */
    size_t left;     /* bytes left in the current chunk */
    char line[32];   /* the size line being read */
    size_t line_len;
} lg_body;

/* Does the header block contain `name` with `token` in its value (case-insensitive)? */
static bool lg_has_token(const char *head, const char *name, const char *token) {
    size_t nl = strlen(name);
    for (const char *p = head; p && *p; p = strchr(p, '\n'), p = p ? p + 1 : NULL) {
        if (strncasecmp(p, name, nl)) continue;
        const char *e = strchr(p, '\n');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        for (size_t i = nl; i + strlen(token) <= len; i++)
            if (!strncasecmp(p + i, token, strlen(token))) return true;
    }
    return false;
}

static void lg_body_put(lg_body *B, const char *p, size_t n) {
    if (B->len + n + 1 > B->cap) {
        size_t cap = B->cap ? B->cap : 1 << 16;
        while (cap < B->len + n + 1) cap *= 2;
        char *q = realloc(B->buf, cap);
        if (!q) {
            B->failed = true;
            return;
        }
        B->buf = q;
        B->cap = cap;
    }
    memcpy(B->buf + B->len, p, n);
    B->len += n;
    B->buf[B->len] = 0;
}

static void lg_body_feed(lg_body *B, const char *p, size_t n) {
    if (!B->chunked) {
        lg_body_put(B, p, n);
        return;
    }
    while (n > 0 && !B->failed) {
        if (B->state == 1) { /* chunk data */
            size_t k = n < B->left ? n : B->left;
            lg_body_put(B, p, k);
            p += k, n -= k, B->left -= k;
            if (!B->left) B->state = 2;
            continue;
        }
        char c = *p++;
        n--;
        if (B->state == 2) { /* the CRLF closing a chunk */
            if (c == '\n') B->state = 0;
            continue;
        }
        if (c != '\n') {
            if (B->line_len + 1 < sizeof B->line) B->line[B->line_len++] = c;
            continue;
        }
        B->line[B->line_len] = 0;
        B->line_len = 0;
        if (B->state == 3) continue; /* trailers after the last chunk */
        char *end;
        unsigned long long size = strtoull(B->line, &end, 16);
        if (end == B->line) { /* not a chunk size: a server error */
            B->failed = true;
            return;
        }
        B->left = (size_t)size;
        B->state = size ? 1 : 3;
    }
}

/* Next complete SSE event (NUL-terminated, its blank line removed), or NULL. */
static const char *lg_next_event(lg_body *B, size_t *len) {
    if (!B->buf) return NULL;
    char *s = B->buf + B->scan, *lf = strstr(s, "\n\n"), *crlf = strstr(s, "\r\n\r\n");
    char *e = lf && (!crlf || lf < crlf) ? lf : crlf;
    if (!e) return NULL;
    size_t sep = e == lf ? 2 : 4;
    *e = 0;
    if (e > s && e[-1] == '\r') e[-1] = 0;
    B->scan = (size_t)(e + sep - B->buf);
    *len = strlen(s);
    return s;
}

/* One streaming request; fills r. */
static void lg_run_one(lg_ctx *L, int plen, int olen, const char *text, lg_result *r) {
    uint64_t seed = (uint64_t)plen * 7919u + (uint64_t)(lg_now() * 1e6);
    size_t cap = text ? strlen(text) + 1 : (size_t)plen * 8 + 64;
    char *prompt = malloc(cap);
    size_t n = 0;
    if (text && prompt) memcpy(prompt, text, cap);
    for (int i = 0; i < plen && prompt && !text; i++) {
        const char *w = lg_words[lg_next(&seed) % (sizeof lg_words / sizeof *lg_words)];
        n += (size_t)snprintf(prompt + n, cap - n, "%s%s", i ? " " : "", w);
    }
    json_t *body = L->chat ? json_pack("{s:[{s:s, s:s}]}", "messages", "role", "user", "content", prompt ? prompt : "")
                           : json_pack("{s:s}", "prompt", prompt ? prompt : "");
    free(prompt);
    json_object_set_new(body, "model", json_string(L->model ? L->model : "default"));
    json_object_set_new(body, "max_tokens", json_integer(olen));
    json_object_set_new(body, "ignore_eos", json_true());
    json_object_set_new(body, "stream", json_true());
    json_object_set_new(body, "stream_options", json_pack("{s:b}", "include_usage", 1));
    json_object_set_new(body, "temperature", json_real(0.0));
    char *bs = json_dumps(body, JSON_COMPACT);
    json_decref(body);
    if (!bs) return;
    char auth[512] = "";
    if (L->api_key) snprintf(auth, sizeof auth, "Authorization: Bearer %s\r\n", L->api_key);
    char head[1024];
    int hl = snprintf(head, sizeof head,
                      "POST %s%s HTTP/1.0\r\nHost: %s\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n%s"
                      "Content-Length: %zu\r\n\r\n",
                      L->prefix, L->chat ? "/v1/chat/completions" : "/v1/completions", L->host, auth, strlen(bs));
    r->t_start = lg_now();
    int fd = lg_connect(L, L->timeout);
    if (fd < 0) {
        free(bs);
        return;
    }
    bool sent = send(fd, head, (size_t)hl, MSG_NOSIGNAL) == hl && send(fd, bs, strlen(bs), MSG_NOSIGNAL) == (ssize_t)strlen(bs);
    free(bs);
    lg_body B = {0};
    char *raw = malloc(LG_RAW + 1);
    size_t rlen = 0;
    double t_first = 0, t_last = 0;
    int chunks = 0;
    bool header_done = false, done = false;
    while (sent && raw && !done && !B.failed) {
        ssize_t k = recv(fd, raw + rlen, LG_RAW - rlen, 0);
        if (k <= 0) break;
        rlen += (size_t)k;
        raw[rlen] = 0;
        double now = lg_now();
        size_t off = 0;
        if (!header_done) {
            char *e = strstr(raw, "\r\n\r\n");
            if (!e) {
                if (rlen == LG_RAW) break; /* headers larger than the buffer */
                continue;
            }
            sscanf(raw, "HTTP/%*s %d", &r->status);
            header_done = true;
            *e = 0;
            B.chunked = lg_has_token(raw, "transfer-encoding:", "chunked");
            off = (size_t)(e + 4 - raw);
            if (r->status != 200) break;
        }
        lg_body_feed(&B, raw + off, rlen - off);
        rlen = 0;
        const char *ev;
        size_t evlen;
        while (!done && (ev = lg_next_event(&B, &evlen))) {
            if (strncmp(ev, "data:", 5)) continue; /* comments (": ping"), event:, id: lines */
            const char *line = ev + 5;
            if (*line == ' ') line++;
            if (!strcmp(line, "[DONE]")) {
                done = true;
                break;
            }
            json_t *j = json_loads(line, 0, NULL);
            if (!j) continue;
            json_t *u = json_object_get(j, "usage");
            if (json_is_object(u)) {
                r->n_out = (int)json_integer_value(json_object_get(u, "completion_tokens"));
                r->n_prompt = (int)json_integer_value(json_object_get(u, "prompt_tokens"));
            }
            json_t *ch = json_array_get(json_object_get(j, "choices"), 0);
            const char *txt = NULL;
            if (ch) {
                json_t *d = json_object_get(ch, "delta");
                txt = json_string_value(d ? json_object_get(d, "content") : json_object_get(ch, "text"));
            }
            if (txt && *txt) {
                if (!t_first) t_first = now;
                t_last = now;
                chunks++;
            }
            json_decref(j);
        }
    }
    free(raw);
    char *buf = B.buf;
    close(fd);
    free(buf);
    double end = lg_now();
    r->e2e = end - r->t_start;
    if (done && t_first > 0) {
        if (!r->n_out) r->n_out = chunks;
        r->ttft = t_first - r->t_start;
        r->tpot = r->n_out > 1 ? (t_last - t_first) / (r->n_out - 1) : 0;
        r->ok = true;
    }
}

static void *lg_thread(void *arg) {
    lg_job *j = arg;
    lg_result r = {0};
    lg_run_one(j->L, j->plen, j->olen, j->text, &r);
    pthread_mutex_lock(&j->L->mu);
    j->L->res[j->idx] = r;
    pthread_mutex_unlock(&j->L->mu);
    atomic_fetch_sub(&j->L->inflight, 1);
    free(j);
    return NULL;
}

static int cmp_d(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

static double pct(const double *v, int n, double p) {
    if (n == 0) return 0;
    int i = (int)ceil(p / 100.0 * n) - 1;
    return v[i < 0 ? 0 : i >= n ? n - 1 : i];
}

static void lg_usage(FILE *f) {
    fprintf(f,
            "usage: tern loadgen --url http://HOST:PORT [options]\n"
            "      --url URL           server base URL (the /v1/... paths are appended)\n"
            "      --rate R            mean arrivals per second (Poisson; default 1)\n"
            "      --duration S        seconds of arrivals (default 10)\n"
            "      --prompt-len DIST   prompt words: N, A-B (uniform) or exp:MEAN (default 32)\n"
            "      --prompts FILE      prompts are lines of FILE (UTF-8, empty lines skipped), picked by\n"
            "                          the seeded generator, instead of --prompt-len random words\n"
            "      --output-len DIST   max_tokens (ignore_eos): N, A-B or exp:MEAN (default 32)\n"
            "      --ttft-slo MS       time-to-first-token objective for goodput (default 1000)\n"
            "      --tpot-slo MS       time-per-output-token objective for goodput (default 100)\n"
            "      --chat              use /v1/chat/completions (default /v1/completions)\n"
            "      --api-key KEY       bearer token\n"
            "      --model NAME        model field of the requests\n"
            "      --max-inflight N    client-side cap on concurrent requests (default 512; arrivals\n"
            "                          over it are dropped and counted)\n"
            "      --concurrency N     closed loop instead of Poisson arrivals: N clients, each sending\n"
            "                          its next request when its last one ends (needs --requests)\n"
            "      --requests M        with --concurrency: M requests in all\n"
            "      --timeout S         per-request socket timeout (default 120)\n"
            "      --seed N            arrival/length RNG seed (default 1)\n"
            "  -o, --output FMT        text (default) or json\n");
}

int cmd_loadgen(int argc, char **argv) {
    lg_ctx *L = calloc(1, sizeof *L);
    if (!L) return TN_EXIT_OSERR;
    const char *url = NULL, *fmt = "text";
    float rate = 1, duration = 10, f;
    int64_t max_inflight = 512, seed = 1, concurrency = 0, n_requests = 0;
    L->plen = (lg_dist){0, 32, 32};
    L->olen = (lg_dist){0, 32, 32};
    L->ttft_slo = 1.0;
    L->tpot_slo = 0.1;
    L->timeout = 120;
    int rc = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *val = i + 1 < argc ? argv[i + 1] : NULL;
        bool needs = strcmp(a, "--chat") && strcmp(a, "-h") && strcmp(a, "--help");
        if (needs && !val) {
            rc = tn_cli_usage_error("%s needs a value", a);
            goto out;
        }
        if (!strcmp(a, "-h") || !strcmp(a, "--help")) {
            lg_usage(stdout);
            goto out;
        } else if (!strcmp(a, "--url")) url = argv[++i];
        else if (!strcmp(a, "--rate")) {
            if (!tn_cli_parse_f32(argv[++i], 0.001f, 100000.0f, &rate)) { rc = tn_cli_usage_error("--rate: '%s' is not in 0.001..100000", val); goto out; }
        } else if (!strcmp(a, "--duration")) {
            if (!tn_cli_parse_f32(argv[++i], 0.01f, 86400.0f, &duration)) { rc = tn_cli_usage_error("--duration: '%s' is not seconds", val); goto out; }
        } else if (!strcmp(a, "--prompt-len")) {
            if (!lg_parse_dist(argv[++i], &L->plen)) { rc = tn_cli_usage_error("--prompt-len: '%s' is not N, A-B or exp:MEAN", val); goto out; }
        } else if (!strcmp(a, "--prompts")) {
            size_t len;
            free(L->prompts);
            L->prompts = NULL;
            tern_status s = tn_cli_read_file(argv[++i], &L->prompts, &len);
            if (s) { rc = tn_cli_fail(s, "reading --prompts"); goto out; }
        } else if (!strcmp(a, "--output-len")) {
            if (!lg_parse_dist(argv[++i], &L->olen)) { rc = tn_cli_usage_error("--output-len: '%s' is not N, A-B or exp:MEAN", val); goto out; }
        } else if (!strcmp(a, "--ttft-slo")) {
            if (!tn_cli_parse_f32(argv[++i], 0.001f, 3.6e6f, &f)) { rc = tn_cli_usage_error("--ttft-slo: '%s' is not milliseconds", val); goto out; }
            L->ttft_slo = f / 1e3;
        } else if (!strcmp(a, "--tpot-slo")) {
            if (!tn_cli_parse_f32(argv[++i], 0.001f, 3.6e6f, &f)) { rc = tn_cli_usage_error("--tpot-slo: '%s' is not milliseconds", val); goto out; }
            L->tpot_slo = f / 1e3;
        } else if (!strcmp(a, "--chat")) L->chat = true;
        else if (!strcmp(a, "--api-key")) L->api_key = argv[++i];
        else if (!strcmp(a, "--model")) L->model = argv[++i];
        else if (!strcmp(a, "--concurrency")) {
            if (!tn_cli_parse_i64(argv[++i], 1, 100000, &concurrency)) { rc = tn_cli_usage_error("--concurrency: '%s' is not in 1..100000", val); goto out; }
        } else if (!strcmp(a, "--requests")) {
            if (!tn_cli_parse_i64(argv[++i], 1, 10000000, &n_requests)) { rc = tn_cli_usage_error("--requests: '%s' is not in 1..10000000", val); goto out; }
        } else if (!strcmp(a, "--max-inflight")) {
            if (!tn_cli_parse_i64(argv[++i], 1, 100000, &max_inflight)) { rc = tn_cli_usage_error("--max-inflight: '%s' is not in 1..100000", val); goto out; }
        } else if (!strcmp(a, "--timeout")) {
            if (!tn_cli_parse_f32(argv[++i], 1.0f, 86400.0f, &f)) { rc = tn_cli_usage_error("--timeout: '%s' is not seconds", val); goto out; }
            L->timeout = f;
        } else if (!strcmp(a, "--seed")) {
            if (!tn_cli_parse_i64(argv[++i], 0, INT64_MAX, &seed)) { rc = tn_cli_usage_error("--seed: '%s' is not a seed", val); goto out; }
        } else if (!strcmp(a, "-o") || !strcmp(a, "--output")) {
            fmt = argv[++i];
            if (strcmp(fmt, "text") && strcmp(fmt, "json")) { rc = tn_cli_usage_error("-o: '%s' is not text or json", fmt); goto out; }
        } else {
            lg_usage(stderr);
            rc = tn_cli_usage_error("unknown option '%s'", a);
            goto out;
        }
    }
    if (!url) {
        rc = tn_cli_usage_error("--url is required (e.g. http://127.0.0.1:8080)");
        goto out;
    }
    /* http://host[:port][/prefix] */
    if (strncmp(url, "http://", 7)) {
        rc = tn_cli_usage_error("--url: only http:// URLs are supported");
        goto out;
    }
    {
        const char *h = url + 7, *slash = strchr(h, '/'), *colon = strchr(h, ':');
        size_t hl = slash ? (size_t)(slash - h) : strlen(h);
        if (colon && (!slash || colon < slash)) {
            snprintf(L->host, sizeof L->host, "%.*s", (int)(colon - h), h);
            snprintf(L->port, sizeof L->port, "%.*s", (int)(hl - (size_t)(colon - h) - 1), colon + 1);
        } else {
            snprintf(L->host, sizeof L->host, "%.*s", (int)hl, h);
            snprintf(L->port, sizeof L->port, "80");
        }
        snprintf(L->prefix, sizeof L->prefix, "%s", slash ? slash : "");
        size_t pl = strlen(L->prefix);
        while (pl && L->prefix[pl - 1] == '/') L->prefix[--pl] = 0;
        if (pl >= 3 && !strcmp(L->prefix + pl - 3, "/v1")) L->prefix[pl - 3] = 0;
    }
    if (L->prompts) { /* split into lines in place */
        int cap = 0, lno = 0;
        for (char *p = L->prompts, *e; p && *p; p = e) {
            e = strchr(p, '\n');
            if (e) *e++ = 0;
            lno++;
            size_t ll = strlen(p);
            if (ll && p[ll - 1] == '\r') p[--ll] = 0;
            if (!ll) continue;
            json_t *js = json_string(p); /* NULL: not UTF-8 */
            if (!js) {
                rc = tn_cli_usage_error("--prompts: line %d is not valid UTF-8", lno);
                goto out;
            }
            json_decref(js);
            if (L->n_lines == cap) {
                cap = cap ? 2 * cap : 64;
                const char **nl = realloc(L->lines, sizeof *nl * (size_t)cap);
                if (!nl) { rc = TN_EXIT_OSERR; goto out; }
                L->lines = nl;
            }
            L->lines[L->n_lines++] = p;
        }
        if (!L->n_lines) {
            rc = tn_cli_usage_error("--prompts: the file has no non-empty line");
            goto out;
        }
    }
    pthread_mutex_init(&L->mu, NULL);
    L->rng = (uint64_t)seed;
    if ((concurrency > 0) != (n_requests > 0)) {
        rc = tn_cli_usage_error("--concurrency and --requests go together (a closed loop of N clients sending M requests)");
        goto out;
    }
    const bool closed = concurrency > 0;
    if (closed) max_inflight = concurrency;
    L->cap_res = closed ? (int)n_requests + 64 : (int)(rate * duration * 2 + 64);
    L->res = calloc((size_t)L->cap_res, sizeof *L->res);
    if (!L->res) {
        rc = TN_EXIT_OSERR;
        goto out;
    }
    signal(SIGPIPE, SIG_IGN);
    double t0 = lg_now(), next = t0, dropped = 0;
    int n_sent = 0;
    while (closed ? n_sent < n_requests : next - t0 < duration && n_sent < L->cap_res) {
        double now = lg_now();
        if (closed) { /* the next request goes as soon as one of the N clients is free */
            while (atomic_load(&L->inflight) >= max_inflight) {
                struct timespec ts = {0, 1000000};
                nanosleep(&ts, NULL);
            }
            next = now = lg_now();
        }
        if (next > now) {
            double d = next - now;
            struct timespec ts = {(time_t)d, (long)((d - floor(d)) * 1e9)};
            nanosleep(&ts, NULL);
        }
        if (atomic_load(&L->inflight) >= max_inflight) {
            dropped++;
        } else {
            lg_job *j = malloc(sizeof *j);
            pthread_t th;
            pthread_attr_t at;
            pthread_attr_init(&at);
            pthread_attr_setdetachstate(&at, PTHREAD_CREATE_DETACHED);
            /* 1 MiB: a thread's stack also holds the static TLS of every library loaded at start-up
             * (with the CUDA backend, cuBLAS's ~100 KiB on top of tern's ~130 KiB: 256 KiB no
             * longer fit and every pthread_create failed) */
            pthread_attr_setstacksize(&at, 1024 * 1024);
            if (j) {
                *j = (lg_job){L, n_sent, lg_sample(&L->plen, &L->rng), lg_sample(&L->olen, &L->rng), NULL};
                if (L->n_lines) j->text = L->lines[lg_next(&L->rng) % (uint64_t)L->n_lines];
                atomic_fetch_add(&L->inflight, 1);
                if (pthread_create(&th, &at, lg_thread, j)) {
                    atomic_fetch_sub(&L->inflight, 1);
                    free(j);
                    dropped++;
                } else {
                    n_sent++;
                }
            }
            pthread_attr_destroy(&at);
        }
        next += -log(lg_unif(&L->rng)) / rate;
    }
    double t_arrivals = lg_now() - t0;
    const double deadline = (closed ? t_arrivals : duration) + L->timeout + 5; /* the last request's timeout */
    while (atomic_load(&L->inflight) > 0 && lg_now() - t0 < deadline) {
        struct timespec ts = {0, 20000000};
        nanosleep(&ts, NULL);
    }
    double wall = lg_now() - t0;
    pthread_mutex_lock(&L->mu);
    int n_ok = 0, n_429 = 0, n_err = 0, n_good = 0;
    long long out_tok = 0, in_tok = 0;
    double *ttft = calloc((size_t)n_sent + 1, sizeof *ttft), *tpot = calloc((size_t)n_sent + 1, sizeof *tpot),
           *e2e = calloc((size_t)n_sent + 1, sizeof *e2e);
    for (int i = 0; i < n_sent; i++) {
        lg_result *r = &L->res[i];
        if (!r->ok) {
            if (r->status == 429) n_429++;
            else n_err++;
            continue;
        }
        ttft[n_ok] = r->ttft, tpot[n_ok] = r->tpot, e2e[n_ok] = r->e2e;
        n_ok++;
        out_tok += r->n_out;
        in_tok += r->n_prompt;
        if (r->ttft <= L->ttft_slo && r->tpot <= L->tpot_slo) n_good++;
    }
    pthread_mutex_unlock(&L->mu);
    qsort(ttft, (size_t)n_ok, sizeof *ttft, cmp_d);
    qsort(tpot, (size_t)n_ok, sizeof *tpot, cmp_d);
    qsort(e2e, (size_t)n_ok, sizeof *e2e, cmp_d);
    int n_unfinished = atomic_load(&L->inflight);
    if (!strcmp(fmt, "json")) {
        json_t *j = json_pack("{s:s, s:f, s:f, s:f, s:i, s:i, s:i, s:i, s:i, s:i, s:I, s:I, s:f, s:f, s:f, s:f, s:f}", "url", url,
                              "rate", (double)rate, "duration_s", (double)duration, "wall_s", wall, "sent", n_sent, "completed",
                              n_ok, "rejected_429", n_429, "failed", n_err, "dropped_client", (int)dropped, "unfinished",
                              n_unfinished, "prompt_tokens", (json_int_t)in_tok, "output_tokens", (json_int_t)out_tok,
                              "throughput_req_s", n_ok / wall, "throughput_tok_s", out_tok / wall, "goodput_req_s",
                              n_good / (t_arrivals > 0 ? t_arrivals : wall), "slo_attainment", n_sent ? (double)n_good / n_sent : 0.0, "arrival_s", t_arrivals);
        json_object_set_new(j, "concurrency", json_integer(closed ? concurrency : 0));
        json_object_set_new(j, "slo", json_pack("{s:f, s:f}", "ttft_ms", L->ttft_slo * 1e3, "tpot_ms", L->tpot_slo * 1e3));
        json_object_set_new(j, "ttft_ms", json_pack("{s:f, s:f, s:f}", "p50", pct(ttft, n_ok, 50) * 1e3, "p90",
                                                     pct(ttft, n_ok, 90) * 1e3, "p99", pct(ttft, n_ok, 99) * 1e3));
        json_object_set_new(j, "tpot_ms", json_pack("{s:f, s:f, s:f}", "p50", pct(tpot, n_ok, 50) * 1e3, "p90",
                                                     pct(tpot, n_ok, 90) * 1e3, "p99", pct(tpot, n_ok, 99) * 1e3));
        json_object_set_new(j, "e2e_ms", json_pack("{s:f, s:f, s:f}", "p50", pct(e2e, n_ok, 50) * 1e3, "p90",
                                                   pct(e2e, n_ok, 90) * 1e3, "p99", pct(e2e, n_ok, 99) * 1e3));
        char *s = json_dumps(j, JSON_INDENT(2));
        printf("%s\n", s ? s : "{}");
        free(s);
        json_decref(j);
    } else {
        if (closed) printf("loadgen %s: %lld requests from %lld closed-loop clients (wall %.1f s)\n", url, (long long)n_requests, (long long)concurrency, wall);
        else printf("loadgen %s: %.2f req/s Poisson for %.1f s (wall %.1f s)\n", url, rate, duration, wall);
        printf("  requests   sent %d, completed %d, 429 %d, failed %d, client-dropped %.0f, unfinished %d\n", n_sent, n_ok,
               n_429, n_err, dropped, n_unfinished);
        printf("  throughput %.2f req/s, %.1f output tok/s (prompt %lld tok, output %lld tok)\n", n_ok / wall, out_tok / wall,
               in_tok, out_tok);
        printf("  TTFT ms    p50 %.1f  p90 %.1f  p99 %.1f\n", pct(ttft, n_ok, 50) * 1e3, pct(ttft, n_ok, 90) * 1e3,
               pct(ttft, n_ok, 99) * 1e3);
        printf("  TPOT ms    p50 %.2f  p90 %.2f  p99 %.2f\n", pct(tpot, n_ok, 50) * 1e3, pct(tpot, n_ok, 90) * 1e3,
               pct(tpot, n_ok, 99) * 1e3);
        printf("  E2E ms     p50 %.1f  p90 %.1f  p99 %.1f\n", pct(e2e, n_ok, 50) * 1e3, pct(e2e, n_ok, 90) * 1e3,
               pct(e2e, n_ok, 99) * 1e3);
        printf("  goodput    %.2f req/s meeting TTFT <= %.0f ms and TPOT <= %.1f ms (%.1f%% of sent)\n", n_good / (t_arrivals > 0 ? t_arrivals : wall),
               L->ttft_slo * 1e3, L->tpot_slo * 1e3, n_sent ? 100.0 * n_good / n_sent : 0.0);
    }
    free(ttft);
    free(tpot);
    free(e2e);
    if (n_unfinished > 0) { /* threads still hold L: leak it rather than free under them */
        fflush(stdout);
        return n_ok > 0 ? 0 : TN_EXIT_SOFTWARE;
    }
    rc = n_ok > 0 ? 0 : TN_EXIT_SOFTWARE;
    pthread_mutex_destroy(&L->mu);
out:
    free(L->res);
    free(L->lines);
    free(L->prompts);
    free(L);
    return rc;
}
