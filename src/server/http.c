/* HTTP side of floe serve: libmicrohttpd daemon (one thread per connection), routing, API key,
 * body size limit, the small endpoints (/health, /v1/models, /metrics, /tokenize, /detokenize),
 * and the plumbing that turns a job into a response (whole body, or an SSE stream read from the
 * job's output buffer as the worker fills it).
 *
 * Every request gets a req_ctx (freed by the request-completed callback). A request that holds a
 * job keeps a reference; when the request ends abnormally (client gone) the job is cancelled, and
 * in every case the job forgets the socket before libmicrohttpd closes it. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <microhttpd.h>
#include <netdb.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "base/base.h"
#include "server/server.h"

#define KEEPALIVE_S 10

void srv_opts_init(srv_opts *o) {
  memset(o, 0, sizeof *o);
  o->host = "127.0.0.1";
  o->port = 8080;
  o->n_slots = 1;
  o->n_parallel = 4;
  o->chunk = 64;
  o->mtp = 0; /* opt-in: with MTP a sampled request's text depends on whether it decoded alone */
  o->queue_max = 64;
  o->max_body = (size_t)8 << 20;
  o->max_conn = 256;
}

typedef struct req_ctx {
  sbuf body;
  bool too_large;
  srv_job *job;
} req_ctx;

static int loaded_state(const srv *s) { return __atomic_load_n(&s->loaded, __ATOMIC_ACQUIRE); }

/* ---- responses ---- */
static enum MHD_Result send_text(struct MHD_Connection *c, srv *s, int status, const char *ctype, char *body,
                                 int retry_after) {
  if (!body) {
    status = 500;
    ctype = "application/json";
    body = strdup("{\"error\":{\"message\":\"out of memory\",\"type\":\"server_error\",\"param\":null,\"code\":null}}");
    if (!body) return MHD_NO;
  }
  struct MHD_Response *r = MHD_create_response_from_buffer(strlen(body), body, MHD_RESPMEM_MUST_FREE);
  if (!r) {
    free(body);
    return MHD_NO;
  }
  MHD_add_response_header(r, "Content-Type", ctype);
  if (retry_after > 0) {
    char ra[16];
    snprintf(ra, sizeof ra, "%d", retry_after);
    MHD_add_response_header(r, "Retry-After", ra);
  }
  if (status == 405) MHD_add_response_header(r, "Allow", "GET, POST");
  enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
  MHD_destroy_response(r);
  metrics_status(&s->metrics, status);
  return ret;
}

static enum MHD_Result send_json(struct MHD_Connection *c, srv *s, int status, cJSON *j) {
  char *body = j ? cJSON_PrintUnformatted(j) : NULL;
  cJSON_Delete(j);
  return send_text(c, s, status, "application/json", body, 0);
}

static enum MHD_Result send_error_shape(struct MHD_Connection *c, srv *s, const srv_error *e, int retry_after, int shape) {
  return send_text(c, s, e->status, "application/json", srv_error_json_shape(e, shape), retry_after);
}

static enum MHD_Result send_error(struct MHD_Connection *c, srv *s, const srv_error *e, int retry_after) {
  return send_error_shape(c, s, e, retry_after, SRV_ERR_OPENAI);
}

