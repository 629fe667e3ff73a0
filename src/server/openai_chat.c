/* POST /v1/chat/completions.
 *
 * Request -> floe_chat_msg list -> floe_chat_render (the model's own template family) -> prompt
 * ids (queue_tokenize_prompt, with sampled-token replay) -> a job. The worker feeds each token's
 * text to an output parser (output_parse.c) whose events become the message fields or, when
 * streaming, chat.completion.chunk events exactly as OpenAI sends them: a first chunk with the
 * role, content / reasoning_content / tool_calls deltas, a last chunk with finish_reason, an
 * optional usage chunk with "choices": [], then "data: [DONE]".
 *
 * Thinking: chat_template_kwargs.enable_thinking (vLLM / llama-server), or reasoning_effort
 * ("none" turns it off); default on. When the rendered prompt ends inside an open <think> block
 * (Qwen3.5's generation prompt), the reply starts as reasoning. */
#define _GNU_SOURCE /* memmem */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "server/output_parse.h"
#include "server/server.h"

typedef struct chat_call {
  char id[40];
  sbuf name, args;
} chat_call;

typedef struct chat_proto {
  char id[48];
  int64_t created;
  char model[256];
  const floe_engine *e;
  srv_job *job;
  bool stream, include_usage, logprobs;
  cJSON *tools; /* owned copy of the request's tools (schemas for typing) */
  outp parser;
  sbuf content, reasoning;
  chat_call *calls;
  int n_calls, cap_calls;
  cJSON *lp;       /* logprob entries: all of them (non-streaming) or those not yet sent (streaming) */
  int64_t n_reasoning;
  bool verbose;
  bool think_open; /* the prompt opened a <think> block */
  srv_queue *queue;
} chat_proto;

static void chat_free(void *pp) {
  chat_proto *p = pp;
  outp_free(&p->parser);
  sb_free(&p->content);
  sb_free(&p->reasoning);
  for (int i = 0; i < p->n_calls; i++) {
    sb_free(&p->calls[i].name);
    sb_free(&p->calls[i].args);
  }
  free(p->calls);
  cJSON_Delete(p->tools);
  cJSON_Delete(p->lp);
  free(p);
}

/* ---- streaming chunks ---- */
static cJSON *chunk_root(chat_proto *p) {
  return json_response_root(p->id, "chat.completion.chunk", p->created, p->model);
}

/* One chunk with a delta (taken) and an optional finish reason; carries pending logprobs. */
static void chunk(chat_proto *p, cJSON *delta, const char *finish) {
  cJSON *root = chunk_root(p);
  cJSON *choices = cJSON_AddArrayToObject(root, "choices");
  cJSON *ch = cJSON_CreateObject();
  cJSON_AddItemToArray(choices, ch);
  cJSON_AddNumberToObject(ch, "index", 0);
  cJSON_AddItemToObject(ch, "delta", delta);
  if (p->logprobs && p->lp && cJSON_GetArraySize(p->lp) > 0) {
    cJSON *lo = cJSON_AddObjectToObject(ch, "logprobs");
    cJSON_AddItemToObject(lo, "content", p->lp);
    cJSON_AddNullToObject(lo, "refusal");
    p->lp = cJSON_CreateArray();
  } else {
    cJSON_AddNullToObject(ch, "logprobs");
  }
  if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
  else cJSON_AddNullToObject(ch, "finish_reason");
  if (p->include_usage) cJSON_AddNullToObject(root, "usage");
  job_emit_event(p->job, root);
}

/* ---- parser sink ---- */
static void on_content(void *u, const char *s, size_t n) {
  chat_proto *p = u;
  sb_add(&p->content, s, n);
  if (!p->stream) return;
  cJSON *d = cJSON_CreateObject();
  cJSON_AddItemToObject(d, "content", json_str_n(s, n));
  chunk(p, d, NULL);
}

static void on_reasoning(void *u, const char *s, size_t n) {
  chat_proto *p = u;
  sb_add(&p->reasoning, s, n);
  if (!p->stream) return;
  cJSON *d = cJSON_CreateObject();
  cJSON_AddItemToObject(d, "reasoning_content", json_str_n(s, n));
  chunk(p, d, NULL);
}

