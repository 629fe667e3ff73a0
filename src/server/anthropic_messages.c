/* POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API on the shared chat
 * path (chat_gen.h).
 *
 * Request: `system` (a string or text blocks; messages with role "system" join it), `messages` whose content is a string or blocks:
 * text, tool_use (assistant), tool_result (user; each becomes a tool message, in order with the
 * user's text), thinking (assistant reasoning; redacted_thinking is dropped); `tools` (name,
 * description, input_schema; Anthropic-defined tool types are skipped), `tool_choice` (auto, any,
 * tool: parsed; none: not parsed), `thinking` ({"type":"disabled"} turns the model's thinking
 * off; otherwise it follows the template's default, on), `max_tokens`, `stop_sequences`,
 * `temperature`, `top_p`, `top_k`, `stream`. Images and documents are refused (text only).
 *
 * Response: a "message" whose content blocks are, in order, thinking (the <think> block; the
 * signature is empty: nothing here signs), text, and one tool_use per call; stop_reason tool_use,
 * max_tokens, stop_sequence (with the string) or end_turn; usage counts prompt tokens served
 * from the prefix cache as cache_read_input_tokens. Streaming: message_start, ping, per block
 * content_block_start / content_block_delta (text_delta, thinking_delta, input_json_delta with
 * the arguments as they are parsed) / content_block_stop, then message_delta and message_stop.
 * Errors have Anthropic's shape ({"type":"error","error":{"type","message"}}), as an `error`
 * event when streaming. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/chat_gen.h"

static void msg_event(chat_gen *g, const char *type, cJSON *ev) { chat_gen_event(g, type, ev, false); }

static cJSON *block_index(chat_gen *g) {
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddNumberToObject(ev, "index", g->n_blocks - 1);
  return ev;
}

static cJSON *tool_use_block(const gen_call *c, bool with_input) {
  cJSON *b = cJSON_CreateObject();
  cJSON_AddStringToObject(b, "type", "tool_use");
  cJSON_AddStringToObject(b, "id", c->id);
  cJSON_AddItemToObject(b, "name", json_str_n(c->name.p ? c->name.p : "", c->name.n));
  cJSON *in = with_input && c->args.p ? cJSON_ParseWithLength(c->args.p, c->args.n) : NULL;
  if (!cJSON_IsObject(in)) {
    cJSON_Delete(in);
    in = cJSON_CreateObject();
  }
  cJSON_AddItemToObject(b, "input", in);
  return b;
}

/* ---- streaming blocks ---- */
static void msg_open(chat_gen *g) {
  cJSON *ev = block_index(g), *b;
  if (g->blk_kind == OUTP_TOOL) {
    b = tool_use_block(&g->calls[g->blk_call], false);
  } else {
    b = cJSON_CreateObject();
    bool r = g->blk_kind == OUTP_REASONING;
    cJSON_AddStringToObject(b, "type", r ? "thinking" : "text");
    cJSON_AddStringToObject(b, r ? "thinking" : "text", "");
    if (r) cJSON_AddStringToObject(b, "signature", "");
  }
  cJSON_AddItemToObject(ev, "content_block", b);
  msg_event(g, "content_block_start", ev);
}

static void msg_delta(chat_gen *g, const char *s, size_t n) {
  cJSON *ev = block_index(g), *d = cJSON_AddObjectToObject(ev, "delta");
  const char *type = g->blk_kind == OUTP_TOOL ? "input_json_delta" : g->blk_kind == OUTP_REASONING ? "thinking_delta" : "text_delta";
  const char *field = g->blk_kind == OUTP_TOOL ? "partial_json" : g->blk_kind == OUTP_REASONING ? "thinking" : "text";
  cJSON_AddStringToObject(d, "type", type);
  cJSON_AddItemToObject(d, field, json_str_n(s, n));
  msg_event(g, "content_block_delta", ev);
}

