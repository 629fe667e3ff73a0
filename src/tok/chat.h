/* Qwen chat templates rendered in C (no Jinja engine): Qwen3 (hybrid thinking, JSON tool calls)
 * and Qwen3.5 / Qwen3.6 (XML tool calls). Each renderer follows its model's chat_template line
 * by line, with Python/HF-transformers semantics (the reference): `tojson` is Python's
 * json.dumps(ensure_ascii=False) with ", " / ": " separators; `|string` of a JSON value is Python's
 * str() (True/False/None, float repr); `|trim` strips Python str.isspace() characters.
 *
 * Input: an array of chat_msg (roles system, developer, user, assistant, tool). "developer" is
 * rendered as "system" (the Qwen templates have no developer role; OpenAI clients send it). The
 * template's own errors are reported as FLOE_E_INVALID with the template's message (e.g. Qwen3.5's
 * "No user query found in messages.").
 *
 * Tool calls carry the arguments as JSON text (OpenAI wire format). They are parsed and rendered as
 * the template renders a dict (Qwen3: tojson; Qwen3.5/3.6: one <parameter=...> per key), unless
 * chat_opts.raw_tool_args is set, in which case Qwen3 copies the text verbatim (the template's
 * `arguments is string` branch; lets a server replay exactly the bytes the model sampled).
 *
 * Memory: the caller owns the messages; the output goes to a tok_buf. */
#ifndef FLOE_CHAT_H
#define FLOE_CHAT_H
#include <stdbool.h>
#include <stddef.h>

#include "tok/tokenizer.h"

typedef enum chat_format {
  CHAT_QWEN3 = 0,  /* Qwen3 / Qwen3-MoE / Qwen3-Next (2504 hybrid template) */
  CHAT_QWEN35 = 1, /* Qwen3.5 */
  CHAT_QWEN36 = 2, /* Qwen3.6: Qwen3.5 + preserve_thinking, JSON-typed tool arguments */
} chat_format;

typedef struct chat_tool_call {
  const char *id;        /* informational; the Qwen templates do not render it */
  const char *name;
  const char *arguments; /* JSON text, an object */
} chat_tool_call;

typedef struct chat_msg {
  const char *role;      /* "system" | "developer" | "user" | "assistant" | "tool" */
  const char *content;   /* NULL = none (rendered as "") */
  const char *reasoning; /* assistant reasoning_content; NULL = absent */
  const chat_tool_call *tool_calls;
  size_t n_tool_calls;
  const char *tool_call_id; /* tool messages; not rendered by the Qwen templates */
} chat_msg;

typedef struct chat_opts {
  const char *tools_json;     /* JSON array of tool objects ({"type":"function","function":{...}}) or NULL */
  bool add_generation_prompt;
  int enable_thinking;        /* -1: not given (template default: on), 0: off, 1: on */
  bool preserve_thinking;     /* Qwen3.6 only: keep <think> blocks of all past assistant turns */
  bool raw_tool_args;         /* Qwen3 only: emit arguments text verbatim */
} chat_opts;

/* Renders the conversation (appending to *out). */
int chat_render(chat_format f, const chat_msg *msgs, size_t n, const chat_opts *o, tok_buf *out, char *err,
                size_t errlen);

/* Recognises a Qwen chat template text (e.g. tokenizer.chat_template of a GGUF). Returns 0 and
 * sets *f, or FLOE_E_UNSUPPORTED. */
int chat_format_detect(const char *template_text, chat_format *f);

/* Python-style JSON helpers used by the renderers (exposed for tests). json_text must be one JSON
 * value. tojson: json.dumps(v, ensure_ascii=False); pystr: str(v) for scalars, tojson otherwise. */
int chat_json_py_dumps(const char *json_text, size_t len, tok_buf *out, char *err, size_t errlen);
#endif
