/* The chat path shared by /v1/chat/completions, /v1/responses and /v1/messages.
 *
 * Every chat API maps its request onto one chat_req (messages for floe_chat_render, tools in the
 * chat-completions shape, whether tool calls are parsed, thinking on or off); chat_req_prompt
 * renders it with the model's own template and tokenizes it (with sampled-token replay). The
 * generation side is one chat_gen per job: the worker's tokens go through one output parser
 * (output_parse.c: <think> blocks, Qwen3 JSON and Qwen3.5 XML tool calls), which collects the
 * reply (reasoning, content, calls) for a non-streaming response and, when streaming, drives the
 * API's block callbacks: a block is one run of reasoning, of content, or one tool call; the API
 * opens it, receives its deltas (tool-call arguments incrementally) and closes it, each in its
 * own wire form.
 *
 * Ownership: a chat_req owns every string it made (the pool) and its tools; strings borrowed from
 * the request JSON must outlive it. A chat_gen owns its parser, collected text and tools; the
 * API's own state (g->user) is freed by api->free. */
#define _GNU_SOURCE /* memmem */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/chat_gen.h"

/* ---- chat_req ---- */
void chat_req_free(chat_req *r) {
  for (size_t i = 0; i < r->n_pool; i++) free(r->pool[i]);
  free(r->pool);
  free(r->msgs);
  free(r->call_at);
  free(r->calls);
  cJSON_Delete(r->tools);
  memset(r, 0, sizeof *r);
}

char *chat_req_keep(chat_req *r, char *s) {
  if (!s) return NULL;
  if (r->n_pool == r->cap_pool) {
    size_t nc = r->cap_pool ? r->cap_pool * 2 : 16;
    char **nb = realloc(r->pool, nc * sizeof *nb);
    if (!nb) {
      free(s);
      return NULL;
    }
    r->pool = nb;
    r->cap_pool = nc;
  }
  return r->pool[r->n_pool++] = s;
}

const char *chat_req_join(chat_req *r, sbuf *b) {
  sb_add(b, "", 0);
  if (b->oom) {
    sb_free(b);
    return NULL;
  }
  char *s = b->p;
  memset(b, 0, sizeof *b);
  return chat_req_keep(r, s);
}

int chat_req_msg(chat_req *r, const char *role, const char *content, srv_error *e) {
  if (r->n_msgs == r->cap_msgs) {
    size_t nc = r->cap_msgs ? r->cap_msgs * 2 : 8;
    floe_chat_msg *nb = realloc(r->msgs, nc * sizeof *nb);
    if (!nb) return srv_fail(e, 500, NULL, NULL, "out of memory");
    r->msgs = nb;
    size_t *na = realloc(r->call_at, nc * sizeof *na);
    if (!na) return srv_fail(e, 500, NULL, NULL, "out of memory");
    r->call_at = na;
    r->cap_msgs = nc;
  }
  memset(&r->msgs[r->n_msgs], 0, sizeof r->msgs[0]);
  r->msgs[r->n_msgs].role = role;
  r->msgs[r->n_msgs].content = content;
  r->call_at[r->n_msgs] = r->n_calls;
  r->n_msgs++;
  return 0;
}

int chat_req_call(chat_req *r, const char *id, const char *name, const char *args, srv_error *e) {
  if (!r->n_msgs || strcmp(r->msgs[r->n_msgs - 1].role, "assistant"))
    return srv_fail(e, 500, NULL, NULL, "internal: a tool call outside an assistant message");
  if (r->n_calls == r->cap_calls) {
    size_t nc = r->cap_calls ? r->cap_calls * 2 : 8;
    floe_chat_tool_call *nb = realloc(r->calls, nc * sizeof *nb);
    if (!nb) return srv_fail(e, 500, NULL, NULL, "out of memory");
    r->calls = nb;
    r->cap_calls = nc;
  }
  r->calls[r->n_calls++] = (floe_chat_tool_call){id, name, args};
  r->msgs[r->n_msgs - 1].n_tool_calls++;
  return 0;
}