static void msg_close(chat_gen *g) { msg_event(g, "content_block_stop", block_index(g)); }

static cJSON *msg_usage(const floe_gen_result *res) {
  cJSON *u = cJSON_CreateObject();
  cJSON_AddNumberToObject(u, "input_tokens", (double)(res->n_prompt - res->n_reused));
  cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
  cJSON_AddNumberToObject(u, "cache_read_input_tokens", (double)res->n_reused);
  cJSON_AddNumberToObject(u, "output_tokens", (double)res->n_gen);
  return u;
}

/* The message object; content (taken) NULL: an empty list. */
static cJSON *msg_object(chat_gen *g, cJSON *content, const char *stop_reason, const char *stop_seq,
                         const floe_gen_result *res) {
  cJSON *m = cJSON_CreateObject();
  cJSON_AddStringToObject(m, "id", g->id);
  cJSON_AddStringToObject(m, "type", "message");
  cJSON_AddStringToObject(m, "role", "assistant");
  cJSON_AddStringToObject(m, "model", g->model);
  cJSON_AddItemToObject(m, "content", content ? content : cJSON_CreateArray());
  if (stop_reason) cJSON_AddStringToObject(m, "stop_reason", stop_reason);
  else cJSON_AddNullToObject(m, "stop_reason");
  if (stop_seq) cJSON_AddItemToObject(m, "stop_sequence", json_str_n(stop_seq, strlen(stop_seq)));
  else cJSON_AddNullToObject(m, "stop_sequence");
  if (res) {
    cJSON_AddItemToObject(m, "usage", msg_usage(res));
  } else { /* message_start: the prompt is known, the cache split not yet */
    cJSON *u = cJSON_AddObjectToObject(m, "usage");
    cJSON_AddNumberToObject(u, "input_tokens", (double)g->n_prompt);
    cJSON_AddNumberToObject(u, "cache_creation_input_tokens", 0);
    cJSON_AddNumberToObject(u, "cache_read_input_tokens", 0);
    cJSON_AddNumberToObject(u, "output_tokens", 0);
  }
  return m;
}

static void msg_done(chat_gen *g, const floe_gen_result *res) {
  const char *seq = chat_gen_stop_hit(g, res);
  const char *reason = g->n_calls ? "tool_use" : res->finish == FLOE_FINISH_LENGTH ? "max_tokens" : seq ? "stop_sequence" : "end_turn";
  if (g->n_calls) seq = NULL;
  if (g->stream) {
    cJSON *ev = cJSON_CreateObject(), *d = cJSON_AddObjectToObject(ev, "delta");
    cJSON_AddStringToObject(d, "stop_reason", reason);
    if (seq) cJSON_AddItemToObject(d, "stop_sequence", json_str_n(seq, strlen(seq)));
    else cJSON_AddNullToObject(d, "stop_sequence");
    cJSON_AddItemToObject(ev, "usage", msg_usage(res));
    msg_event(g, "message_delta", ev);
    msg_event(g, "message_stop", cJSON_CreateObject());
    return;
  }
  cJSON *content = cJSON_CreateArray();
  if (g->reasoning.n) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "thinking");
    cJSON_AddItemToObject(b, "thinking", json_str_n(g->reasoning.p, g->reasoning.n));
    cJSON_AddStringToObject(b, "signature", "");
    cJSON_AddItemToArray(content, b);
  }
  if (g->content.n) {
    cJSON *b = cJSON_CreateObject();
    cJSON_AddStringToObject(b, "type", "text");
    cJSON_AddItemToObject(b, "text", json_str_n(g->content.p, g->content.n));
    cJSON_AddItemToArray(content, b);
  }
  for (int i = 0; i < g->n_calls; i++) cJSON_AddItemToArray(content, tool_use_block(&g->calls[i], true));
  job_emit_body(g->job, msg_object(g, content, reason, seq, res));
}

