/* Server helpers: byte buffers, UTF-8 checks, JSON strings, ids, OpenAI error objects, and the
 * request fields shared by the chat and completions endpoints. */
#include <math.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "base/base.h"
#include "server/server.h"

/* ---- sbuf ---- */
void sb_add(sbuf *b, const void *d, size_t n) {
  if (b->oom) return;
  if (b->n + n + 1 > b->cap) {
    size_t cap = b->cap ? b->cap : 256;
    while (cap < b->n + n + 1) {
      if (cap > SIZE_MAX / 2) {
        b->oom = true;
        return;
      }
      cap *= 2;
    }
    char *p = realloc(b->p, cap);
    if (!p) {
      b->oom = true;
      return;
    }
    b->p = p;
    b->cap = cap;
  }
  if (n) memcpy(b->p + b->n, d, n);
  b->n += n;
  b->p[b->n] = 0;
}

void sb_str(sbuf *b, const char *s) { sb_add(b, s, strlen(s)); }

void sb_printf(sbuf *b, const char *fmt, ...) {
  char tmp[512];
  va_list ap;
  va_start(ap, fmt);
  int k = vsnprintf(tmp, sizeof tmp, fmt, ap);
  va_end(ap);
  if (k < 0) return;
  if ((size_t)k < sizeof tmp) {
    sb_add(b, tmp, (size_t)k);
    return;
  }
  char *big = malloc((size_t)k + 1);
  if (!big) {
    b->oom = true;
    return;
  }
  va_start(ap, fmt);
  vsnprintf(big, (size_t)k + 1, fmt, ap);
  va_end(ap);
  sb_add(b, big, (size_t)k);
  free(big);
}

void sb_free(sbuf *b) {
  free(b->p);
  memset(b, 0, sizeof *b);
}

/* ---- UTF-8 ---- */
/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid (overlongs, surrogates and
 * code points above U+10FFFF are invalid). */
static size_t utf8_seq(const unsigned char *s, size_t n) {
  unsigned c = s[0];
  if (c < 0x80) return 1;
  size_t len;
  unsigned cp;
  if ((c & 0xe0) == 0xc0) len = 2, cp = c & 0x1f;
  else if ((c & 0xf0) == 0xe0) len = 3, cp = c & 0x0f;
  else if ((c & 0xf8) == 0xf0) len = 4, cp = c & 0x07;
  else return 0;
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((s[i] & 0xc0) != 0x80) return 0;
    cp = (cp << 6) | (s[i] & 0x3f);
  }
  if ((len == 2 && cp < 0x80) || (len == 3 && cp < 0x800) || (len == 4 && cp < 0x10000)) return 0;
  if (cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  return len;
}

bool utf8_valid(const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq(u + i, n - i);
    if (!k) return false;
    i += k;
  }
  return true;
}

/* Copy with invalid bytes replaced by U+FFFD. */
static void sb_utf8_repair(sbuf *b, const char *s, size_t n) {
  const unsigned char *u = (const unsigned char *)s;
  for (size_t i = 0; i < n;) {
    size_t k = utf8_seq(u + i, n - i);
    if (k) {
      sb_add(b, s + i, k);
      i += k;
    } else {
      sb_add(b, "\xef\xbf\xbd", 3);
      i++;
    }
  }
}

void sb_json_str(sbuf *b, const char *s, size_t n) {
  sbuf tmp = {0};
  sb_utf8_repair(&tmp, s, n);
  sb_add(b, "\"", 1);
  for (size_t i = 0; i < tmp.n; i++) {
    unsigned char c = (unsigned char)tmp.p[i];
    switch (c) {
    case '"': sb_add(b, "\\\"", 2); break;
    case '\\': sb_add(b, "\\\\", 2); break;
    case '\n': sb_add(b, "\\n", 2); break;
    case '\r': sb_add(b, "\\r", 2); break;
    case '\t': sb_add(b, "\\t", 2); break;
    default:
      if (c < 0x20) sb_printf(b, "\\u%04x", c);
      else sb_add(b, &tmp.p[i], 1);
    }
  }
  sb_add(b, "\"", 1);
  if (tmp.oom) b->oom = true;
  sb_free(&tmp);
}

cJSON *json_str_n(const char *s, size_t n) {
  sbuf tmp = {0};
  sb_utf8_repair(&tmp, s, n);
  sb_add(&tmp, "", 0);
  cJSON *j = tmp.oom ? NULL : cJSON_CreateString(tmp.p ? tmp.p : "");
  sb_free(&tmp);
  return j;
}

cJSON *json_token_bytes(const char *piece, size_t n) {
  cJSON *arr = cJSON_CreateArray();
  for (size_t i = 0; arr && i < n; i++) cJSON_AddItemToArray(arr, cJSON_CreateNumber((unsigned char)piece[i]));
  return arr;
}