static void on_tool_start(void *u, int index, const char *id, const char *name) {
  chat_proto *p = u;
  if (p->n_calls == p->cap_calls) {
    int nc = p->cap_calls ? p->cap_calls * 2 : 4;
    chat_call *nb = realloc(p->calls, (size_t)nc * sizeof *nb);
    if (!nb) return;
    p->calls = nb;
    p->cap_calls = nc;
  }
  chat_call *c = &p->calls[p->n_calls++];
  memset(c, 0, sizeof *c);
  snprintf(c->id, sizeof c->id, "%s", id);
  sb_str(&c->name, name);
  if (!p->stream) return;
  cJSON *d = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(d, "tool_calls"), *tc = cJSON_CreateObject();
  cJSON_AddItemToArray(arr, tc);
  cJSON_AddNumberToObject(tc, "index", index);
  cJSON_AddStringToObject(tc, "id", id);
  cJSON_AddStringToObject(tc, "type", "function");
  cJSON *f = cJSON_AddObjectToObject(tc, "function");
  cJSON_AddItemToObject(f, "name", json_str_n(name, strlen(name)));
  cJSON_AddStringToObject(f, "arguments", "");
  chunk(p, d, NULL);
}

static void on_tool_args(void *u, int index, const char *s, size_t n) {
  chat_proto *p = u;
  if (index < 0 || index >= p->n_calls) return;
  sb_add(&p->calls[index].args, s, n);
  if (!p->stream) return;
  cJSON *d = cJSON_CreateObject(), *arr = cJSON_AddArrayToObject(d, "tool_calls"), *tc = cJSON_CreateObject();
  cJSON_AddItemToArray(arr, tc);
  cJSON_AddNumberToObject(tc, "index", index);
  cJSON *f = cJSON_AddObjectToObject(tc, "function");
  cJSON_AddItemToObject(f, "arguments", json_str_n(s, n));
  chunk(p, d, NULL);
}

/* ---- logprobs ---- */
static cJSON *lp_entry(const floe_engine *e, int32_t id, float lp) {
  size_t n = 0;
  const char *pc = floe_token_piece(e, id, &n);
  if (!pc) pc = "", n = 0;
  cJSON *t = cJSON_CreateObject();
  cJSON_AddItemToObject(t, "token", json_str_n(pc, n));
  cJSON_AddNumberToObject(t, "logprob", isfinite(lp) ? lp : -9999.0);
  cJSON_AddItemToObject(t, "bytes", json_token_bytes(pc, n));
  return t;
}

static void chat_on_token(srv_job *j, const floe_token_event *ev) {
  chat_proto *p = j->proto;
  if (ev->id >= 0 && outp_mode(&p->parser) == OUTP_REASONING) p->n_reasoning++;
  if (p->logprobs && ev->id >= 0 && !floe_token_is_eog(p->e, ev->id)) {
    cJSON *t = lp_entry(p->e, ev->id, ev->logprob);
    cJSON *tops = cJSON_AddArrayToObject(t, "top_logprobs");
    for (int k = 0; k < ev->n_top && k < j->gp.n_top_logprobs; k++)
      if (ev->top_ids[k] >= 0) cJSON_AddItemToArray(tops, lp_entry(p->e, ev->top_ids[k], ev->top_logprobs[k]));
    cJSON_AddItemToArray(p->lp, t);
  }
  outp_feed(&p->parser, ev->text, ev->text_len);
  if (p->stream && p->logprobs && cJSON_GetArraySize(p->lp) > 0 && ev->text_len == 0 && ev->id >= 0 &&
      !floe_token_is_eog(p->e, ev->id))
    chunk(p, cJSON_CreateObject(), NULL); /* a token whose text is held back still reports its logprob */
}

static const char *finish_reason(const chat_proto *p, const floe_gen_result *res) {
  if (p->n_calls > 0) return "tool_calls";
  return res->finish == FLOE_FINISH_LENGTH ? "length" : "stop";
}

