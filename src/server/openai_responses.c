/* POST /v1/responses: OpenAI's Responses API on the shared chat path (chat_gen.h).
 *
 * Request: `input` (a string, or items: messages with text parts, function_call,
 * function_call_output, reasoning), `instructions` (a system message first), function `tools`
 * (other tool types, e.g. hosted web search, are skipped: nothing here can run them),
 * `tool_choice` ("none" turns tool-call parsing off), `max_output_tokens`, `temperature`, `top_p`,
 * `reasoning.effort` ("none" turns thinking off), `stream`. Consecutive assistant messages and
 * function_call items form one assistant turn; a reasoning item belongs to the next one.
 * Nothing is stored: `previous_response_id` and item references are refused (400), the client
 * sends the whole conversation each time (as Codex does with store=false).
 *
 * Response: a "response" object whose output items are, in order, a reasoning item (the <think>
 * block, as reasoning_text content), a message (output_text), and one function_call item per
 * tool call. Streaming sends the typed events with sequence numbers: response.created,
 * response.in_progress, then per item output_item.added, content_part.added, output_text /
 * reasoning_text / function_call_arguments deltas and their .done, content_part.done,
 * output_item.done, and last response.completed (response.incomplete when max_output_tokens cut
 * the reply, response.failed when the generation failed). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/chat_gen.h"

typedef struct resp_api {
  cJSON *echo;      /* request fields every response object repeats (instructions, tools, ...) */
  cJSON *items;     /* streaming: the output items finished so far */
  sbuf text;        /* streaming: the open block's text */
  char item_id[48]; /* streaming: the open block's item id */
} resp_api;

static void resp_api_free(chat_gen *g) {
  resp_api *a = g->user;
  if (!a) return;
  cJSON_Delete(a->echo);
  cJSON_Delete(a->items);
  sb_free(&a->text);
  free(a);
}

static cJSON *resp_usage(const floe_gen_result *res, int64_t n_reasoning) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "input_tokens", (double)res->n_prompt);
  cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "input_tokens_details"), "cached_tokens", (double)res->n_reused);
  cJSON_AddNumberToObject(u, "output_tokens", (double)res->n_gen);
  cJSON_AddNumberToObject(cJSON_AddObjectToObject(u, "output_tokens_details"), "reasoning_tokens", (double)n_reasoning);
  cJSON_AddNumberToObject(u, "total_tokens", (double)(res->n_prompt + res->n_gen));
  return u;
}

/* The response object; output (taken) may be NULL (an empty list). */
static cJSON *resp_object(chat_gen *g, const char *status, cJSON *output, const floe_gen_result *res) {
  resp_api *a = g->user;
  cJSON *r = cJSON_CreateObject();
  cJSON_AddStringToObject(r, "id", g->id);
  cJSON_AddStringToObject(r, "object", "response");
  cJSON_AddNumberToObject(r, "created_at", (double)g->created);
  cJSON_AddStringToObject(r, "status", status);
  cJSON_AddNullToObject(r, "error");
  if (!strcmp(status, "incomplete"))
    cJSON_AddStringToObject(cJSON_AddObjectToObject(r, "incomplete_details"), "reason", "max_output_tokens");
  else cJSON_AddNullToObject(r, "incomplete_details");
  cJSON_AddStringToObject(r, "model", g->model);
  cJSON_AddItemToObject(r, "output", output ? output : cJSON_CreateArray());
  cJSON_AddBoolToObject(r, "parallel_tool_calls", true);
  cJSON_AddNullToObject(r, "previous_response_id");
  cJSON_AddBoolToObject(r, "store", false);
  cJSON_AddStringToObject(cJSON_AddObjectToObject(cJSON_AddObjectToObject(r, "text"), "format"), "type", "text");
  cJSON_AddStringToObject(r, "truncation", "disabled");
  cJSON_AddItemToObject(r, "metadata", cJSON_CreateObject());
  for (const cJSON *f = a->echo ? a->echo->child : NULL; f; f = f->next)
    cJSON_AddItemToObject(r, f->string, cJSON_Duplicate(f, true));
  if (res) cJSON_AddItemToObject(r, "usage", resp_usage(res, g->n_reasoning));
  else cJSON_AddNullToObject(r, "usage");
  return r;
}

