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

#include "server/chat_gen.h"

/* The chat API's own state beside the shared chat_gen (g->user). */
typedef struct chat_api {
  bool include_usage, logprobs;
  cJSON *lp; /* logprob entries: all of them (non-streaming) or those not yet sent (streaming) */
} chat_api;

static void chat_api_free(chat_gen *g) {
  chat_api *c = g->user;
  if (c) cJSON_Delete(c->lp);
  free(c);
}

/* ---- streaming chunks ---- */
static cJSON *chunk_root(chat_gen *g) {
  return json_response_root(g->id, "chat.completion.chunk", g->created, g->model);
}

/* One chunk with a delta (taken) and an optional finish reason; carries pending logprobs. */
static void chunk(chat_gen *g, cJSON *delta, const char *finish) {
  chat_api *c = g->user;
  cJSON *root = chunk_root(g);
  cJSON *choices = cJSON_AddArrayToObject(root, "choices");
  cJSON *ch = cJSON_CreateObject();
  cJSON_AddItemToArray(choices, ch);
  cJSON_AddNumberToObject(ch, "index", 0);
  cJSON_AddItemToObject(ch, "delta", delta);
  if (c->logprobs && c->lp && cJSON_GetArraySize(c->lp) > 0) {
    cJSON *lo = cJSON_AddObjectToObject(ch, "logprobs");
    cJSON_AddItemToObject(lo, "content", c->lp);
    cJSON_AddNullToObject(lo, "refusal");
    c->lp = cJSON_CreateArray();
  } else {
    cJSON_AddNullToObject(ch, "logprobs");
  }
  if (finish) cJSON_AddStringToObject(ch, "finish_reason", finish);
  else cJSON_AddNullToObject(ch, "finish_reason");
  if (c->include_usage) cJSON_AddNullToObject(root, "usage");
  job_emit_event(g->job, root);
}

/* ---- blocks: content / reasoning deltas, tool calls by index ---- */
static cJSON *tool_delta(cJSON *d, int index) {
  cJSON *arr = cJSON_AddArrayToObject(d, "tool_calls"), *tc = cJSON_CreateObject();
  cJSON_AddItemToArray(arr, tc);
  cJSON_AddNumberToObject(tc, "index", index);
  return tc;
}

static void chat_open(chat_gen *g) {
  if (g->blk_kind != OUTP_TOOL) return;
  const gen_call *call = &g->calls[g->blk_call];
  cJSON *d = cJSON_CreateObject(), *tc = tool_delta(d, g->blk_call);
  cJSON_AddStringToObject(tc, "id", call->id);
  cJSON_AddStringToObject(tc, "type", "function");
  cJSON *f = cJSON_AddObjectToObject(tc, "function");
  cJSON_AddItemToObject(f, "name", json_str_n(call->name.p ? call->name.p : "", call->name.n));
  cJSON_AddStringToObject(f, "arguments", "");
  chunk(g, d, NULL);
}