static cJSON *timings(const floe_gen_result *res) {
  cJSON *t = cJSON_CreateObject();
  cJSON_AddNumberToObject(t, "cache_n", (double)res->n_reused);
  cJSON_AddNumberToObject(t, "prompt_n", (double)(res->n_prompt - res->n_reused));
  cJSON_AddNumberToObject(t, "prompt_ms", res->prefill_s * 1e3);
  cJSON_AddNumberToObject(t, "prompt_per_second",
                          res->prefill_s > 0 ? (double)(res->n_prompt - res->n_reused) / res->prefill_s : 0);
  cJSON_AddNumberToObject(t, "predicted_n", (double)res->n_gen);
  cJSON_AddNumberToObject(t, "predicted_ms", res->decode_s * 1e3);
  cJSON_AddNumberToObject(t, "predicted_per_second",
                          res->decode_s > 0 && res->n_gen > 1 ? (double)(res->n_gen - 1) / res->decode_s : 0);
  return t;
}

static void chat_on_done(srv_job *j, int rc, const floe_gen_result *res, const char *err) {
  chat_proto *p = j->proto;
  bool client_gone = res->finish == FLOE_FINISH_CANCELLED;
  if (rc) {
    job_fail_generation(j, rc, err, "messages");
    return;
  }
  outp_finish(&p->parser);
  const char *fr = finish_reason(p, res);
  if (p->n_calls && !client_gone) { /* remember the turn as sampled, for its tool-call ids */
    sbuf t = {0};
    if (p->think_open) sb_str(&t, "<think>\n");
    size_t n = j->n_sampled;
    while (n && floe_token_is_eog(p->e, j->sampled[n - 1])) n--;
    for (size_t i = 0; i < n; i++) {
      size_t pl;
      const char *pc = floe_token_piece(p->e, j->sampled[i], &pl);
      if (pc) sb_add(&t, pc, pl);
    }
    sb_add(&t, "", 0);
    if (!t.oom && utf8_valid(t.p, t.n))
      for (int i = 0; i < p->n_calls; i++) queue_remember_turn(p->queue, p->calls[i].id, t.p);
    sb_free(&t);
  }
  if (p->verbose)
    fprintf(stderr, "floe serve: chat %s: prompt %lld (cached %lld), generated %lld, %.1f tok/s, finish %s%s\n", p->id,
            (long long)res->n_prompt, (long long)res->n_reused, (long long)res->n_gen,
            res->decode_s > 0 && res->n_gen > 1 ? (double)(res->n_gen - 1) / res->decode_s : 0.0, fr,
            client_gone ? " (client gone)" : "");
  if (p->stream) {
    chunk(p, cJSON_CreateObject(), fr);
    if (p->include_usage) {
      cJSON *root = chunk_root(p);
      cJSON_AddArrayToObject(root, "choices");
      cJSON_AddItemToObject(root, "usage", json_usage(res, p->n_reasoning));
      cJSON_AddItemToObject(root, "timings", timings(res));
      job_emit_event(j, root);
    }
    job_emit(j, "data: [DONE]\n\n", 14);
    return;
  }
  cJSON *root = json_response_root(p->id, "chat.completion", p->created, p->model);
  cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *ch = cJSON_CreateObject();
  cJSON_AddItemToArray(choices, ch);
  cJSON_AddNumberToObject(ch, "index", 0);
  cJSON *msg = cJSON_AddObjectToObject(ch, "message");
  cJSON_AddStringToObject(msg, "role", "assistant");
  if (p->n_calls && p->content.n == 0) cJSON_AddNullToObject(msg, "content");
  else cJSON_AddItemToObject(msg, "content", json_str_n(p->content.p ? p->content.p : "", p->content.n));
  if (p->reasoning.n) cJSON_AddItemToObject(msg, "reasoning_content", json_str_n(p->reasoning.p, p->reasoning.n));
  cJSON_AddNullToObject(msg, "refusal");
  if (p->n_calls) {
    cJSON *arr = cJSON_AddArrayToObject(msg, "tool_calls");
    for (int i = 0; i < p->n_calls; i++) {
      cJSON *tc = cJSON_CreateObject();
      cJSON_AddItemToArray(arr, tc);
      cJSON_AddStringToObject(tc, "id", p->calls[i].id);
      cJSON_AddStringToObject(tc, "type", "function");
      cJSON *f = cJSON_AddObjectToObject(tc, "function");
      cJSON_AddItemToObject(f, "name", json_str_n(p->calls[i].name.p ? p->calls[i].name.p : "", p->calls[i].name.n));
      cJSON_AddItemToObject(f, "arguments", json_str_n(p->calls[i].args.p ? p->calls[i].args.p : "{}",
                                                       p->calls[i].args.p ? p->calls[i].args.n : 2));
    }
  }
  if (p->logprobs) {
    cJSON *lo = cJSON_AddObjectToObject(ch, "logprobs");
    cJSON_AddItemToObject(lo, "content", p->lp);
    cJSON_AddNullToObject(lo, "refusal");
    p->lp = NULL;
  } else {
    cJSON_AddNullToObject(ch, "logprobs");
  }
  cJSON_AddStringToObject(ch, "finish_reason", fr);
  cJSON_AddItemToObject(root, "usage", json_usage(res, p->n_reasoning));
  cJSON_AddItemToObject(root, "timings", timings(res));
  job_emit_body(j, root);
}