static void resp_event(chat_gen *g, const char *type, cJSON *ev) { chat_gen_event(g, type, ev, true); }

/* ---- output items ---- */
static cJSON *text_part(const char *type, const char *s, size_t n) {
  cJSON *p = cJSON_CreateObject();
  cJSON_AddStringToObject(p, "type", type);
  cJSON_AddItemToObject(p, "text", json_str_n(s ? s : "", n));
  if (!strcmp(type, "output_text")) cJSON_AddItemToObject(p, "annotations", cJSON_CreateArray());
  return p;
}

static cJSON *reasoning_item(const char *id, const char *s, size_t n, bool done) {
  cJSON *it = cJSON_CreateObject();
  cJSON_AddStringToObject(it, "type", "reasoning");
  cJSON_AddStringToObject(it, "id", id);
  cJSON_AddItemToObject(it, "summary", cJSON_CreateArray());
  cJSON *c = cJSON_AddArrayToObject(it, "content");
  if (done) cJSON_AddItemToArray(c, text_part("reasoning_text", s, n));
  return it;
}

static cJSON *message_item(const char *id, const char *s, size_t n, bool done) {
  cJSON *it = cJSON_CreateObject();
  cJSON_AddStringToObject(it, "type", "message");
  cJSON_AddStringToObject(it, "id", id);
  cJSON_AddStringToObject(it, "status", done ? "completed" : "in_progress");
  cJSON_AddStringToObject(it, "role", "assistant");
  cJSON *c = cJSON_AddArrayToObject(it, "content");
  if (done) cJSON_AddItemToArray(c, text_part("output_text", s, n));
  return it;
}

static cJSON *call_item(const char *id, const gen_call *call, bool done) {
  cJSON *it = cJSON_CreateObject();
  cJSON_AddStringToObject(it, "type", "function_call");
  cJSON_AddStringToObject(it, "id", id);
  cJSON_AddStringToObject(it, "call_id", call->id);
  cJSON_AddItemToObject(it, "name", json_str_n(call->name.p ? call->name.p : "", call->name.n));
  if (done) cJSON_AddItemToObject(it, "arguments", json_str_n(call->args.p ? call->args.p : "{}", call->args.p ? call->args.n : 2));
  else cJSON_AddStringToObject(it, "arguments", "");
  cJSON_AddStringToObject(it, "status", done ? "completed" : "in_progress");
  return it;
}

/* The event fields that locate the open block. */
static cJSON *at_block(chat_gen *g, bool with_content) {
  resp_api *a = g->user;
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddStringToObject(ev, "item_id", a->item_id);
  cJSON_AddNumberToObject(ev, "output_index", g->n_blocks - 1);
  if (with_content) cJSON_AddNumberToObject(ev, "content_index", 0);
  return ev;
}

/* ---- streaming blocks ---- */
static void resp_open(chat_gen *g) {
  resp_api *a = g->user;
  a->text.n = 0;
  srv_rand_id(a->item_id, sizeof a->item_id,
              g->blk_kind == OUTP_TOOL ? "fc_" : g->blk_kind == OUTP_REASONING ? "rs_" : "msg_", 24);
  cJSON *item = g->blk_kind == OUTP_TOOL        ? call_item(a->item_id, &g->calls[g->blk_call], false)
                : g->blk_kind == OUTP_REASONING ? reasoning_item(a->item_id, NULL, 0, false)
                                                : message_item(a->item_id, NULL, 0, false);
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddNumberToObject(ev, "output_index", g->n_blocks - 1);
  cJSON_AddItemToObject(ev, "item", item);
  resp_event(g, "response.output_item.added", ev);
  if (g->blk_kind == OUTP_TOOL) return;
  ev = at_block(g, true);
  cJSON_AddItemToObject(ev, "part", text_part(g->blk_kind == OUTP_REASONING ? "reasoning_text" : "output_text", "", 0));
  resp_event(g, "response.content_part.added", ev);
}