/* SSE: the connection thread reads the job's output as the worker produces it. */
static ssize_t stream_reader(void *cls, uint64_t pos, char *buf, size_t max) {
  (void)pos;
  srv_job *j = cls;
  pthread_mutex_lock(&j->mu);
  for (;;) {
    if (j->out_read < j->out.n) {
      size_t n = j->out.n - j->out_read;
      if (n > max) n = max;
      memcpy(buf, j->out.p + j->out_read, n);
      j->out_read += n;
      if (j->out_read == j->out.n) j->out.n = j->out_read = 0; /* all sent: reuse the buffer */
      pthread_mutex_unlock(&j->mu);
      return (ssize_t)n;
    }
    if (j->state == JOB_DONE) {
      pthread_mutex_unlock(&j->mu);
      return MHD_CONTENT_READER_END_OF_STREAM;
    }
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    ts.tv_sec += KEEPALIVE_S;
    if (pthread_cond_timedwait(&j->cv, &j->mu, &ts) == ETIMEDOUT && j->out_read == j->out.n &&
        j->state != JOB_DONE) {
      /* an SSE comment keeps proxies and clients from timing out during a long prefill or queue wait */
      static const char ka[] = ": keepalive\n\n";
      pthread_mutex_unlock(&j->mu);
      size_t n = sizeof ka - 1 < max ? sizeof ka - 1 : max;
      memcpy(buf, ka, n);
      return (ssize_t)n;
    }
  }
}

static void stream_free(void *cls) {
  srv_job *j = cls;
  job_cancel(j); /* no-op for a finished job; stops a running one whose client is gone */
  job_unref(j);
}

static enum MHD_Result send_job(struct MHD_Connection *c, srv *s, req_ctx *rc, srv_job *j) {
  rc->job = j; /* the request's reference */
  if (j->stream) {
    job_ref(j); /* the response's reference */
    struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_reader, j, stream_free);
    if (!r) {
      job_unref(j);
      return MHD_NO;
    }
    MHD_add_response_header(r, "Content-Type", "text/event-stream");
    MHD_add_response_header(r, "Cache-Control", "no-cache");
    MHD_add_response_header(r, "X-Accel-Buffering", "no");
    enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
    MHD_destroy_response(r);
    metrics_status(&s->metrics, 200);
    return ret;
  }
  job_wait(j);
  pthread_mutex_lock(&j->mu);
  char *body = j->out.oom ? NULL : strndup(j->out.p ? j->out.p : "", j->out.n);
  int status = j->status ? j->status : 500;
  pthread_mutex_unlock(&j->mu);
  return send_text(c, s, status, "application/json", body, 0);
}

/* ---- request checks shared by the endpoints ---- */
int srv_check_model(srv *s, const cJSON *req, srv_error *e) {
  int st = loaded_state(s);
  if (st == 0) return srv_fail(e, 503, "model_loading", NULL, "Loading model");
  if (st < 0) return srv_fail(e, 503, "model_failed", NULL, "The model failed to load: %s", s->load_err);
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(req, "model");
  if (!m || cJSON_IsNull(m)) return 0;
  if (!cJSON_IsString(m)) return srv_fail(e, 400, "invalid_type", "model", "'model' must be a string");
  const char *v = m->valuestring;
  /* the served id, the model's file name (with or without .gguf) or the path it was given as */
  size_t fl = strlen(s->model_file);
  bool ok = !strcmp(v, s->model_id) || !strcmp(v, s->model_file) || !strcmp(v, s->o.model) ||
            (fl > 5 && !strcmp(s->model_file + fl - 5, ".gguf") && strlen(v) == fl - 5 && !strncmp(v, s->model_file, fl - 5));
  if (!ok)
    return srv_fail(e, 404, "model_not_found", "model", "The model `%s` does not exist (this server serves `%s`)", v,
                    s->model_id);
  return 0;
}

int srv_enqueue(srv *s, srv_job *j, srv_error *e, srv_reply *r) {
  if (queue_submit(s->queue, j)) {
    r->retry_after = 1;
    return srv_fail(e, 503, "queue_full", NULL, "The server is busy (%d requests queued); retry later",
                    s->o.queue_max);
  }
  r->job = j;
  return 0;
}