static const srv_job_ops chat_ops = {chat_on_token, chat_on_done, chat_free};

/* ---- request parsing ---- */

/* Strings made for the messages (joined content parts, printed arguments), freed together. */
typedef struct strpool { char **v; size_t n, cap; } strpool;
static char *pool_keep(strpool *sp, char *s) {
  if (!s) return NULL;
  if (sp->n == sp->cap) {
    size_t nc = sp->cap ? sp->cap * 2 : 16;
    char **nb = realloc(sp->v, nc * sizeof *nb);
    if (!nb) {
      free(s);
      return NULL;
    }
    sp->v = nb;
    sp->cap = nc;
  }
  return sp->v[sp->n++] = s;
}
static void pool_free(strpool *sp) {
  for (size_t i = 0; i < sp->n; i++) free(sp->v[i]);
  free(sp->v);
}

/* content: string, null, or an array of {type:"text", text} parts. */
static int msg_content(const cJSON *c, strpool *sp, const char **out, size_t idx, srv_error *e) {
  *out = NULL;
  if (!c || cJSON_IsNull(c)) return 0;
  if (cJSON_IsString(c)) {
    *out = c->valuestring;
    return 0;
  }
  if (!cJSON_IsArray(c))
    return srv_fail(e, 400, "invalid_type", "messages", "messages[%zu].content must be a string or an array", idx);
  sbuf b = {0};
  const cJSON *part;
  cJSON_ArrayForEach(part, c) {
    const cJSON *type = cJSON_GetObjectItemCaseSensitive(part, "type");
    const cJSON *text = cJSON_GetObjectItemCaseSensitive(part, "text");
    if (cJSON_IsString(part)) {
      sb_str(&b, part->valuestring);
      continue;
    }
    if (!cJSON_IsString(type) || strcmp(type->valuestring, "text") || !cJSON_IsString(text)) {
      sb_free(&b);
      return srv_fail(e, 400, "invalid_value", "messages",
                      "messages[%zu].content: only text parts are supported", idx);
    }
    sb_str(&b, text->valuestring);
  }
  sb_add(&b, "", 0);
  if (b.oom) {
    sb_free(&b);
    return srv_fail(e, 500, NULL, NULL, "out of memory");
  }
  *out = pool_keep(sp, b.p);
  return *out ? 0 : srv_fail(e, 500, NULL, NULL, "out of memory");
}