static void resp_delta(chat_gen *g, const char *s, size_t n) {
  resp_api *a = g->user;
  bool tool = g->blk_kind == OUTP_TOOL;
  if (!tool) sb_add(&a->text, s, n);
  cJSON *ev = at_block(g, !tool);
  cJSON_AddItemToObject(ev, "delta", json_str_n(s, n));
  if (g->blk_kind == OUTP_CONTENT) cJSON_AddItemToObject(ev, "logprobs", cJSON_CreateArray());
  resp_event(g, tool ? "response.function_call_arguments.delta"
                : g->blk_kind == OUTP_REASONING ? "response.reasoning_text.delta"
                                                : "response.output_text.delta",
             ev);
}

static void resp_close(chat_gen *g) {
  resp_api *a = g->user;
  cJSON *item, *ev;
  if (g->blk_kind == OUTP_TOOL) {
    const gen_call *call = &g->calls[g->blk_call];
    ev = at_block(g, false);
    cJSON_AddItemToObject(ev, "name", json_str_n(call->name.p ? call->name.p : "", call->name.n));
    cJSON_AddItemToObject(ev, "arguments", json_str_n(call->args.p ? call->args.p : "{}", call->args.p ? call->args.n : 2));
    resp_event(g, "response.function_call_arguments.done", ev);
    item = call_item(a->item_id, call, true);
  } else {
    bool r = g->blk_kind == OUTP_REASONING;
    const char *pt = r ? "reasoning_text" : "output_text";
    ev = at_block(g, true);
    cJSON_AddItemToObject(ev, "text", json_str_n(a->text.p ? a->text.p : "", a->text.n));
    if (!r) cJSON_AddItemToObject(ev, "logprobs", cJSON_CreateArray());
    resp_event(g, r ? "response.reasoning_text.done" : "response.output_text.done", ev);
    ev = at_block(g, true);
    cJSON_AddItemToObject(ev, "part", text_part(pt, a->text.p, a->text.n));
    resp_event(g, "response.content_part.done", ev);
    item = r ? reasoning_item(a->item_id, a->text.p, a->text.n, true) : message_item(a->item_id, a->text.p, a->text.n, true);
  }
  cJSON_AddItemToArray(a->items, cJSON_Duplicate(item, true));
  ev = cJSON_CreateObject();
  cJSON_AddNumberToObject(ev, "output_index", g->n_blocks - 1);
  cJSON_AddItemToObject(ev, "item", item);
  resp_event(g, "response.output_item.done", ev);
}

static void resp_done(chat_gen *g, const floe_gen_result *res) {
  resp_api *a = g->user;
  const char *status = res->finish == FLOE_FINISH_LENGTH ? "incomplete" : "completed";
  cJSON *output;
  if (g->stream) {
    output = a->items;
    a->items = NULL;
  } else {
    output = cJSON_CreateArray();
    char id[48];
    if (g->reasoning.n) {
      srv_rand_id(id, sizeof id, "rs_", 24);
      cJSON_AddItemToArray(output, reasoning_item(id, g->reasoning.p, g->reasoning.n, true));
    }
    if (g->content.n || !g->n_calls) {
      srv_rand_id(id, sizeof id, "msg_", 24);
      cJSON_AddItemToArray(output, message_item(id, g->content.p, g->content.n, true));
    }
    for (int i = 0; i < g->n_calls; i++) {
      srv_rand_id(id, sizeof id, "fc_", 24);
      cJSON_AddItemToArray(output, call_item(id, &g->calls[i], true));
    }
  }
  cJSON *r = resp_object(g, status, output, res);
  if (!g->stream) {
    job_emit_body(g->job, r);
    return;
  }
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddItemToObject(ev, "response", r);
  resp_event(g, !strcmp(status, "incomplete") ? "response.incomplete" : "response.completed", ev);
}