/* ---- small endpoints ---- */
static enum MHD_Result ep_health(struct MHD_Connection *c, srv *s) {
  int st = loaded_state(s);
  char why[384];
  srv_error e;
  if (st == 1 && floe_engine_check(s->engine, why, sizeof why)) {
    srv_fail(&e, 503, "model_unusable", NULL, "The model cannot be used: %s", why);
    return send_error(c, s, &e, 0);
  }
  if (st == 1) return send_text(c, s, 200, "application/json", strdup("{\"status\":\"ok\"}"), 0);
  if (st == 0) srv_fail(&e, 503, "model_loading", NULL, "Loading model");
  else srv_fail(&e, 503, "model_failed", NULL, "The model failed to load: %s", s->load_err);
  return send_error(c, s, &e, 1);
}

static enum MHD_Result ep_models(struct MHD_Connection *c, srv *s) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "object", "list");
  cJSON *data = cJSON_AddArrayToObject(root, "data");
  cJSON *m = cJSON_CreateObject();
  cJSON_AddItemToArray(data, m);
  cJSON_AddStringToObject(m, "id", s->model_id);
  cJSON_AddStringToObject(m, "object", "model");
  cJSON_AddNumberToObject(m, "created", (double)s->created);
  cJSON_AddStringToObject(m, "owned_by", "floe");
  if (loaded_state(s) == 1) {
    floe_model_info mi;
    floe_engine_info(s->engine, &mi);
    cJSON *meta = cJSON_AddObjectToObject(m, "meta");
    cJSON_AddStringToObject(meta, "arch", mi.arch ? mi.arch : "");
    cJSON_AddNumberToObject(meta, "n_ctx", (double)s->n_ctx);
    cJSON_AddNumberToObject(meta, "n_ctx_train", (double)mi.n_ctx_train);
    cJSON_AddNumberToObject(meta, "n_vocab", (double)mi.n_vocab);
    cJSON_AddNumberToObject(meta, "n_embd", (double)mi.n_embd);
    cJSON_AddNumberToObject(meta, "size", (double)mi.weight_bytes);
  }
  return send_json(c, s, 200, root);
}

static enum MHD_Result ep_metrics(struct MHD_Connection *c, srv *s) {
  int pending = 0, running = 0;
  if (s->queue) queue_depth(s->queue, &pending, &running);
  sbuf o = {0};
  metrics_render(&s->metrics, &o, pending, running, loaded_state(s) == 1);
  if (o.oom) {
    sb_free(&o);
    return send_text(c, s, 500, "text/plain", NULL, 0);
  }
  return send_text(c, s, 200, "text/plain; version=0.0.4", o.p, 0);
}

static cJSON *parse_body(const char *body, size_t len, srv_error *e) {
  if (!utf8_valid(body, len)) {
    srv_fail(e, 400, "invalid_encoding", NULL, "the request body is not valid UTF-8");
    return NULL;
  }
  cJSON *j = cJSON_ParseWithLength(body, len);
  if (!j) {
    srv_fail(e, 400, "invalid_json", NULL, "the request body is not valid JSON");
    return NULL;
  }
  if (!cJSON_IsObject(j)) {
    cJSON_Delete(j);
    srv_fail(e, 400, "invalid_json", NULL, "the request body must be a JSON object");
    return NULL;
  }
  return j;
}