/* ---- ids ---- */
void srv_rand_id(char *out, size_t cap, const char *prefix, int n_chars) {
  static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
  static floe_rng rng;
  static bool seeded;
  static const char al[] = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  pthread_mutex_lock(&mu);
  if (!seeded) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    floe_rng_seed(&rng, (uint64_t)ts.tv_sec * 1000000007ull ^ (uint64_t)ts.tv_nsec);
    seeded = true;
  }
  size_t o = (size_t)snprintf(out, cap, "%s", prefix);
  for (int i = 0; i < n_chars && o + 1 < cap; i++) out[o++] = al[floe_rng_u64(&rng) % (sizeof al - 1)];
  if (o < cap) out[o] = 0;
  pthread_mutex_unlock(&mu);
}

/* ---- errors ---- */
int srv_fail(srv_error *e, int status, const char *code, const char *param, const char *fmt, ...) {
  e->status = status;
  const char *type = status == 401 ? "authentication_error"
                     : status == 404 ? "invalid_request_error"
                     : status == 503 ? "unavailable_error"
                     : status >= 500 ? "server_error"
                                     : "invalid_request_error";
  snprintf(e->type, sizeof e->type, "%s", type);
  snprintf(e->code, sizeof e->code, "%s", code ? code : "");
  snprintf(e->param, sizeof e->param, "%s", param ? param : "");
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(e->message, sizeof e->message, fmt, ap);
  va_end(ap);
  return -1;
}

char *srv_error_json(const srv_error *e) {
  cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
  cJSON_AddItemToObject(o, "message", json_str_n(e->message, strlen(e->message)));
  cJSON_AddStringToObject(o, "type", e->type);
  if (e->param[0]) cJSON_AddStringToObject(o, "param", e->param);
  else cJSON_AddNullToObject(o, "param");
  if (e->code[0]) cJSON_AddStringToObject(o, "code", e->code);
  else cJSON_AddNullToObject(o, "code");
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return s;
}

/* Anthropic's error types by HTTP status. */
static const char *anthropic_error_type(int status) {
  switch (status) {
  case 401: return "authentication_error";
  case 403: return "permission_error";
  case 404: return "not_found_error";
  case 413: return "request_too_large";
  case 429: return "rate_limit_error";
  case 503: return "overloaded_error";
  default: return status >= 500 ? "api_error" : "invalid_request_error";
  }
}

char *srv_error_json_shape(const srv_error *e, int shape) {
  if (shape != SRV_ERR_ANTHROPIC) return srv_error_json(e);
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "type", "error");
  cJSON *o = cJSON_AddObjectToObject(root, "error");
  cJSON_AddStringToObject(o, "type", anthropic_error_type(e->status));
  cJSON_AddItemToObject(o, "message", json_str_n(e->message, strlen(e->message)));
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  return s;
}

void srv_reply_error(srv_reply *r, const srv_error *e, int shape) {
  r->status = e->status ? e->status : 500;
  r->body = srv_error_json_shape(e, shape);
  r->err_shape = shape;
  if (e->status == 503) r->retry_after = 1;
}

/* ---- request fields ---- */
int json_opt_num(const cJSON *o, const char *key, double lo, double hi, double *out, bool *present, srv_error *e) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (present) *present = false;
  if (!v || cJSON_IsNull(v)) return 0;
  if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
    return srv_fail(e, 400, "invalid_type", key, "'%s' must be a number", key);
  if (v->valuedouble < lo || v->valuedouble > hi)
    return srv_fail(e, 400, "invalid_value", key, "'%s' must be in [%g, %g] (got %g)", key, lo, hi, v->valuedouble);
  *out = v->valuedouble;
  if (present) *present = true;
  return 0;
}

int json_opt_bool(const cJSON *o, const char *key, bool *out, srv_error *e) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, key);
  if (!v || cJSON_IsNull(v)) return 0;
  if (!cJSON_IsBool(v)) return srv_fail(e, 400, "invalid_type", key, "'%s' must be a boolean", key);
  *out = cJSON_IsTrue(v);
  return 0;
}

