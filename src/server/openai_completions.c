/* POST /v1/completions (legacy text completions): prompt = a string, an array of one string, or an
 * array of token ids. logprobs = N (0..20) gives the legacy shape {tokens, token_logprobs,
 * top_logprobs: [{token: logprob}], text_offset}. Streaming sends text_completion chunks and
 * "data: [DONE]". echo and best_of > 1 are not supported (400). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/server.h"

typedef struct cmpl_proto {
  char id[48];
  int64_t created;
  char model[256];
  const floe_engine *e;
  srv_job *job;
  bool stream, include_usage;
  int logprobs; /* -1 off, else alternatives per token */
  sbuf text;
  cJSON *tokens, *token_lps, *top_lps, *offsets; /* legacy logprobs arrays (pending when streaming) */
  bool verbose;
} cmpl_proto;

static void cmpl_free(void *pp) {
  cmpl_proto *p = pp;
  sb_free(&p->text);
  cJSON_Delete(p->tokens);
  cJSON_Delete(p->token_lps);
  cJSON_Delete(p->top_lps);
  cJSON_Delete(p->offsets);
  free(p);
}

static void lp_reset(cmpl_proto *p) {
  p->tokens = cJSON_CreateArray();
  p->token_lps = cJSON_CreateArray();
  p->top_lps = cJSON_CreateArray();
  p->offsets = cJSON_CreateArray();
}

/* Moves the pending legacy logprobs into a choice. */
static void lp_attach(cmpl_proto *p, cJSON *ch) {
  if (p->logprobs < 0) {
    cJSON_AddNullToObject(ch, "logprobs");
    return;
  }
  cJSON *lo = cJSON_AddObjectToObject(ch, "logprobs");
  cJSON_AddItemToObject(lo, "tokens", p->tokens);
  cJSON_AddItemToObject(lo, "token_logprobs", p->token_lps);
  cJSON_AddItemToObject(lo, "top_logprobs", p->top_lps);
  cJSON_AddItemToObject(lo, "text_offset", p->offsets);
  lp_reset(p);
}

static cJSON *cmpl_root(cmpl_proto *p) {
  return json_response_root(p->id, "text_completion", p->created, p->model);
}

static void emit_chunk(cmpl_proto *p, const char *s, size_t n, const char *finish) {
  cJSON *root = cmpl_root(p);
  cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *ch = cJSON_CreateObject();
  cJSON_AddItemToArray(choices, ch);
  cJSON_AddItemToObject(ch, "text", json_str_n(s, n));
  cJSON_AddNumberToObject(ch, "index", 0);
  lp_attach(p, ch);
  if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
  else cJSON_AddNullToObject(ch, "finish_reason");
  if (p->include_usage) cJSON_AddNullToObject(root, "usage");
  job_emit_event(p->job, root);
}

static void cmpl_on_token(srv_job *j, const floe_token_event *ev) {
  cmpl_proto *p = j->proto;
  if (p->logprobs >= 0 && ev->id >= 0 && !floe_token_is_eog(p->e, ev->id)) {
    size_t n;
    const char *pc = floe_token_piece(p->e, ev->id, &n);
    cJSON_AddItemToArray(p->tokens, json_str_n(pc ? pc : "", pc ? n : 0));
    cJSON_AddItemToArray(p->token_lps, cJSON_CreateNumber(isfinite(ev->logprob) ? ev->logprob : -9999.0));
    cJSON *top = cJSON_CreateObject();
    for (int k = 0; k < ev->n_top && k < p->logprobs; k++) {
      if (ev->top_ids[k] < 0) continue;
      size_t tn;
      const char *tp = floe_token_piece(p->e, ev->top_ids[k], &tn);
      cJSON *key = json_str_n(tp ? tp : "", tp ? tn : 0);
      if (key && !cJSON_GetObjectItemCaseSensitive(top, key->valuestring))
        cJSON_AddNumberToObject(top, key->valuestring, isfinite(ev->top_logprobs[k]) ? ev->top_logprobs[k] : -9999.0);
      cJSON_Delete(key);
    }
    cJSON_AddItemToArray(p->top_lps, top);
    cJSON_AddItemToArray(p->offsets, cJSON_CreateNumber((double)p->text.n));
  }
  if (ev->text_len) {
    sb_add(&p->text, ev->text, ev->text_len);
    if (p->stream) emit_chunk(p, ev->text, ev->text_len, NULL);
  }
}

static void cmpl_on_done(srv_job *j, int rc, const floe_gen_result *res, const char *err) {
  cmpl_proto *p = j->proto;
  if (rc) {
    job_fail_generation(j, rc, err, "prompt");
    return;
  }
  const char *fr = res->finish == FLOE_FINISH_LENGTH ? "length" : "stop";
  if (p->verbose)
    fprintf(stderr, "floe serve: completion %s: prompt %lld (cached %lld), generated %lld, finish %s\n", p->id,
            (long long)res->n_prompt, (long long)res->n_reused, (long long)res->n_gen, fr);
  if (p->stream) {
    emit_chunk(p, "", 0, fr);
    if (p->include_usage) {
      cJSON *root = cmpl_root(p);
      cJSON_AddArrayToObject(root, "choices");
      cJSON_AddItemToObject(root, "usage", json_usage(res, 0));
      job_emit_event(j, root);
    }
    job_emit(j, "data: [DONE]\n\n", 14);
    return;
  }
  cJSON *root = cmpl_root(p);
  cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *ch = cJSON_CreateObject();
  cJSON_AddItemToArray(choices, ch);
  cJSON_AddItemToObject(ch, "text", json_str_n(p->text.p ? p->text.p : "", p->text.n));
  cJSON_AddNumberToObject(ch, "index", 0);
  lp_attach(p, ch);
  cJSON_AddStringToObject(ch, "finish_reason", fr);
  cJSON_AddItemToObject(root, "usage", json_usage(res, 0));
  job_emit_body(j, root);
}

