/* Splits a chat model's generated text into reasoning, content and tool calls, incrementally.
 *
 * Input: text as floe_generate releases it (whole UTF-8 characters, arbitrary cut points, so a tag
 * like "</think>" may arrive in pieces). Output: events on a sink, in order.
 *
 *   <think> ... </think>   -> reasoning (only at the start of the reply, before any content; or
 *                             from the first byte when the prompt already opened the block, as
 *                             the Qwen3.5 template does with "<think>\n"). Leading / trailing
 *                             newlines of the block are dropped, like the templates' strip('\n').
 *   <tool_call> ... </tool_call> (when tools are on) -> a tool call, in either form:
 *      Qwen3:   {"name": "f", "arguments": {...}}
 *      Qwen3.5: <function=f>\n<parameter=p>\nvalue\n</parameter>\n...</function>
 *     XML parameter values are typed by the tool's JSON schema (integer, number, boolean, null,
 *     object, array parsed; strings and anything unparsable kept as strings).
 *   everything else -> content (leading newlines dropped; trailing whitespace held back until more
 *     text comes, and dropped when the reply made tool calls).
 *
 * Incremental mode (streaming): a tool call's header (id, name) is emitted as soon as the name is
 * known and its arguments as they complete (XML: one parameter at a time; JSON: the raw bytes of
 * the arguments object). A call found malformed before its header went out comes back as content
 * (the raw text, tags included); one found malformed later is closed as it is.
 * Non-incremental mode: each call is parsed whole at </tool_call>; a malformed call is content.
 *
 * Memory: the parser owns its buffers; outp_free releases them. Tools JSON is borrowed. */
#ifndef FLOE_OUTPUT_PARSE_H
#define FLOE_OUTPUT_PARSE_H
#include <stdbool.h>
#include <stddef.h>

#include <cjson/cJSON.h>

#include "server/server.h"

typedef struct outp_sink {
  void *user;
  void (*content)(void *u, const char *s, size_t n);
  void (*reasoning)(void *u, const char *s, size_t n);
  void (*tool_start)(void *u, int index, const char *id, const char *name);
  void (*tool_args)(void *u, int index, const char *s, size_t n);
} outp_sink;

enum { OUTP_CONTENT, OUTP_REASONING, OUTP_TOOL };

typedef struct outp {
  /* configuration */
  bool parse_tools;
  bool incremental;
  const cJSON *tools; /* request "tools" array (schemas for XML typing), may be NULL */
  outp_sink sink;
  /* state */
  int mode;
  bool think_done;    /* a think block was seen (no second one is recognised) */
  bool content_seen;  /* non-whitespace content emitted */
  bool reason_seen;   /* non-newline reasoning emitted */
  sbuf pend;          /* text not yet classified */
  sbuf hold;          /* whitespace held back (content) or newlines (reasoning) */
  sbuf call;          /* body of the open tool call */
  int n_calls;        /* tool calls emitted */
  /* incremental state of the open call */
  int form;           /* 0 undecided, 1 XML, 2 JSON, 3 not incrementally parsable */
  bool started;       /* header emitted */
  bool args_open;     /* "{" of the arguments emitted (XML) */
  bool args_closed;
  int n_params;
  size_t scan;        /* parse offset in call */
  size_t args_at;     /* JSON: start of the arguments value, 0 = not yet */
  int depth;
  bool in_str, esc;
  char id[40];
  char fname[208];    /* XML: the function name */
} outp;

void outp_init(outp *p, bool parse_tools, bool incremental, bool think_open, const cJSON *tools, outp_sink sink);
/* Which channel text fed now would go to (for counting reasoning tokens). */
int outp_mode(const outp *p);
void outp_feed(outp *p, const char *s, size_t n);
/* End of generation: flushes held text; an unterminated tool call becomes content. */
void outp_finish(outp *p);
void outp_free(outp *p);

/* Types one XML parameter value by the schema of tool `name`, parameter `param`; appends JSON. */
void outp_typed_value(const cJSON *tools, const char *name, const char *param, const char *v, size_t n, sbuf *out);
#endif