int chat_req_args(chat_req *r, const cJSON *args, const char *param, const char **out, srv_error *e) {
  *out = "{}";
  if (!args || cJSON_IsNull(args)) return 0;
  if (cJSON_IsString(args)) {
    cJSON *pj = cJSON_Parse(args->valuestring);
    bool obj = cJSON_IsObject(pj);
    cJSON_Delete(pj);
    if (!obj)
      return srv_fail(e, 400, "invalid_value", param, "tool-call arguments must be a JSON object encoded as a string");
    *out = args->valuestring;
    return 0;
  }
  if (!cJSON_IsObject(args))
    return srv_fail(e, 400, "invalid_type", param, "tool-call arguments must be an object or a JSON string");
  *out = chat_req_keep(r, cJSON_PrintUnformatted(args));
  return *out ? 0 : srv_fail(e, 500, NULL, NULL, "out of memory");
}

int chat_req_tools(chat_req *r, const cJSON *tools, const char *fn_type, const char *schema_key, srv_error *e) {
  if (!tools || cJSON_IsNull(tools)) return 0;
  if (!cJSON_IsArray(tools)) return srv_fail(e, 400, "invalid_type", "tools", "'tools' must be an array");
  const cJSON *t;
  cJSON_ArrayForEach(t, tools) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(t, "type");
    if (!cJSON_IsObject(t) || (type && !cJSON_IsString(type)))
      return srv_fail(e, 400, "invalid_value", "tools", "each tool must be an object (with a string type)");
    if (type && strcmp(type->valuestring, fn_type)) continue; /* hosted / provider tools: nothing here runs them */
    const cJSON *name = cJSON_GetObjectItemCaseSensitive(t, "name");
    if (chat_req_tool(r, cJSON_IsString(name) ? name->valuestring : NULL, cJSON_GetObjectItemCaseSensitive(t, "description"),
                      cJSON_GetObjectItemCaseSensitive(t, schema_key), "tools", e))
      return -1;
  }
  return 0;
}

int chat_req_tool(chat_req *r, const char *name, const cJSON *description, const cJSON *parameters,
                  const char *param, srv_error *e) {
  if (!name || !name[0]) return srv_fail(e, 400, "invalid_value", param, "every tool needs a name");
  if (description && !cJSON_IsNull(description) && !cJSON_IsString(description))
    return srv_fail(e, 400, "invalid_type", param, "tool '%s': description must be a string", name);
  if (parameters && !cJSON_IsNull(parameters) && !cJSON_IsObject(parameters))
    return srv_fail(e, 400, "invalid_type", param, "tool '%s': the parameters schema must be an object", name);
  if (!r->tools && !(r->tools = cJSON_CreateArray())) return srv_fail(e, 500, NULL, NULL, "out of memory");
  cJSON *t = cJSON_CreateObject(), *f = cJSON_AddObjectToObject(t, "function");
  cJSON_AddStringToObject(t, "type", "function");
  cJSON_AddStringToObject(f, "name", name);
  if (cJSON_IsString(description)) cJSON_AddStringToObject(f, "description", description->valuestring);
  if (cJSON_IsObject(parameters)) cJSON_AddItemToObject(f, "parameters", cJSON_Duplicate(parameters, true));
  cJSON_AddItemToArray(r->tools, t);
  return 0;
}

/* The conversation as the template sees it: tool-call pointers fixed, turns this server
 * generated replaced by the text the model sampled, and with join_system the leading system
 * messages joined into one (the Qwen3.5 template accepts one system message, first; Responses
 * clients send instructions and developer messages separately). */