static void msg_start(chat_gen *g) {
  cJSON *ev = cJSON_CreateObject();
  cJSON_AddItemToObject(ev, "message", msg_object(g, NULL, NULL, NULL, NULL));
  msg_event(g, "message_start", ev);
  msg_event(g, "ping", cJSON_CreateObject());
}

static const chat_gen_api msg_ops = {.name = "messages", .param = "messages", .start = msg_start, .open = msg_open, .delta = msg_delta,
                                     .close = msg_close, .done = msg_done};

/* ---- request ---- */
static const char *str_field(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* A string, or text blocks joined. */
static int text_of(chat_req *rq, const cJSON *c, const char *what, const char **out, srv_error *e) {
  *out = NULL;
  if (!c || cJSON_IsNull(c)) return 0;
  if (cJSON_IsString(c)) {
    *out = c->valuestring;
    return 0;
  }
  if (!cJSON_IsArray(c)) return srv_fail(e, 400, "invalid_type", NULL, "%s must be a string or an array of blocks", what);
  sbuf b = {0};
  const cJSON *blk;
  cJSON_ArrayForEach(blk, c) {
    const char *type = str_field(blk, "type"), *text = str_field(blk, "text");
    if (!type || strcmp(type, "text") || !text) {
      sb_free(&b);
      return srv_fail(e, 400, "invalid_value", NULL, "%s: blocks of type '%s' are not supported (text only)", what,
                      type ? type : "?");
    }
    sb_str(&b, text);
  }
  *out = chat_req_join(rq, &b);
  return *out ? 0 : srv_fail(e, 500, NULL, NULL, "out of memory");
}

/* A user message: text blocks gather into user messages, each tool_result is a tool message. */
static int user_blocks(chat_req *rq, const cJSON *c, size_t idx, srv_error *e) {
  sbuf text = {0};
  bool have_text = false;
  const cJSON *blk;
  cJSON_ArrayForEach(blk, c) {
    const char *type = str_field(blk, "type");
    if (type && !strcmp(type, "text") && str_field(blk, "text")) {
      sb_str(&text, str_field(blk, "text"));
      have_text = true;
      continue;
    }
    if (!type || strcmp(type, "tool_result")) {
      sb_free(&text);
      return srv_fail(e, 400, "invalid_value", NULL, "messages[%zu]: user blocks of type '%s' are not supported", idx,
                      type ? type : "?");
    }
    if (have_text) {
      const char *t = chat_req_join(rq, &text);
      if (!t || chat_req_msg(rq, "user", t, e)) return t ? -1 : srv_fail(e, 500, NULL, NULL, "out of memory");
      have_text = false;
    }
    const char *id = str_field(blk, "tool_use_id"), *out;
    if (!id) return srv_fail(e, 400, "invalid_value", NULL, "messages[%zu]: tool_result needs tool_use_id", idx);
    char what[64];
    snprintf(what, sizeof what, "messages[%zu]: tool_result content", idx);
    if (text_of(rq, cJSON_GetObjectItemCaseSensitive(blk, "content"), what, &out, e)) return -1;
    if (cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(blk, "is_error"))) {
      sbuf b = {0};
      sb_str(&b, "Error: ");
      sb_str(&b, out ? out : "");
      if (!(out = chat_req_join(rq, &b))) return srv_fail(e, 500, NULL, NULL, "out of memory");
    }
    if (chat_req_msg(rq, "tool", out ? out : "", e)) return -1;
    rq->msgs[rq->n_msgs - 1].tool_call_id = id;
  }
  if (have_text) {
    const char *t = chat_req_join(rq, &text);
    if (!t) return srv_fail(e, 500, NULL, NULL, "out of memory");
    return chat_req_msg(rq, "user", t, e);
  }
  sb_free(&text);
  return 0;
}