static const char *str_field(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int parse_messages(srv *s, const cJSON *msgs, floe_chat_msg **out, size_t *n_out,
                          floe_chat_tool_call **calls_out, strpool *sp, srv_error *e) {
  *out = NULL;
  *calls_out = NULL;
  if (!cJSON_IsArray(msgs)) return srv_fail(e, 400, "invalid_type", "messages", "'messages' must be an array");
  size_t n = (size_t)cJSON_GetArraySize(msgs);
  if (n == 0) return srv_fail(e, 400, "invalid_value", "messages", "'messages' must not be empty");
  size_t n_calls = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, msgs) {
    const cJSON *tc = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (cJSON_IsArray(tc)) n_calls += (size_t)cJSON_GetArraySize(tc);
  }
  floe_chat_msg *v = calloc(n, sizeof *v);
  floe_chat_tool_call *calls = calloc(n_calls ? n_calls : 1, sizeof *calls);
  *out = v;
  *calls_out = calls;
  if (!v || !calls) return srv_fail(e, 500, NULL, NULL, "out of memory");
  size_t i = 0, ci = 0;
  cJSON_ArrayForEach(m, msgs) {
    if (!cJSON_IsObject(m)) return srv_fail(e, 400, "invalid_type", "messages", "messages[%zu] must be an object", i);
    const char *role = str_field(m, "role");
    if (!role) return srv_fail(e, 400, "invalid_value", "messages", "messages[%zu].role must be a string", i);
    bool known = !strcmp(role, "system") || !strcmp(role, "developer") || !strcmp(role, "user") ||
                 !strcmp(role, "assistant") || !strcmp(role, "tool");
    if (!known) return srv_fail(e, 400, "invalid_value", "messages", "messages[%zu]: unknown role '%s'", i, role);
    floe_chat_msg *x = &v[i];
    x->role = !strcmp(role, "developer") ? "system" : role;
    if (msg_content(cJSON_GetObjectItemCaseSensitive(m, "content"), sp, &x->content, i, e)) return -1;
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
    if (!rc) rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning");
    if (rc && !cJSON_IsNull(rc) && !cJSON_IsString(rc))
      return srv_fail(e, 400, "invalid_type", "messages", "messages[%zu].reasoning_content must be a string", i);
    if (cJSON_IsString(rc) && !strcmp(role, "assistant")) x->reasoning = rc->valuestring;
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (tcs && !cJSON_IsNull(tcs)) {
      if (!cJSON_IsArray(tcs) || strcmp(role, "assistant"))
        return srv_fail(e, 400, "invalid_value", "messages", "messages[%zu].tool_calls must be an array on an assistant message", i);
      x->tool_calls = calls + ci;
      const cJSON *tc;
      cJSON_ArrayForEach(tc, tcs) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const char *name = str_field(f, "name");
        const cJSON *args = cJSON_GetObjectItemCaseSensitive(f, "arguments");
        if (!name) return srv_fail(e, 400, "invalid_value", "messages", "messages[%zu].tool_calls: function.name missing", i);
        const char *atext = "{}";
        if (cJSON_IsString(args)) {
          cJSON *pj = cJSON_Parse(args->valuestring);
          bool obj = cJSON_IsObject(pj);
          cJSON_Delete(pj);
          if (!obj)
            return srv_fail(e, 400, "invalid_value", "messages",
                            "messages[%zu].tool_calls: arguments must be a JSON object encoded as a string", i);
          atext = args->valuestring;
        } else if (cJSON_IsObject(args)) {
          atext = pool_keep(sp, cJSON_PrintUnformatted(args));
          if (!atext) return srv_fail(e, 500, NULL, NULL, "out of memory");
        } else if (args && !cJSON_IsNull(args)) {
          return srv_fail(e, 400, "invalid_type", "messages", "messages[%zu].tool_calls: arguments must be a string", i);
        }
        calls[ci].id = str_field(tc, "id");
        calls[ci].name = name;
        calls[ci].arguments = atext;
        ci++;
        x->n_tool_calls++;
      }
    }
    if (x->n_tool_calls && x->tool_calls[0].id) {
      /* a turn this server generated: render it from the text the model sampled */
      char *raw = queue_lookup_turn(s->queue, x->tool_calls[0].id);
      if (raw) {
        x->content = pool_keep(sp, raw);
        if (!x->content) return srv_fail(e, 500, NULL, NULL, "out of memory");
        x->reasoning = NULL;
        x->tool_calls = NULL;
        x->n_tool_calls = 0;
      }
    }
    if (!strcmp(role, "tool")) {
      x->tool_call_id = str_field(m, "tool_call_id");
      x->name = str_field(m, "name");
    }
    if (!x->content && !x->n_tool_calls && strcmp(role, "assistant"))
      return srv_fail(e, 400, "invalid_value", "messages", "messages[%zu].content is missing", i);
    i++;
  }
  *n_out = n;
  return 0;
}