static const srv_job_ops cmpl_ops = {cmpl_on_token, cmpl_on_done, cmpl_free};

/* prompt: string | [string] | [int, ...] */
static int prompt_ids(srv *s, const cJSON *pr, int32_t **ids, size_t *n, srv_error *e) {
  char err[256];
  if (cJSON_IsArray(pr) && cJSON_GetArraySize(pr) == 1 && cJSON_IsString(pr->child)) pr = pr->child;
  if (cJSON_IsString(pr)) {
    if (queue_tokenize_prompt(s->queue, s->engine, pr->valuestring, strlen(pr->valuestring), ids, n, err, sizeof err))
      return srv_fail(e, 500, NULL, NULL, "tokenizer: %s", err);
    return 0;
  }
  if (!cJSON_IsArray(pr))
    return srv_fail(e, 400, "invalid_type", "prompt", "'prompt' must be a string or an array of token ids");
  floe_model_info mi;
  floe_engine_info(s->engine, &mi);
  size_t k = (size_t)cJSON_GetArraySize(pr);
  *ids = malloc((k ? k : 1) * sizeof **ids);
  if (!*ids) return srv_fail(e, 500, NULL, NULL, "out of memory");
  const cJSON *t;
  size_t i = 0;
  cJSON_ArrayForEach(t, pr) {
    if (!json_token_id(t, mi.n_vocab, &(*ids)[i]))
      return srv_fail(e, 400, "invalid_value", "prompt",
                      "'prompt' must be a string, one string, or token ids in [0, %lld)", (long long)mi.n_vocab);
    i++;
  }
  *n = i;
  return 0;
}

void openai_completions(srv *s, const char *body, size_t len, int fd, srv_reply *r) {
  srv_error e = {0};
  srv_job *j = NULL;
  cmpl_proto *p = NULL;
  cJSON *req = NULL;
  if (!utf8_valid(body, len)) {
    srv_fail(&e, 400, "invalid_encoding", NULL, "the request body is not valid UTF-8");
    goto fail;
  }
  req = cJSON_ParseWithLength(body, len);
  if (!cJSON_IsObject(req)) {
    srv_fail(&e, 400, "invalid_json", NULL, "the request body must be a JSON object");
    goto fail;
  }
  if (srv_check_model(s, req, &e)) goto fail;
  bool stream = false, include_usage = false, echo = false;
  if (json_opt_bool(req, "stream", &stream, &e) || json_opt_bool(req, "echo", &echo, &e)) goto fail;
  if (echo) {
    srv_fail(&e, 400, "unsupported_value", "echo", "'echo' is not supported");
    goto fail;
  }
  double v;
  bool have;
  if (json_opt_num(req, "best_of", 1, 1, &v, NULL, &e)) goto fail;
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(req, "stream_options");
  if (cJSON_IsObject(so) && json_opt_bool(so, "include_usage", &include_usage, &e)) goto fail;
  int logprobs = -1;
  if (json_opt_num(req, "logprobs", 0, 20, &v, &have, &e)) goto fail;
  if (have) logprobs = (int)v;
  const cJSON *pr = cJSON_GetObjectItemCaseSensitive(req, "prompt");
  if (!pr) {
    srv_fail(&e, 400, "invalid_value", "prompt", "'prompt' is required");
    goto fail;
  }
  j = job_new(s);
  p = calloc(1, sizeof *p);
  if (!j || !p) {
    srv_fail(&e, 500, NULL, NULL, "out of memory");
    goto fail;
  }
  if (srv_parse_gen(s, req, j, &e)) goto fail;
  j->gp.logprobs = logprobs >= 0;
  j->gp.n_top_logprobs = logprobs > 0 ? logprobs : 0;
  if (prompt_ids(s, pr, &j->ids, &j->n_ids, &e)) goto fail;
  if (srv_check_context(s, j->n_ids, "prompt", &e)) goto fail;
  srv_rand_id(p->id, sizeof p->id, "cmpl-", 24);
  p->created = (int64_t)time(NULL);
  snprintf(p->model, sizeof p->model, "%s", s->model_id);
  p->e = s->engine;
  p->job = j;
  p->stream = stream;
  p->include_usage = stream && include_usage;
  p->logprobs = logprobs;
  p->verbose = s->o.verbose;
  lp_reset(p);
  j->proto = p;
  j->ops = &cmpl_ops;
  p = NULL;
  j->stream = stream;
  j->fd = fd;
  if (srv_enqueue(s, j, &e, r)) {
    r->status = e.status;
    r->body = srv_error_json(&e);
    job_unref(j);
  }
  cJSON_Delete(req);
  return;
fail:
  r->status = e.status ? e.status : 500;
  r->body = srv_error_json(&e);
  if (e.status == 503) r->retry_after = 1;
  job_unref(j);
  if (p) cmpl_free(p);
  cJSON_Delete(req);
}