static int assistant_blocks(chat_req *rq, const cJSON *c, size_t idx, srv_error *e) {
  sbuf text = {0}, think = {0};
  if (chat_req_msg(rq, "assistant", NULL, e)) return -1;
  size_t at = rq->n_msgs - 1;
  const cJSON *blk;
  int rc = 0;
  cJSON_ArrayForEach(blk, c) {
    const char *type = str_field(blk, "type");
    if (type && !strcmp(type, "text") && str_field(blk, "text")) sb_str(&text, str_field(blk, "text"));
    else if (type && !strcmp(type, "thinking") && str_field(blk, "thinking")) sb_str(&think, str_field(blk, "thinking"));
    else if (type && !strcmp(type, "redacted_thinking")) continue;
    else if (type && !strcmp(type, "tool_use")) {
      const char *id = str_field(blk, "id"), *name = str_field(blk, "name"), *args;
      if (!id || !name) {
        rc = srv_fail(e, 400, "invalid_value", NULL, "messages[%zu]: tool_use needs id and name", idx);
        break;
      }
      if ((rc = chat_req_args(rq, cJSON_GetObjectItemCaseSensitive(blk, "input"), NULL, &args, e)) ||
          (rc = chat_req_call(rq, id, name, args, e)))
        break;
    } else {
      rc = srv_fail(e, 400, "invalid_value", NULL, "messages[%zu]: assistant blocks of type '%s' are not supported", idx,
                    type ? type : "?");
      break;
    }
  }
  if (!rc && text.n && !(rq->msgs[at].content = chat_req_join(rq, &text))) rc = srv_fail(e, 500, NULL, NULL, "out of memory");
  if (!rc && think.n && !(rq->msgs[at].reasoning = chat_req_join(rq, &think))) rc = srv_fail(e, 500, NULL, NULL, "out of memory");
  sb_free(&text);
  sb_free(&think);
  return rc;
}

/* The system prompt: `system`, then the text of any message with role "system" (newer clients
 * send some context that way, mid-conversation; the Qwen3.5 template takes one system message,
 * first, so their text joins the system prompt). */
static int system_prompt(chat_req *rq, const cJSON *req, const cJSON *msgs, srv_error *e) {
  const char *sys;
  if (text_of(rq, cJSON_GetObjectItemCaseSensitive(req, "system"), "system", &sys, e)) return -1;
  sbuf b = {0};
  if (sys) sb_str(&b, sys);
  const cJSON *m;
  cJSON_ArrayForEach(m, msgs) {
    const char *role = str_field(m, "role"), *t;
    if (!role || strcmp(role, "system")) continue;
    if (text_of(rq, cJSON_GetObjectItemCaseSensitive(m, "content"), "a system message", &t, e)) {
      sb_free(&b);
      return -1;
    }
    if (!t || !t[0]) continue;
    if (b.n) sb_str(&b, "\n\n");
    sb_str(&b, t);
  }
  if (!b.n) { /* an empty `system` still allocated b (fuzz_server_request found the leak) */
    sb_free(&b);
    return 0;
  }
  const char *all = chat_req_join(rq, &b);
  if (!all) return srv_fail(e, 500, NULL, NULL, "out of memory");
  return chat_req_msg(rq, "system", all, e);
}