static int parse_tools(const cJSON *req, cJSON **tools_out, bool *parse_calls, srv_error *e) {
  *tools_out = NULL;
  *parse_calls = false;
  const cJSON *tools = cJSON_GetObjectItemCaseSensitive(req, "tools");
  if (!tools || cJSON_IsNull(tools)) return 0;
  if (!cJSON_IsArray(tools)) return srv_fail(e, 400, "invalid_type", "tools", "'tools' must be an array");
  const cJSON *t;
  cJSON_ArrayForEach(t, tools) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    const char *type = str_field(t, "type");
    if (!cJSON_IsObject(t) || (type && strcmp(type, "function")) || !cJSON_IsObject(f) || !str_field(f, "name"))
      return srv_fail(e, 400, "invalid_value", "tools", "each tool must be {\"type\":\"function\",\"function\":{\"name\":...}}");
    const cJSON *ps = cJSON_GetObjectItemCaseSensitive(f, "parameters");
    if (ps && !cJSON_IsObject(ps) && !cJSON_IsNull(ps))
      return srv_fail(e, 400, "invalid_type", "tools", "function.parameters must be an object");
  }
  if (cJSON_GetArraySize(tools) == 0) return 0;
  const cJSON *choice = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
  bool none = false;
  if (cJSON_IsString(choice)) {
    if (!strcmp(choice->valuestring, "none")) none = true;
    else if (strcmp(choice->valuestring, "auto") && strcmp(choice->valuestring, "required"))
      return srv_fail(e, 400, "invalid_value", "tool_choice", "tool_choice must be none, auto, required or a function");
  } else if (choice && !cJSON_IsNull(choice) && !cJSON_IsObject(choice)) {
    return srv_fail(e, 400, "invalid_type", "tool_choice", "tool_choice must be a string or an object");
  }
  *tools_out = cJSON_Duplicate(tools, true);
  if (!*tools_out) return srv_fail(e, 500, NULL, NULL, "out of memory");
  *parse_calls = !none;
  return 0;
}

static int parse_thinking(const cJSON *req, bool *think, srv_error *e) {
  *think = true;
  const cJSON *kw = cJSON_GetObjectItemCaseSensitive(req, "chat_template_kwargs");
  if (kw && !cJSON_IsNull(kw) && !cJSON_IsObject(kw))
    return srv_fail(e, 400, "invalid_type", "chat_template_kwargs", "'chat_template_kwargs' must be an object");
  const char *eff = str_field(req, "reasoning_effort");
  if (eff && !strcmp(eff, "none")) *think = false;
  if (json_opt_bool(req, "enable_thinking", think, e)) return -1;
  if (kw && json_opt_bool(kw, "enable_thinking", think, e)) return -1;
  return 0;
}

/* Does the prompt end inside an open <think> block? */
static bool think_open(const char *t, size_t n) {
  const char *open = NULL, *close = NULL, *q = t;
  while ((q = memmem(q, n - (size_t)(q - t), "<think>", 7))) open = q++;
  q = t;
  while ((q = memmem(q, n - (size_t)(q - t), "</think>", 8))) close = q++;
  return open && (!close || close < open);
}