static enum MHD_Result ep_tokenize(struct MHD_Connection *c, srv *s, const char *body, size_t len) {
  srv_error e;
  cJSON *req = parse_body(body, len, &e);
  if (!req) return send_error(c, s, &e, 0);
  if (srv_check_model(s, req, &e)) {
    cJSON_Delete(req);
    return send_error(c, s, &e, e.status == 503 ? 1 : 0);
  }
  const cJSON *content = cJSON_GetObjectItemCaseSensitive(req, "content");
  bool parse_special = true, with_pieces = false, add_special = false;
  if (!cJSON_IsString(content)) srv_fail(&e, 400, "invalid_type", "content", "'content' must be a string");
  else if (json_opt_bool(req, "parse_special", &parse_special, &e) || json_opt_bool(req, "with_pieces", &with_pieces, &e) ||
           json_opt_bool(req, "add_special", &add_special, &e)) {
  } else {
    int32_t *ids = NULL;
    size_t n = 0;
    char err[256];
    if (floe_tokenize(s->engine, content->valuestring, strlen(content->valuestring), parse_special, &ids, &n, err,
                      sizeof err)) {
      srv_fail(&e, 500, NULL, NULL, "%s", err);
    } else {
      cJSON *root = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(root, "tokens");
      for (size_t i = 0; i < n; i++) {
        if (!with_pieces) {
          cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
          continue;
        }
        size_t pl;
        const char *pc = floe_token_piece(s->engine, ids[i], &pl);
        cJSON *t = cJSON_CreateObject();
        cJSON_AddNumberToObject(t, "id", ids[i]);
        if (pc && utf8_valid(pc, pl)) cJSON_AddItemToObject(t, "piece", json_str_n(pc, pl));
        else cJSON_AddItemToObject(t, "piece", json_token_bytes(pc ? pc : "", pc ? pl : 0));
        cJSON_AddItemToArray(arr, t);
      }
      free(ids);
      cJSON_Delete(req);
      return send_json(c, s, 200, root);
    }
  }
  cJSON_Delete(req);
  return send_error(c, s, &e, 0);
}

static enum MHD_Result ep_detokenize(struct MHD_Connection *c, srv *s, const char *body, size_t len) {
  srv_error e;
  cJSON *req = parse_body(body, len, &e);
  if (!req) return send_error(c, s, &e, 0);
  if (srv_check_model(s, req, &e)) {
    cJSON_Delete(req);
    return send_error(c, s, &e, e.status == 503 ? 1 : 0);
  }
  const cJSON *toks = cJSON_GetObjectItemCaseSensitive(req, "tokens");
  floe_model_info mi;
  floe_engine_info(s->engine, &mi);
  sbuf out = {0};
  const cJSON *t;
  if (!cJSON_IsArray(toks)) srv_fail(&e, 400, "invalid_type", "tokens", "'tokens' must be an array of integers");
  else {
    e.status = 0;
    cJSON_ArrayForEach(t, toks) {
      int32_t id;
      if (!json_token_id(t, mi.n_vocab, &id)) {
        srv_fail(&e, 400, "invalid_value", "tokens", "token ids must be integers in [0, %lld)", (long long)mi.n_vocab);
        break;
      }
      size_t pl;
      const char *pc = floe_token_piece(s->engine, id, &pl);
      if (pc) sb_add(&out, pc, pl);
    }
  }
  cJSON_Delete(req);
  if (e.status) {
    sb_free(&out);
    return send_error(c, s, &e, 0);
  }
  cJSON *root = cJSON_CreateObject();
  cJSON_AddItemToObject(root, "content", json_str_n(out.p ? out.p : "", out.n));
  sb_free(&out);
  return send_json(c, s, 200, root);
}

/* ---- routing ---- */
static bool auth_ok(struct MHD_Connection *c, srv *s) {
  if (!s->o.api_key || !s->o.api_key[0]) return true;
  const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "Authorization");
  if (h && !strncasecmp(h, "Bearer ", 7)) {
    h += 7;
    while (*h == ' ') h++;
    if (!strcmp(h, s->o.api_key)) return true;
  }
  h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, "x-api-key");
  return h && !strcmp(h, s->o.api_key);
}

static int route(const char *url, bool *post) {
  if (!strncmp(url, "/v1/", 4)) url += 3;
  static const struct { const char *path; int ep; bool post; } routes[] = {
      {"/chat/completions", SRV_EP_CHAT, true}, {"/completions", SRV_EP_COMPLETIONS, true},
      {"/models", SRV_EP_MODELS, false},       {"/health", SRV_EP_HEALTH, false},
      {"/metrics", SRV_EP_METRICS, false},     {"/tokenize", SRV_EP_TOKENIZE, true},
      {"/detokenize", SRV_EP_DETOKENIZE, true}, {"/responses", SRV_EP_RESPONSES, true},
      {"/messages", SRV_EP_MESSAGES, true},    {"/messages/count_tokens", SRV_EP_COUNT_TOKENS, true},
  };
  for (size_t i = 0; i < sizeof routes / sizeof routes[0]; i++)
    if (!strcmp(url, routes[i].path)) {
      *post = routes[i].post;
      return routes[i].ep;
    }
  return -1;
}