static int chat_req_finish(srv *s, chat_req *r, srv_error *e) {
  for (size_t i = 0; i < r->n_msgs; i++) {
    floe_chat_msg *m = &r->msgs[i];
    m->tool_calls = m->n_tool_calls ? r->calls + r->call_at[i] : NULL;
    if (m->n_tool_calls && m->tool_calls[0].id) {
      char *raw = queue_lookup_turn(s->queue, m->tool_calls[0].id);
      if (raw) {
        if (!(m->content = chat_req_keep(r, raw))) return srv_fail(e, 500, NULL, NULL, "out of memory");
        m->reasoning = NULL;
        m->tool_calls = NULL;
        m->n_tool_calls = 0;
      }
    }
  }
  size_t k = 0;
  while (k < r->n_msgs && (!strcmp(r->msgs[k].role, "system") || !strcmp(r->msgs[k].role, "developer"))) k++;
  if (r->join_system && k > 1) {
    sbuf b = {0};
    for (size_t i = 0; i < k; i++) {
      if (!r->msgs[i].content || !r->msgs[i].content[0]) continue;
      if (b.n) sb_str(&b, "\n\n");
      sb_str(&b, r->msgs[i].content);
    }
    const char *joined = chat_req_join(r, &b);
    if (!joined) return srv_fail(e, 500, NULL, NULL, "out of memory");
    r->msgs[0].role = "system";
    r->msgs[0].content = joined;
    memmove(&r->msgs[1], &r->msgs[k], (r->n_msgs - k) * sizeof r->msgs[0]);
    r->n_msgs -= k - 1;
  }
  return 0;
}

/* Does the prompt end inside an open <think> block? */
static bool prompt_think_open(const char *t, size_t n) {
  const char *open = NULL, *close = NULL, *q = t;
  while ((q = memmem(q, n - (size_t)(q - t), "<think>", 7))) open = q++;
  q = t;
  while ((q = memmem(q, n - (size_t)(q - t), "</think>", 8))) close = q++;
  return open && (!close || close < open);
}

int chat_req_prompt(srv *s, chat_req *r, int32_t **ids, size_t *n, bool *think_open, srv_error *e) {
  *ids = NULL;
  *n = 0;
  if (chat_req_finish(s, r, e)) return -1;
  if (!r->n_msgs) return srv_fail(e, 400, "invalid_value", r->param, "the conversation is empty");
  char *tools_json = r->tools && cJSON_GetArraySize(r->tools) ? cJSON_PrintUnformatted(r->tools) : NULL;
  floe_chat_opts co = {.tools_json = tools_json, .add_generation_prompt = true, .enable_thinking = r->think};
  char err[512], *text = NULL;
  int rc = floe_chat_render(s->engine, r->msgs, r->n_msgs, &co, &text, err, sizeof err);
  free(tools_json);
  if (rc) {
    if (rc == FLOE_E_INVALID) return srv_fail(e, 400, "invalid_value", r->param, "%s", err);
    return srv_fail(e, 500, "template_error", NULL, "chat template: %s", err);
  }
  size_t tlen = strlen(text);
  if (think_open) *think_open = prompt_think_open(text, tlen);
  rc = queue_tokenize_prompt(s->queue, s->engine, text, tlen, ids, n, err, sizeof err);
  free(text);
  if (rc) return srv_fail(e, 500, NULL, NULL, "tokenizer: %s", err);
  return 0;
}

/* ---- chat_gen: the generation side ---- */
static void blk_switch(chat_gen *g, int kind) {
  if (g->blk_kind == kind && kind != OUTP_TOOL) return;
  if (g->blk_kind >= 0 && g->api->close) g->api->close(g);
  g->blk_kind = kind;
  g->n_blocks++;
  if (g->api->open) g->api->open(g);
}

static void sink_text(chat_gen *g, int kind, sbuf *all, const char *s, size_t n) {
  sb_add(all, s, n);
  if (!g->stream) return;
  blk_switch(g, kind);
  g->api->delta(g, s, n);
}
static void sink_content(void *u, const char *s, size_t n) { sink_text(u, OUTP_CONTENT, &((chat_gen *)u)->content, s, n); }
static void sink_reasoning(void *u, const char *s, size_t n) { sink_text(u, OUTP_REASONING, &((chat_gen *)u)->reasoning, s, n); }