static void resp_fail(chat_gen *g, int rc, const char *err) {
  if (!g->stream) {
    job_fail_generation(g->job, rc, err, "input");
    return;
  }
  cJSON *r = resp_object(g, "failed", NULL, NULL);
  cJSON_DeleteItemFromObject(r, "error");
  cJSON *eo = cJSON_AddObjectToObject(r, "error");
  cJSON_AddStringToObject(eo, "code", rc == FLOE_E_CONTEXT ? "context_length_exceeded" : "server_error");
  cJSON_AddItemToObject(eo, "message", json_str_n(err, strlen(err)));
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddItemToObject(ev, "response", r);
  resp_event(g, "response.failed", ev);
}

static void resp_start(chat_gen *g) {
  static const char *const ev_types[] = {"response.created", "response.in_progress"};
  for (int k = 0; k < 2; k++) {
    cJSON *ev = cJSON_CreateObject();
    cJSON_AddItemToObject(ev, "response", resp_object(g, "in_progress", NULL, NULL));
    resp_event(g, ev_types[k], ev);
  }
}

static const chat_gen_api resp_ops = {.name = "responses", .param = "input", .start = resp_start, .open = resp_open, .delta = resp_delta,
                                      .close = resp_close, .done = resp_done, .fail = resp_fail, .free = resp_api_free};