static enum MHD_Result dispatch(struct MHD_Connection *c, srv *s, const char *url, const char *method, req_ctx *rc) {
  srv_error e;
  bool post = false;
  int ep = route(url, &post);
  metrics_request(&s->metrics, ep < 0 ? SRV_EP_OTHER : ep);
  /* Anthropic's clients read errors in Anthropic's shape, the HTTP side's own ones included */
  int shape = ep == SRV_EP_MESSAGES || ep == SRV_EP_COUNT_TOKENS || (ep < 0 && strstr(url, "/messages"))
                  ? SRV_ERR_ANTHROPIC : SRV_ERR_OPENAI;
  if (ep < 0) {
    srv_fail(&e, 404, "not_found", NULL, "no endpoint %s", url);
    return send_error_shape(c, s, &e, 0, shape);
  }
  if (strcmp(method, post ? "POST" : "GET") && !(!post && !strcmp(method, "HEAD"))) {
    srv_fail(&e, 405, "method_not_allowed", NULL, "%s %s is not supported (use %s)", method, url, post ? "POST" : "GET");
    return send_error_shape(c, s, &e, 0, shape);
  }
  if (ep != SRV_EP_HEALTH && !auth_ok(c, s)) {
    srv_fail(&e, 401, "invalid_api_key", NULL, "Incorrect API key provided");
    return send_error_shape(c, s, &e, 0, shape);
  }
  if (rc->too_large) {
    srv_fail(&e, 413, "request_too_large", NULL, "the request body exceeds %zu bytes", s->o.max_body);
    return send_error_shape(c, s, &e, 0, shape);
  }
  const char *body = rc->body.p ? rc->body.p : "";
  size_t len = rc->body.n;
  switch (ep) {
  case SRV_EP_HEALTH: return ep_health(c, s);
  case SRV_EP_MODELS: return ep_models(c, s);
  case SRV_EP_METRICS: return ep_metrics(c, s);
  case SRV_EP_TOKENIZE: return ep_tokenize(c, s, body, len);
  case SRV_EP_DETOKENIZE: return ep_detokenize(c, s, body, len);
  default: break;
  }
  const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
  int fd = ci ? ci->connect_fd : -1;
  srv_reply r = {0};
  switch (ep) {
  case SRV_EP_CHAT: openai_chat(s, body, len, fd, &r); break;
  case SRV_EP_RESPONSES: openai_responses(s, body, len, fd, &r); break;
  case SRV_EP_MESSAGES: anthropic_messages(s, body, len, fd, &r); break;
  case SRV_EP_COUNT_TOKENS: anthropic_count_tokens(s, body, len, &r); break;
  default: openai_completions(s, body, len, fd, &r); break;
  }
  if (r.job) return send_job(c, s, rc, r.job);
  return send_text(c, s, r.status ? r.status : 500, r.content_type ? r.content_type : "application/json", r.body,
                   r.retry_after);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload, size_t *upload_size, void **con_cls) {
  (void)version;
  srv *s = cls;
  req_ctx *rc = *con_cls;
  if (!rc) {
    rc = calloc(1, sizeof *rc);
    if (!rc) return MHD_NO;
    *con_cls = rc;
    const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
    if (cl) {
      char *end;
      errno = 0;
      unsigned long long v = strtoull(cl, &end, 10);
      if (errno || *end || v > s->o.max_body) {
        /* answered before the body is read; libmicrohttpd closes the connection afterwards */
        srv_error e;
        srv_fail(&e, 413, "request_too_large", NULL, "the request body exceeds %zu bytes", s->o.max_body);
        metrics_request(&s->metrics, SRV_EP_OTHER);
        return send_error(c, s, &e, 0);
      }
    }
    return MHD_YES;
  }
  if (*upload_size) {
    if (rc->body.n + *upload_size > s->o.max_body) rc->too_large = true;
    else sb_add(&rc->body, upload, *upload_size);
    if (rc->body.oom) rc->too_large = true;
    *upload_size = 0;
    return MHD_YES;
  }
  return dispatch(c, s, url, method, rc);
}