void openai_chat(srv *s, const char *body, size_t len, int fd, srv_reply *r) {
  srv_error e = {0};
  cJSON *req = NULL, *tools = NULL;
  floe_chat_msg *msgs = NULL;
  floe_chat_tool_call *calls = NULL;
  strpool sp = {0};
  char *tools_json = NULL, *text = NULL;
  srv_job *j = NULL;
  chat_proto *p = NULL;

  if (!utf8_valid(body, len)) {
    srv_fail(&e, 400, "invalid_encoding", NULL, "the request body is not valid UTF-8");
    goto fail;
  }
  req = cJSON_ParseWithLength(body, len);
  if (!req) {
    srv_fail(&e, 400, "invalid_json", NULL, "the request body is not valid JSON");
    goto fail;
  }
  if (!cJSON_IsObject(req)) {
    srv_fail(&e, 400, "invalid_json", NULL, "the request body must be a JSON object");
    goto fail;
  }
  if (srv_check_model(s, req, &e)) goto fail;
  size_t n_msgs = 0;
  if (parse_messages(s, cJSON_GetObjectItemCaseSensitive(req, "messages"), &msgs, &n_msgs, &calls, &sp, &e)) goto fail;
  bool parse_calls, think, stream = false, include_usage = false, logprobs = false;
  if (parse_tools(req, &tools, &parse_calls, &e) || parse_thinking(req, &think, &e)) goto fail;
  if (json_opt_bool(req, "stream", &stream, &e) || json_opt_bool(req, "logprobs", &logprobs, &e)) goto fail;
  const cJSON *so = cJSON_GetObjectItemCaseSensitive(req, "stream_options");
  if (so && !cJSON_IsNull(so)) {
    if (!cJSON_IsObject(so)) {
      srv_fail(&e, 400, "invalid_type", "stream_options", "'stream_options' must be an object");
      goto fail;
    }
    if (json_opt_bool(so, "include_usage", &include_usage, &e)) goto fail;
  }
  double top = 0;
  bool have_top;
  if (json_opt_num(req, "top_logprobs", 0, 20, &top, &have_top, &e)) goto fail;
  if (have_top && top != floor(top)) {
    srv_fail(&e, 400, "invalid_value", "top_logprobs", "'top_logprobs' must be an integer");
    goto fail;
  }
  if (have_top && top > 0 && !logprobs) {
    srv_fail(&e, 400, "invalid_value", "top_logprobs", "'top_logprobs' requires 'logprobs': true");
    goto fail;
  }
  const cJSON *rf = cJSON_GetObjectItemCaseSensitive(req, "response_format");
  if (rf && !cJSON_IsNull(rf)) {
    const char *t = str_field(rf, "type");
    if (!t || strcmp(t, "text")) {
      srv_fail(&e, 400, "unsupported_value", "response_format", "only response_format {\"type\":\"text\"} is supported");
      goto fail;
    }
  }

  j = job_new(s);
  p = calloc(1, sizeof *p);
  if (!j || !p) {
    srv_fail(&e, 500, NULL, NULL, "out of memory");
    goto fail;
  }
  if (srv_parse_gen(s, req, j, &e)) goto fail;
  j->gp.logprobs = logprobs;
  j->gp.n_top_logprobs = logprobs ? (int)top : 0;

  if (tools) tools_json = cJSON_PrintUnformatted(tools);
  floe_chat_opts co = {.tools_json = tools_json, .add_generation_prompt = true, .enable_thinking = think};
  char err[512];
  int rc = floe_chat_render(s->engine, msgs, n_msgs, &co, &text, err, sizeof err);
  if (rc) {
    if (rc == FLOE_E_INVALID) srv_fail(&e, 400, "invalid_value", "messages", "%s", err);
    else srv_fail(&e, 500, "template_error", NULL, "chat template: %s", err);
    goto fail;
  }
  size_t tlen = strlen(text);
  if (queue_tokenize_prompt(s->queue, s->engine, text, tlen, &j->ids, &j->n_ids, err, sizeof err)) {
    srv_fail(&e, 500, NULL, NULL, "tokenizer: %s", err);
    goto fail;
  }
  if (srv_check_context(s, j->n_ids, "messages", &e)) goto fail;

  srv_rand_id(p->id, sizeof p->id, "chatcmpl-", 24);
  p->created = (int64_t)time(NULL);
  snprintf(p->model, sizeof p->model, "%s", s->model_id);
  p->e = s->engine;
  p->job = j;
  p->stream = stream;
  p->include_usage = stream && include_usage;
  p->logprobs = logprobs;
  p->tools = tools;
  tools = NULL;
  p->lp = cJSON_CreateArray();
  p->verbose = s->o.verbose;
  outp_sink sink = {p, on_content, on_reasoning, on_tool_start, on_tool_args};
  p->think_open = think_open(text, tlen);
  p->queue = s->queue;
  outp_init(&p->parser, parse_calls, stream, p->think_open, p->tools, sink);
  j->proto = p;
  j->ops = &chat_ops;
  p = NULL;
  j->stream = stream;
  j->fd = fd;
  if (stream) { /* the role chunk goes out at once */
    cJSON *d = cJSON_CreateObject();
    cJSON_AddStringToObject(d, "role", "assistant");
    cJSON_AddStringToObject(d, "content", "");
    chunk(j->proto, d, NULL);
  }
  if (srv_enqueue(s, j, &e, r)) {
    r->status = e.status;
    r->body = srv_error_json(&e);
    job_unref(j);
    j = NULL;
  }
  goto done;
fail:
  r->status = e.status ? e.status : 500;
  r->body = srv_error_json(&e);
  if (e.status == 503) r->retry_after = 1;
  job_unref(j);
  if (p) chat_free(p);
done:
  cJSON_Delete(tools);
  cJSON_Delete(req);
  free(msgs);
  free(calls);
  pool_free(&sp);
  free(tools_json);
  free(text);
}