static int parse_request(const cJSON *req, chat_req *rq, srv_error *e) {
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(req, "messages");
  if (!cJSON_IsArray(msgs) || !cJSON_GetArraySize(msgs))
    return srv_fail(e, 400, "invalid_value", "messages", "'messages' must be a non-empty array");
  if (system_prompt(rq, req, msgs, e)) return -1;
  size_t i = 0;
  const cJSON *m;
  cJSON_ArrayForEach(m, msgs) {
    const char *role = str_field(m, "role");
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(m, "content");
    bool user = role && !strcmp(role, "user");
    if (role && !strcmp(role, "system")) { /* in the system prompt */
      i++;
      continue;
    }
    if (!role || (!user && strcmp(role, "assistant")))
      return srv_fail(e, 400, "invalid_value", "messages", "messages[%zu].role must be user, assistant or system", i);
    if (cJSON_IsString(c)) {
      if (chat_req_msg(rq, user ? "user" : "assistant", c->valuestring, e)) return -1;
    } else if (cJSON_IsArray(c)) {
      if (user ? user_blocks(rq, c, i, e) : assistant_blocks(rq, c, i, e)) return -1;
    } else {
      return srv_fail(e, 400, "invalid_type", "messages", "messages[%zu].content must be a string or an array of blocks", i);
    }
    i++;
  }
  if (chat_req_tools(rq, cJSON_GetObjectItemCaseSensitive(req, "tools"), "custom", "input_schema", e)) return -1;
  rq->parse_calls = rq->tools != NULL;
  const cJSON *choice = cJSON_GetObjectItemCaseSensitive(req, "tool_choice");
  if (choice && !cJSON_IsNull(choice)) {
    const char *ct = str_field(choice, "type");
    if (!ct || (strcmp(ct, "auto") && strcmp(ct, "any") && strcmp(ct, "tool") && strcmp(ct, "none")))
      return srv_fail(e, 400, "invalid_value", "tool_choice", "tool_choice.type must be auto, any, tool or none");
    if (!strcmp(ct, "none")) rq->parse_calls = false;
  }
  const cJSON *th = cJSON_GetObjectItemCaseSensitive(req, "thinking");
  if (th && !cJSON_IsNull(th)) {
    const char *tt = str_field(th, "type");
    if (!tt) return srv_fail(e, 400, "invalid_value", "thinking", "thinking.type must be enabled, disabled or adaptive");
    if (!strcmp(tt, "disabled")) rq->think = false;
  }
  return 0;
}

void anthropic_messages(srv *s, const char *body, size_t len, int fd, srv_reply *r) {
  srv_error e = {0};
  cJSON *req = NULL;
  chat_req rq = {.param = "messages", .think = true};
  srv_job *j = NULL;
  chat_gen *g = NULL;
  bool stream = false;

  if (srv_parse_request(body, len, &req, &e) || srv_check_model(s, req, &e) || parse_request(req, &rq, &e) ||
      json_opt_bool(req, "stream", &stream, &e))
    goto fail;
  j = job_new(s);
  g = chat_gen_new(s, &msg_ops, "msg_");
  if (!j || !g) {
    srv_fail(&e, 500, NULL, NULL, "out of memory");
    goto fail;
  }
  j->err_shape = SRV_ERR_ANTHROPIC;
  if (srv_parse_gen(s, req, j, &e) || srv_parse_stops(req, "stop_sequences", j, &e)) goto fail;
fail: /* the success path too: e.status is 0 there */
  chat_gen_submit(s, &rq, j, g, stream, fd, &e, SRV_ERR_ANTHROPIC, r);
  cJSON_Delete(req);
  chat_req_free(&rq);
}

void anthropic_count_tokens(srv *s, const char *body, size_t len, srv_reply *r) {
  srv_error e = {0};
  cJSON *req = NULL;
  chat_req rq = {.param = "messages", .think = true};
  int32_t *ids = NULL;
  size_t n = 0;
  if (srv_parse_request(body, len, &req, &e) || srv_check_model(s, req, &e) || parse_request(req, &rq, &e) ||
      chat_req_prompt(s, &rq, &ids, &n, NULL, &e)) {
    srv_reply_error(r, &e, SRV_ERR_ANTHROPIC);
  } else {
    cJSON *o = cJSON_CreateObject();
    cJSON_AddNumberToObject(o, "input_tokens", (double)n);
    r->status = 200;
    r->body = cJSON_PrintUnformatted(o);
    cJSON_Delete(o);
  }
  free(ids);
  cJSON_Delete(req);
  chat_req_free(&rq);
}