static void sink_tool_start(void *u, int index, const char *id, const char *name) {
  chat_gen *g = u;
  (void)index; /* the parser numbers calls as we do */
  if (g->n_calls == g->cap_calls) {
    int nc = g->cap_calls ? g->cap_calls * 2 : 4;
    gen_call *nb = realloc(g->calls, (size_t)nc * sizeof *nb);
    if (!nb) return;
    g->calls = nb;
    g->cap_calls = nc;
  }
  gen_call *c = &g->calls[g->n_calls++];
  memset(c, 0, sizeof *c);
  snprintf(c->id, sizeof c->id, "%s", id);
  sb_str(&c->name, name);
  if (!g->stream) return;
  g->blk_call = g->n_calls - 1;
  blk_switch(g, OUTP_TOOL);
}

static void sink_tool_args(void *u, int index, const char *s, size_t n) {
  chat_gen *g = u;
  if (index < 0 || index >= g->n_calls) return;
  sb_add(&g->calls[index].args, s, n);
  if (g->stream && g->blk_kind == OUTP_TOOL && g->blk_call == index) g->api->delta(g, s, n);
}

static void gen_free(void *pp) {
  chat_gen *g = pp;
  if (g->api && g->api->free) g->api->free(g);
  outp_free(&g->parser);
  sb_free(&g->content);
  sb_free(&g->reasoning);
  for (int i = 0; i < g->n_calls; i++) {
    sb_free(&g->calls[i].name);
    sb_free(&g->calls[i].args);
  }
  free(g->calls);
  cJSON_Delete(g->tools);
  free(g);
}

static void gen_on_token(srv_job *j, const floe_token_event *ev) {
  chat_gen *g = j->proto;
  if (ev->id >= 0 && outp_mode(&g->parser) == OUTP_REASONING) g->n_reasoning++;
  if (g->api->token) g->api->token(g, ev);
  outp_feed(&g->parser, ev->text, ev->text_len);
  if (g->api->token_after) g->api->token_after(g, ev);
}

void chat_gen_sampled(const chat_gen *g, sbuf *out) {
  const srv_job *j = g->job;
  size_t n = j->n_sampled;
  while (n && floe_token_is_eog(g->e, j->sampled[n - 1])) n--;
  for (size_t i = 0; i < n; i++) {
    size_t pl;
    const char *pc = floe_token_piece(g->e, j->sampled[i], &pl);
    if (pc) sb_add(out, pc, pl);
  }
  sb_add(out, "", 0);
}

static void gen_on_done(srv_job *j, int rc, const floe_gen_result *res, const char *err) {
  chat_gen *g = j->proto;
  if (rc) {
    if (g->api->fail) g->api->fail(g, rc, err);
    else job_fail_generation(j, rc, err, g->api->param);
    return;
  }
  bool client_gone = res->finish == FLOE_FINISH_CANCELLED;
  outp_finish(&g->parser);
  if (g->stream && g->blk_kind >= 0 && g->api->close) g->api->close(g);
  g->blk_kind = -1;
  if (g->n_calls && !client_gone) { /* remember the turn as sampled, for its tool-call ids */
    sbuf t = {0};
    if (g->think_open) sb_str(&t, "<think>\n");
    chat_gen_sampled(g, &t);
    if (!t.oom && utf8_valid(t.p, t.n))
      for (int i = 0; i < g->n_calls; i++) queue_remember_turn(g->queue, g->calls[i].id, t.p);
    sb_free(&t);
  }
  if (g->verbose)
    fprintf(stderr, "floe serve: %s %s: prompt %lld (cached %lld), generated %lld, %.1f tok/s, %d tool call%s%s\n",
            g->api->name, g->id, (long long)res->n_prompt, (long long)res->n_reused, (long long)res->n_gen,
            res->decode_s > 0 && res->n_gen > 1 ? (double)(res->n_gen - 1) / res->decode_s : 0.0, g->n_calls,
            g->n_calls == 1 ? "" : "s", client_gone ? " (client gone)" : "");
  g->api->done(g, res);
}

static const srv_job_ops gen_ops = {gen_on_token, gen_on_done, gen_free};

