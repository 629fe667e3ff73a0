/* floe_chat_render: the public face of src/tok/chat.c (Qwen ChatML templates).
 *
 * The template family comes from the model file's own chat template when chat.c recognises it,
 * else from the architecture: qwen35moe -> Qwen3.5, qwen3moe / qwen3next -> Qwen3. */
#include <stdlib.h>

#include "base/base.h"
#include "engine/engine_internal.h"
#include "floe.h"
#include "base/hparams.h"
#include "tok/chat.h"

int floe_chat_render(const floe_engine *e, const floe_chat_msg *msgs, size_t n, const floe_chat_opts *o, char **out,
                     char *err, size_t errlen) {
  *out = NULL;
  chat_format f;
  const char *tmpl = tok_chat_template(engine_tok(e));
  if (!tmpl || chat_format_detect(tmpl, &f) != 0) f = engine_arch(e) == FLOE_ARCH_QWEN35MOE ? CHAT_QWEN35 : CHAT_QWEN3;
  size_t n_calls = 0;
  for (size_t i = 0; i < n; i++) n_calls += msgs[i].n_tool_calls;
  chat_msg *cm = calloc(n ? n : 1, sizeof *cm);
  chat_tool_call *calls = calloc(n_calls ? n_calls : 1, sizeof *calls);
  if (!cm || !calls) {
    free(cm);
    free(calls);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  chat_tool_call *next = calls;
  for (size_t i = 0; i < n; i++) {
    if (!msgs[i].role) {
      free(cm);
      free(calls);
      return floe_err(err, errlen, FLOE_E_INVALID, "message %zu has no role", i);
    }
    cm[i].role = msgs[i].role;
    cm[i].content = msgs[i].content;
    cm[i].reasoning = msgs[i].reasoning;
    cm[i].tool_calls = next;
    cm[i].n_tool_calls = msgs[i].n_tool_calls;
    for (size_t k = 0; k < msgs[i].n_tool_calls; k++, next++) {
      next->id = msgs[i].tool_calls[k].id;
      next->name = msgs[i].tool_calls[k].name;
      next->arguments = msgs[i].tool_calls[k].arguments;
    }
    cm[i].tool_call_id = msgs[i].tool_call_id;
  }
  chat_opts co = {0};
  co.enable_thinking = -1;
  if (o) {
    co.tools_json = o->tools_json;
    co.add_generation_prompt = o->add_generation_prompt;
    co.enable_thinking = o->enable_thinking ? 1 : 0;
    co.raw_tool_args = o->raw_tool_args;
  }
  tok_buf b = {0};
  int rc = chat_render(f, cm, n, &co, &b, err, errlen);
  free(cm);
  free(calls);
  if (rc) {
    tok_buf_free(&b);
    return rc;
  }
  if (!b.p) { /* empty rendering */
    b.p = calloc(1, 1);
    if (!b.p) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  *out = b.p;
  return 0;
}