static void chat_delta(chat_gen *g, const char *s, size_t n) {
  cJSON *d = cJSON_CreateObject();
  if (g->blk_kind == OUTP_TOOL) {
    cJSON *f = cJSON_AddObjectToObject(tool_delta(d, g->blk_call), "function");
    cJSON_AddItemToObject(f, "arguments", json_str_n(s, n));
  } else {
    cJSON_AddItemToObject(d, g->blk_kind == OUTP_REASONING ? "reasoning_content" : "content", json_str_n(s, n));
  }
  chunk(g, d, NULL);
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

static void chat_token(chat_gen *g, const floe_token_event *ev) {
  chat_api *c = g->user;
  if (!c->logprobs || ev->id < 0 || floe_token_is_eog(g->e, ev->id)) return;
  cJSON *t = lp_entry(g->e, ev->id, ev->logprob);
  cJSON *tops = cJSON_AddArrayToObject(t, "top_logprobs");
  for (int k = 0; k < ev->n_top && k < g->job->gp.n_top_logprobs; k++)
    if (ev->top_ids[k] >= 0) cJSON_AddItemToArray(tops, lp_entry(g->e, ev->top_ids[k], ev->top_logprobs[k]));
  cJSON_AddItemToArray(c->lp, t);
}

static void chat_token_after(chat_gen *g, const floe_token_event *ev) {
  chat_api *c = g->user;
  if (g->stream && c->logprobs && cJSON_GetArraySize(c->lp) > 0 && ev->text_len == 0 && ev->id >= 0 &&
      !floe_token_is_eog(g->e, ev->id))
    chunk(g, cJSON_CreateObject(), NULL); /* a token whose text is held back still reports its logprob */
}

static const char *finish_reason(const chat_gen *g, const floe_gen_result *res) {
  if (g->n_calls > 0) return "tool_calls";
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

static void chat_done(chat_gen *g, const floe_gen_result *res) {
  chat_api *c = g->user;
  const char *fr = finish_reason(g, res);
  if (g->stream) {
    chunk(g, cJSON_CreateObject(), fr);
    if (c->include_usage) {
      cJSON *root = chunk_root(g);
      cJSON_AddArrayToObject(root, "choices");
      cJSON_AddItemToObject(root, "usage", json_usage(res, g->n_reasoning));
      cJSON_AddItemToObject(root, "timings", timings(res));
      job_emit_event(g->job, root);
    }
    job_emit(g->job, "data: [DONE]\n\n", 14);
    return;
  }
  cJSON *root = json_response_root(g->id, "chat.completion", g->created, g->model);
  cJSON *choices = cJSON_AddArrayToObject(root, "choices"), *ch = cJSON_CreateObject();
  cJSON_AddItemToArray(choices, ch);
  cJSON_AddNumberToObject(ch, "index", 0);
  cJSON *msg = cJSON_AddObjectToObject(ch, "message");
  cJSON_AddStringToObject(msg, "role", "assistant");
  if (g->n_calls && g->content.n == 0) cJSON_AddNullToObject(msg, "content");
  else cJSON_AddItemToObject(msg, "content", json_str_n(g->content.p ? g->content.p : "", g->content.n));
  if (g->reasoning.n) cJSON_AddItemToObject(msg, "reasoning_content", json_str_n(g->reasoning.p, g->reasoning.n));
  cJSON_AddNullToObject(msg, "refusal");
  if (g->n_calls) {
    cJSON *arr = cJSON_AddArrayToObject(msg, "tool_calls");
    for (int i = 0; i < g->n_calls; i++) {
      const gen_call *call = &g->calls[i];
      cJSON *tc = cJSON_CreateObject();
      cJSON_AddItemToArray(arr, tc);
      cJSON_AddStringToObject(tc, "id", call->id);
      cJSON_AddStringToObject(tc, "type", "function");
      cJSON *f = cJSON_AddObjectToObject(tc, "function");
      cJSON_AddItemToObject(f, "name", json_str_n(call->name.p ? call->name.p : "", call->name.n));
      cJSON_AddItemToObject(f, "arguments", json_str_n(call->args.p ? call->args.p : "{}", call->args.p ? call->args.n : 2));
    }
  }
  if (c->logprobs) {
    cJSON *lo = cJSON_AddObjectToObject(ch, "logprobs");
    cJSON_AddItemToObject(lo, "content", c->lp);
    cJSON_AddNullToObject(lo, "refusal");
    c->lp = NULL;
  } else {
    cJSON_AddNullToObject(ch, "logprobs");
  }
  cJSON_AddStringToObject(ch, "finish_reason", fr);
  cJSON_AddItemToObject(root, "usage", json_usage(res, g->n_reasoning));
  cJSON_AddItemToObject(root, "timings", timings(res));
  job_emit_body(g->job, root);
}

/* the role chunk */
static void chat_start(chat_gen *g) {
  cJSON *d = cJSON_CreateObject();
  cJSON_AddStringToObject(d, "role", "assistant");
  cJSON_AddStringToObject(d, "content", "");
  chunk(g, d, NULL);
}

static const chat_gen_api chat_api_ops = {
    .name = "chat", .param = "messages", .start = chat_start, .open = chat_open, .delta = chat_delta, .token = chat_token,
    .token_after = chat_token_after, .done = chat_done, .free = chat_api_free};

/* ---- request parsing ---- */

/* content: string, null, or an array of {type:"text", text} parts. */
static int msg_content(chat_req *rq, const cJSON *c, const char **out, size_t idx, srv_error *e) {
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
  *out = chat_req_join(rq, &b);
  return *out ? 0 : srv_fail(e, 500, NULL, NULL, "out of memory");
}

static const char *str_field(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int parse_messages(const cJSON *msgs, chat_req *rq, srv_error *e) {
  if (!cJSON_IsArray(msgs)) return srv_fail(e, 400, "invalid_type", "messages", "'messages' must be an array");
  if (cJSON_GetArraySize(msgs) == 0) return srv_fail(e, 400, "invalid_value", "messages", "'messages' must not be empty");
  size_t i = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, msgs) {
    if (!cJSON_IsObject(m)) return srv_fail(e, 400, "invalid_type", "messages", "messages[%zu] must be an object", i);
    const char *role = str_field(m, "role");
    if (!role) return srv_fail(e, 400, "invalid_value", "messages", "messages[%zu].role must be a string", i);
    static const char *const roles[] = {"system", "user", "assistant", "tool"};
    const char *r = !strcmp(role, "developer") ? "system" : NULL;
    for (size_t k = 0; k < 4 && !r; k++)
      if (!strcmp(role, roles[k])) r = roles[k];
    if (!r) return srv_fail(e, 400, "invalid_value", "messages", "messages[%zu]: unknown role '%s'", i, role);
    const char *content;
    if (msg_content(rq, cJSON_GetObjectItemCaseSensitive(m, "content"), &content, i, e)) return -1;
    if (chat_req_msg(rq, r, content, e)) return -1;
    floe_chat_msg *x = &rq->msgs[rq->n_msgs - 1];
    const cJSON *rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning_content");
    if (!rc) rc = cJSON_GetObjectItemCaseSensitive(m, "reasoning");
    if (rc && !cJSON_IsNull(rc) && !cJSON_IsString(rc))
      return srv_fail(e, 400, "invalid_type", "messages", "messages[%zu].reasoning_content must be a string", i);
    if (cJSON_IsString(rc) && !strcmp(r, "assistant")) x->reasoning = rc->valuestring;
    if (!strcmp(r, "tool")) {
      x->tool_call_id = str_field(m, "tool_call_id");
      x->name = str_field(m, "name");
    }
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(m, "tool_calls");
    if (tcs && !cJSON_IsNull(tcs)) {
      if (!cJSON_IsArray(tcs) || strcmp(r, "assistant"))
        return srv_fail(e, 400, "invalid_value", "messages", "messages[%zu].tool_calls must be an array on an assistant message", i);
      const cJSON *tc;
      cJSON_ArrayForEach(tc, tcs) {
        const cJSON *f = cJSON_GetObjectItemCaseSensitive(tc, "function");
        const char *name = str_field(f, "name"), *args;
        if (!name) return srv_fail(e, 400, "invalid_value", "messages", "messages[%zu].tool_calls: function.name missing", i);
        if (chat_req_args(rq, cJSON_GetObjectItemCaseSensitive(f, "arguments"), "messages", &args, e) ||
            chat_req_call(rq, str_field(tc, "id"), name, args, e))
          return -1;
      }
    }
    x = &rq->msgs[rq->n_msgs - 1];
    if (!x->content && !x->n_tool_calls && strcmp(r, "assistant"))
      return srv_fail(e, 400, "invalid_value", "messages", "messages[%zu].content is missing", i);
    i++;
  }
  return 0;
}

static int parse_tools(const cJSON *req, chat_req *rq, srv_error *e) {
  rq->parse_calls = false;
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
  /* the request's own objects, as given: the template prints them */
  rq->tools = cJSON_Duplicate(tools, true);
  if (!rq->tools) return srv_fail(e, 500, NULL, NULL, "out of memory");
  rq->parse_calls = !none;
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

void openai_chat(srv *s, const char *body, size_t len, int fd, srv_reply *r) {
  srv_error e = {0};
  cJSON *req = NULL;
  chat_req rq = {.param = "messages"};
  srv_job *j = NULL;
  chat_gen *g = NULL;
  bool stream = false, include_usage = false, logprobs = false;

  if (srv_parse_request(body, len, &req, &e) || srv_check_model(s, req, &e)) goto fail;
  if (parse_messages(cJSON_GetObjectItemCaseSensitive(req, "messages"), &rq, &e)) goto fail;
  if (parse_tools(req, &rq, &e) || parse_thinking(req, &rq.think, &e)) goto fail;
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
  g = chat_gen_new(s, &chat_api_ops, "chatcmpl-");
  chat_api *c = g ? calloc(1, sizeof *c) : NULL;
  if (!j || !c) {
    srv_fail(&e, 500, NULL, NULL, "out of memory");
    goto fail;
  }
  g->user = c;
  c->include_usage = stream && include_usage;
  c->logprobs = logprobs;
  c->lp = cJSON_CreateArray();
  if (srv_parse_gen(s, req, j, &e)) goto fail;
  j->gp.logprobs = logprobs;
  j->gp.n_top_logprobs = logprobs ? (int)top : 0;
fail: /* the success path too: e.status is 0 there */
  chat_gen_submit(s, &rq, j, g, stream, fd, &e, SRV_ERR_OPENAI, r);
  cJSON_Delete(req);
  chat_req_free(&rq);
}