static void on_completed(void *cls, struct MHD_Connection *c, void **con_cls, enum MHD_RequestTerminationCode toe) {
  (void)cls, (void)c;
  req_ctx *rc = *con_cls;
  if (!rc) return;
  if (rc->job) {
    if (toe != MHD_REQUEST_TERMINATED_COMPLETED_OK) job_cancel(rc->job);
    pthread_mutex_lock(&rc->job->mu);
    rc->job->fd = -1; /* the socket is closed after this callback */
    pthread_mutex_unlock(&rc->job->mu);
    job_unref(rc->job);
  }
  sb_free(&rc->body);
  free(rc);
  *con_cls = NULL;
}

static void mhd_log(void *cls, const char *fmt, va_list ap) {
  srv *s = cls;
  if (!s->o.verbose) return;
  fputs("floe serve: http: ", stderr);
  vfprintf(stderr, fmt, ap);
}

/* ---- lifecycle ---- */
static void *loader_main(void *arg) {
  srv *s = arg;
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  ep.model = s->o.model;
  ep.n_threads = s->o.n_threads;
  ep.mem_budget = s->o.mem_budget;
  ep.gpu_mem = s->o.gpu_mem;
  ep.load = s->o.load;
  ep.io_direct = s->o.io_direct;
  ep.device = s->o.device;
  ep.device_index = s->o.device_index;
  ep.mtp = s->o.mtp;
  ep.progress = s->o.progress;
  ep.progress_user = s->o.progress_user;
  floe_session_params sp;
  floe_session_params_init(&sp);
  sp.n_ctx = s->o.n_ctx;
  sp.kv_f32 = s->o.kv_f32;
  sp.n_checkpoints = s->o.n_checkpoints;
  double t0 = floe_time_s();
  floe_engine *e = NULL;
  int rc = floe_engine_open(&ep, &e, s->load_err, sizeof s->load_err);
  if (!rc)
    rc = queue_start(s->queue, e, &sp, s->o.n_slots, s->o.n_parallel, !s->o.parallel_set, s->o.chunk, s->load_err,
                     sizeof s->load_err);
  if (rc) {
    fprintf(stderr, "floe serve: cannot load %s: %s\n", s->o.model, s->load_err);
    s->engine = e; /* freed by srv_stop */
    __atomic_store_n(&s->loaded, -1, __ATOMIC_RELEASE);
    return NULL;
  }
  s->engine = e;
  s->n_ctx = queue_n_ctx(s->queue);
  __atomic_store_n(&s->loaded, 1, __ATOMIC_RELEASE);
  int n_sess, n_par;
  queue_slots(s->queue, &n_sess, &n_par);
  fprintf(stderr, "floe serve: model %s loaded in %.2f s (context %lld tokens, %d slot%s, %d decoded together)\n",
          s->model_id, floe_time_s() - t0, (long long)s->n_ctx, n_sess, n_sess == 1 ? "" : "s", n_par);
  return NULL;
}