int srv_parse_gen(srv *s, const cJSON *req, srv_job *j, srv_error *e) {
  floe_gen_params *gp = &j->gp;
  floe_gen_params_init(gp);
  gp->sampling.temperature = 1.0f; /* OpenAI's default */
  double v;
  bool have;
  if (json_opt_num(req, "temperature", 0, 2, &v, &have, e)) return -1;
  if (have) gp->sampling.temperature = (float)v;
  if (json_opt_num(req, "top_p", 0, 1, &v, &have, e)) return -1;
  if (have) gp->sampling.top_p = v > 0 ? (float)v : 1e-6f;
  if (json_opt_num(req, "top_k", -1, 1e9, &v, &have, e)) return -1;
  if (have) gp->sampling.top_k = (int32_t)v;
  if (json_opt_num(req, "min_p", 0, 1, &v, &have, e)) return -1;
  if (have) gp->sampling.min_p = (float)v;
  if (json_opt_num(req, "seed", -9.2e18, 1.8e19, &v, &have, e)) return -1;
  if (have) gp->sampling.seed = v < 0 ? (uint64_t)(int64_t)v : (uint64_t)v;
  else {
    char rid[24];
    srv_rand_id(rid, sizeof rid, "", 12);
    uint64_t h = 1469598103934665603ull;
    for (const char *c = rid; *c; c++) h = (h ^ (uint8_t)*c) * 1099511628211ull;
    gp->sampling.seed = h;
  }
  gp->max_tokens = s->o.default_max_tokens;
  if (json_opt_num(req, "max_tokens", 1, 1e12, &v, &have, e)) return -1;
  if (have) gp->max_tokens = (int64_t)v;
  if (json_opt_num(req, "max_completion_tokens", 1, 1e12, &v, &have, e)) return -1;
  if (have) gp->max_tokens = (int64_t)v;
  if (json_opt_num(req, "n", 1, 1e9, &v, &have, e)) return -1;
  if (have && v != 1) return srv_fail(e, 400, "invalid_value", "n", "only n = 1 is supported");
  for (const char *k = "frequency_penalty"; k; k = k[0] == 'f' ? "presence_penalty" : NULL)
    if (json_opt_num(req, k, -2, 2, &v, NULL, e)) return -1;

  return srv_parse_stops(req, "stop", j, e);
}

int srv_parse_stops(const cJSON *req, const char *key, srv_job *j, srv_error *e) {
  const cJSON *stop = cJSON_GetObjectItemCaseSensitive(req, key);
  if (!stop || cJSON_IsNull(stop)) return 0;
  size_t n = cJSON_IsString(stop) ? 1 : cJSON_IsArray(stop) ? (size_t)cJSON_GetArraySize(stop) : 0;
  if (!cJSON_IsString(stop) && !cJSON_IsArray(stop))
    return srv_fail(e, 400, "invalid_type", key, "'%s' must be a string or an array of strings", key);
  if (n > 16) return srv_fail(e, 400, "invalid_value", key, "at most 16 stop strings");
  j->stops = calloc(n ? n : 1, sizeof *j->stops);
  if (!j->stops) return srv_fail(e, 500, NULL, NULL, "out of memory");
  const cJSON *it = cJSON_IsString(stop) ? stop : stop->child;
  for (size_t i = 0; i < n; i++, it = it->next) {
    if (!cJSON_IsString(it)) return srv_fail(e, 400, "invalid_type", key, "'%s' entries must be strings", key);
    if (!it->valuestring[0]) continue; /* empty stop strings are ignored */
    if (strlen(it->valuestring) > 256) return srv_fail(e, 400, "invalid_value", key, "stop string too long");
    j->stops[j->n_stops] = strdup(it->valuestring);
    if (!j->stops[j->n_stops]) return srv_fail(e, 500, NULL, NULL, "out of memory");
    j->n_stops++;
  }
  j->gp.stop = (const char *const *)j->stops;
  j->gp.n_stop = j->n_stops;
  return 0;
}

bool json_token_id(const cJSON *t, int64_t n_vocab, int32_t *id) {
  if (!cJSON_IsNumber(t)) return false;
  double d = t->valuedouble;
  if (!(d >= 0 && d < (double)n_vocab) || d != floor(d)) return false;
  *id = (int32_t)d;
  return true;
}

int srv_check_context(srv *s, size_t n_prompt, const char *param, srv_error *e) {
  if (n_prompt == 0) return srv_fail(e, 400, "invalid_value", param, "the prompt is empty");
  if ((int64_t)n_prompt >= s->n_ctx)
    return srv_fail(e, 400, "context_length_exceeded", param,
                    "This model's maximum context length is %lld tokens. However, your messages resulted in %zu tokens.",
                    (long long)s->n_ctx, n_prompt);
  return 0;
}

cJSON *json_response_root(const char *id, const char *object, int64_t created, const char *model) {
  cJSON *root = cJSON_CreateObject();
  cJSON_AddStringToObject(root, "id", id);
  cJSON_AddStringToObject(root, "object", object);
  cJSON_AddNumberToObject(root, "created", (double)created);
  cJSON_AddStringToObject(root, "model", model);
  cJSON_AddStringToObject(root, "system_fingerprint", "floe-" FLOE_VERSION);
  return root;
}

cJSON *json_usage(const floe_gen_result *res, int64_t reasoning_tokens) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "prompt_tokens", (double)res->n_prompt);
  cJSON_AddNumberToObject(u, "completion_tokens", (double)res->n_gen);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(res->n_prompt + res->n_gen));
  cJSON *pd = cJSON_AddObjectToObject(u, "prompt_tokens_details");
  cJSON_AddNumberToObject(pd, "cached_tokens", (double)res->n_reused);
  cJSON *cd = cJSON_AddObjectToObject(u, "completion_tokens_details");
  cJSON_AddNumberToObject(cd, "reasoning_tokens", (double)reasoning_tokens);
  return u;
}