chat_gen *chat_gen_new(srv *s, const chat_gen_api *api, const char *id_prefix) {
  chat_gen *g = calloc(1, sizeof *g);
  if (!g) return NULL;
  g->api = api;
  g->e = s->engine;
  g->queue = s->queue;
  g->verbose = s->o.verbose;
  g->created = (int64_t)time(NULL);
  g->blk_kind = -1;
  srv_rand_id(g->id, sizeof g->id, id_prefix, 24);
  snprintf(g->model, sizeof g->model, "%s", s->model_id);
  return g;
}

void chat_gen_attach(chat_gen *g, srv_job *j, chat_req *r, bool stream, bool think_open, int fd) {
  g->job = j;
  g->stream = stream;
  g->think_open = think_open;
  g->tools = r->tools;
  r->tools = NULL;
  g->n_prompt = (int64_t)j->n_ids;
  outp_sink sink = {g, sink_content, sink_reasoning, sink_tool_start, sink_tool_args};
  outp_init(&g->parser, r->parse_calls, stream, think_open, g->tools, sink);
  j->proto = g;
  j->ops = &gen_ops;
  j->stream = stream;
  j->fd = fd;
}

void chat_gen_discard(chat_gen *g) {
  if (g) gen_free(g);
}

const char *chat_gen_stop_hit(const chat_gen *g, const floe_gen_result *res) {
  const srv_job *j = g->job;
  if (res->finish != FLOE_FINISH_STOP || !j->n_stops) return NULL;
  if (j->n_sampled && floe_token_is_eog(g->e, j->sampled[j->n_sampled - 1])) return NULL;
  sbuf t = {0};
  chat_gen_sampled(g, &t);
  const char *best = NULL, *at = NULL;
  for (size_t i = 0; i < j->n_stops && t.p; i++) {
    const char *h = memmem(t.p, t.n, j->stops[i], strlen(j->stops[i]));
    if (h && (!at || h < at)) at = h, best = j->stops[i];
  }
  sb_free(&t);
  return best;
}

void chat_gen_event(chat_gen *g, const char *type, cJSON *ev, bool seq) {
  cJSON *o = cJSON_CreateObject();
  cJSON_AddStringToObject(o, "type", type);
  while (ev && ev->child) {
    cJSON *f = cJSON_DetachItemViaPointer(ev, ev->child);
    cJSON_AddItemToObject(o, f->string, f);
  }
  cJSON_Delete(ev);
  if (seq) cJSON_AddNumberToObject(o, "sequence_number", g->seq++);
  job_emit_named(g->job, type, o);
}

void chat_gen_submit(srv *s, chat_req *rq, srv_job *j, chat_gen *g, bool stream, int fd, srv_error *e, int shape,
                     srv_reply *r) {
  bool think_open = false;
  if (!e->status && !chat_req_prompt(s, rq, &j->ids, &j->n_ids, &think_open, e) &&
      !srv_check_context(s, j->n_ids, rq->param, e)) {
    chat_gen_attach(g, j, rq, stream, think_open, fd);
    if (stream && g->api->start) g->api->start(g); /* the opening events go out at once */
    g = NULL; /* the job's now */
    if (!srv_enqueue(s, j, e, r)) return;
  }
  srv_reply_error(r, e, shape);
  r->job = NULL;
  job_unref(j);
  chat_gen_discard(g);
}

/* ---- shared request pieces ---- */
int srv_parse_request(const char *body, size_t len, cJSON **out, srv_error *e) {
  *out = NULL;
  if (!utf8_valid(body, len)) return srv_fail(e, 400, "invalid_encoding", NULL, "the request body is not valid UTF-8");
  cJSON *req = cJSON_ParseWithLength(body, len);
  if (!req) return srv_fail(e, 400, "invalid_json", NULL, "the request body is not valid JSON");
  if (!cJSON_IsObject(req)) {
    cJSON_Delete(req);
    return srv_fail(e, 400, "invalid_json", NULL, "the request body must be a JSON object");
  }
  *out = req;
  return 0;
}