/* ---- request ---- */
static const char *str_field(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Text of a content value: a string or an array of text parts (input_text, output_text, text,
 * refusal, reasoning_text, summary_text). */
static int item_text(chat_req *rq, const cJSON *c, size_t idx, const char **out, srv_error *e) {
  *out = NULL;
  if (!c || cJSON_IsNull(c)) return 0;
  if (cJSON_IsString(c)) {
    *out = c->valuestring;
    return 0;
  }
  if (!cJSON_IsArray(c)) return srv_fail(e, 400, "invalid_type", "input", "input[%zu]: content must be a string or an array", idx);
  sbuf b = {0};
  const cJSON *p;
  cJSON_ArrayForEach(p, c) {
    const char *type = str_field(p, "type");
    const char *text = str_field(p, "text");
    if (type && !strcmp(type, "refusal")) text = str_field(p, "refusal");
    bool ok = type && text &&
              (!strcmp(type, "input_text") || !strcmp(type, "output_text") || !strcmp(type, "text") ||
               !strcmp(type, "refusal") || !strcmp(type, "reasoning_text") || !strcmp(type, "summary_text"));
    if (!ok) {
      sb_free(&b);
      return srv_fail(e, 400, "invalid_value", "input", "input[%zu]: content part of type '%s' is not supported (text only)",
                      idx, type ? type : "?");
    }
    if (b.n && (!strcmp(type, "summary_text"))) sb_str(&b, "\n\n");
    sb_str(&b, text);
  }
  *out = chat_req_join(rq, &b);
  return *out ? 0 : srv_fail(e, 500, NULL, NULL, "out of memory");
}

static int parse_input(const cJSON *req, chat_req *rq, srv_error *e) {
  const cJSON *ins = cJSON_GetObjectItemCaseSensitive(req, "instructions");
  if (ins && !cJSON_IsNull(ins)) {
    if (!cJSON_IsString(ins)) return srv_fail(e, 400, "invalid_type", "instructions", "'instructions' must be a string");
    if (chat_req_msg(rq, "system", ins->valuestring, e)) return -1;
  }
  const cJSON *in = cJSON_GetObjectItemCaseSensitive(req, "input");
  if (cJSON_IsString(in)) return chat_req_msg(rq, "user", in->valuestring, e);
  if (!cJSON_IsArray(in)) return srv_fail(e, 400, "invalid_type", "input", "'input' must be a string or an array of items");
  const char *pending_reasoning = NULL;
  bool in_turn = false; /* the last message is an assistant turn that a function_call continues */
  size_t i = 0;
  const cJSON *it;
  cJSON_ArrayForEach(it, in) {
    if (!cJSON_IsObject(it)) return srv_fail(e, 400, "invalid_type", "input", "input[%zu] must be an object", i);
    const char *type = str_field(it, "type");
    const char *role = str_field(it, "role");
    if (!type && role) type = "message";
    if (!type) return srv_fail(e, 400, "invalid_value", "input", "input[%zu] has no type", i);
    if (!strcmp(type, "message")) {
      const char *r = !role ? NULL
                      : !strcmp(role, "developer") || !strcmp(role, "system") ? "system"
                      : !strcmp(role, "user") ? "user"
                      : !strcmp(role, "assistant") ? "assistant" : NULL;
      if (!r) return srv_fail(e, 400, "invalid_value", "input", "input[%zu]: unknown role '%s'", i, role ? role : "");
      const char *text;
      if (item_text(rq, cJSON_GetObjectItemCaseSensitive(it, "content"), i, &text, e)) return -1;
      if (!text && strcmp(r, "assistant")) return srv_fail(e, 400, "invalid_value", "input", "input[%zu].content is missing", i);
      if (!strcmp(r, "assistant") && in_turn && !rq->msgs[rq->n_msgs - 1].n_tool_calls) {
        /* a second text item of one assistant turn */
        floe_chat_msg *x = &rq->msgs[rq->n_msgs - 1];
        sbuf b = {0};
        sb_str(&b, x->content ? x->content : "");
        sb_str(&b, text ? text : "");
        if (!(x->content = chat_req_join(rq, &b))) return srv_fail(e, 500, NULL, NULL, "out of memory");
      } else {
        if (chat_req_msg(rq, r, text, e)) return -1;
        if (!strcmp(r, "assistant")) rq->msgs[rq->n_msgs - 1].reasoning = pending_reasoning, pending_reasoning = NULL;
      }
      in_turn = !strcmp(r, "assistant");
    } else if (!strcmp(type, "function_call")) {
      const char *name = str_field(it, "name"), *call_id = str_field(it, "call_id"), *args;
      if (!name || !call_id) return srv_fail(e, 400, "invalid_value", "input", "input[%zu]: a function_call needs name and call_id", i);
      if (chat_req_args(rq, cJSON_GetObjectItemCaseSensitive(it, "arguments"), "input", &args, e)) return -1;
      if (!in_turn) {
        if (chat_req_msg(rq, "assistant", NULL, e)) return -1;
        rq->msgs[rq->n_msgs - 1].reasoning = pending_reasoning;
        pending_reasoning = NULL;
        in_turn = true;
      }
      if (chat_req_call(rq, call_id, name, args, e)) return -1;
    } else if (!strcmp(type, "function_call_output")) {
      const char *call_id = str_field(it, "call_id"), *out;
      if (!call_id) return srv_fail(e, 400, "invalid_value", "input", "input[%zu]: a function_call_output needs call_id", i);
      if (item_text(rq, cJSON_GetObjectItemCaseSensitive(it, "output"), i, &out, e)) return -1;
      if (chat_req_msg(rq, "tool", out ? out : "", e)) return -1;
      rq->msgs[rq->n_msgs - 1].tool_call_id = call_id;
      in_turn = false;
    } else if (!strcmp(type, "reasoning")) {
      const cJSON *c = cJSON_GetObjectItemCaseSensitive(it, "content");
      if (!cJSON_IsArray(c) || !cJSON_GetArraySize(c)) c = cJSON_GetObjectItemCaseSensitive(it, "summary");
      if (item_text(rq, c, i, &pending_reasoning, e)) return -1;
      /* a reasoning item inside a turn (before its function_call) belongs to that turn */
      if (in_turn && pending_reasoning && !rq->msgs[rq->n_msgs - 1].reasoning) {
        rq->msgs[rq->n_msgs - 1].reasoning = pending_reasoning;
        pending_reasoning = NULL;
      }
    } else if (!strcmp(type, "item_reference")) {
      return srv_fail(e, 400, "unsupported_value", "input",
                      "input[%zu]: item references need stored responses, which floe serve does not keep; send the items", i);
    } else {
      return srv_fail(e, 400, "unsupported_value", "input", "input[%zu]: items of type '%s' are not supported", i, type);
    }
    i++;
  }
  return 0;
}

static int parse_tools(const cJSON *req, chat_req *rq, srv_error *e) {
  if (chat_req_tools(rq, cJSON_GetObjectItemCaseSensitive(req, "tools"), "function", "parameters", e)) return -1;
  rq->parse_calls = rq->tools != NULL;
  const cJSON *choice = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
  if (cJSON_IsString(choice)) {
    if (!strcmp(choice->valuestring, "none")) rq->parse_calls = false;
    else if (strcmp(choice->valuestring, "auto") && strcmp(choice->valuestring, "required"))
      return srv_fail(e, 400, "invalid_value", "tool_choice", "tool_choice must be none, auto, required or an object");
  } else if (choice && !cJSON_IsNull(choice) && !cJSON_IsObject(choice)) {
    return srv_fail(e, 400, "invalid_type", "tool_choice", "tool_choice must be a string or an object");
  }
  return 0;
}

void openai_responses(srv *s, const char *body, size_t len, int fd, srv_reply *r) {
  srv_error e = {0};
  cJSON *req = NULL;
  chat_req rq = {.param = "input", .think = true, .join_system = true};
  srv_job *j = NULL;
  chat_gen *g = NULL;
  bool stream = false;

  if (srv_parse_request(body, len, &req, &e) || srv_check_model(s, req, &e)) goto fail;
  const cJSON *prev = cJSON_GetObjectItemCaseSensitive(req, "previous_response_id");
  if (prev && !cJSON_IsNull(prev)) {
    srv_fail(&e, 400, "unsupported_parameter", "previous_response_id",
             "previous_response_id is not supported: floe serve stores no responses; send the whole conversation in 'input'");
    goto fail;
  }
  if (parse_input(req, &rq, &e) || parse_tools(req, &rq, &e) || json_opt_bool(req, "stream", &stream, &e)) goto fail;
  const cJSON *rs = cJSON_GetObjectItemCaseSensitive(req, "reasoning");
  if (rs && !cJSON_IsNull(rs) && !cJSON_IsObject(rs)) {
    srv_fail(&e, 400, "invalid_type", "reasoning", "'reasoning' must be an object");
    goto fail;
  }
  const char *effort = str_field(rs, "effort");
  if (effort && !strcmp(effort, "none")) rq.think = false;

  j = job_new(s);
  g = chat_gen_new(s, &resp_ops, "resp_");
  resp_api *a = g ? calloc(1, sizeof *a) : NULL;
  if (!j || !a) {
    srv_fail(&e, 500, NULL, NULL, "out of memory");
    goto fail;
  }
  g->user = a;
  a->items = cJSON_CreateArray();
  a->echo = cJSON_CreateObject();
  if (srv_parse_gen(s, req, j, &e)) goto fail;
  double v;
  bool have;
  if (json_opt_num(req, "max_output_tokens", 1, 1e12, &v, &have, &e)) goto fail;
  if (have) j->gp.max_tokens = (int64_t)v;
  /* echoed as given (null when absent) */
  static const char *const echo[] = {"instructions", "max_output_tokens", "temperature", "top_p", "tool_choice", "tools", "reasoning"};
  for (size_t k = 0; k < sizeof echo / sizeof echo[0]; k++) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(req, echo[k]);
    cJSON_AddItemToObject(a->echo, echo[k], f ? cJSON_Duplicate(f, true) : cJSON_CreateNull());
  }
fail: /* the success path too: e.status is 0 there */
  chat_gen_submit(s, &rq, j, g, stream, fd, &e, SRV_ERR_OPENAI, r);
  cJSON_Delete(req);
  chat_req_free(&rq);
}