int srv_start(const srv_opts *o, srv **out, char *err, size_t errlen) {
  *out = NULL;
  if (!o->model) return floe_err(err, errlen, FLOE_E_INVALID, "no model given");
  srv *s = calloc(1, sizeof *s);
  if (!s) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  s->o = *o;
  if (s->o.n_slots < 1) s->o.n_slots = 1;
  if (s->o.n_parallel < 1) s->o.n_parallel = 1;
  if (s->o.queue_max < 1) s->o.queue_max = 1;
  if (!s->o.max_body) s->o.max_body = (size_t)8 << 20;
  if (s->o.max_conn < 4) s->o.max_conn = 4;
  s->created = (int64_t)time(NULL);
  metrics_init(&s->metrics);
  const char *base = strrchr(o->model, '/');
  base = base && base[1] ? base + 1 : o->model;
  snprintf(s->model_file, sizeof s->model_file, "%s", base);
  size_t bl = strlen(s->model_file);
  while (bl > 1 && s->model_file[bl - 1] == '/') s->model_file[--bl] = 0;
  snprintf(s->model_id, sizeof s->model_id, "%s", o->alias ? o->alias : s->model_file);
  s->queue = queue_new(s, s->o.queue_max);
  if (!s->queue) {
    free(s);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }

  struct addrinfo hints = {0}, *ai = NULL;
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE;
  char port[16];
  snprintf(port, sizeof port, "%d", o->port);
  int gr = getaddrinfo(o->host && o->host[0] ? o->host : "127.0.0.1", port, &hints, &ai);
  if (gr || !ai) {
    queue_free(s->queue);
    free(s);
    return floe_err(err, errlen, FLOE_E_INVALID, "cannot resolve host '%s': %s", o->host, gai_strerror(gr));
  }
  unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_AUTO | MHD_USE_ITC |
                   MHD_USE_ERROR_LOG | (ai->ai_family == AF_INET6 ? MHD_USE_IPv6 : 0);
  struct MHD_Daemon *d = MHD_start_daemon(
      flags, (uint16_t)o->port, NULL, NULL, on_request, s, MHD_OPTION_EXTERNAL_LOGGER, mhd_log, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
      MHD_OPTION_NOTIFY_COMPLETED, on_completed, s, MHD_OPTION_CONNECTION_LIMIT, (unsigned)s->o.max_conn,
      MHD_OPTION_CONNECTION_TIMEOUT, (unsigned)300, MHD_OPTION_CONNECTION_MEMORY_LIMIT, (size_t)64 * 1024,
      MHD_OPTION_END);
  freeaddrinfo(ai);
  if (!d) {
    queue_free(s->queue);
    free(s);
    return floe_err(err, errlen, FLOE_E_IO, "cannot listen on %s:%d (address in use or not permitted)", o->host,
                    o->port);
  }
  s->mhd = d;
  const union MHD_DaemonInfo *di = MHD_get_daemon_info(d, MHD_DAEMON_INFO_BIND_PORT);
  s->port = di ? di->port : o->port;
  if (pthread_create(&s->loader, NULL, loader_main, s)) {
    MHD_stop_daemon(d);
    queue_free(s->queue);
    free(s);
    return floe_err(err, errlen, FLOE_E_NOMEM, "cannot start the loader thread");
  }
  s->loader_started = true;
  *out = s;
  return 0;
}

int srv_port(const srv *s) { return s->port; }
bool srv_failed(const srv *s) { return loaded_state(s) < 0; }

void srv_stop(srv *s) {
  if (!s) return;
  struct MHD_Daemon *d = s->mhd;
  MHD_socket lfd = d ? MHD_quiesce_daemon(d) : MHD_INVALID_SOCKET; /* stop accepting */
  if (s->loader_started) pthread_join(s->loader, NULL);
  queue_stop(s->queue); /* wakes every handler waiting on a job */
  if (d) MHD_stop_daemon(d);
  if (lfd != MHD_INVALID_SOCKET) close(lfd);
  queue_free(s->queue);
  floe_engine_close(s->engine);
  pthread_mutex_destroy(&s->metrics.mu);
  free(s);
}
