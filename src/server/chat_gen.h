/* The chat path shared by /v1/chat/completions, /v1/responses and /v1/messages: the request form
 * every chat API maps onto (chat_req: messages for the model's chat template, tools, thinking),
 * and the generation side (chat_gen: one output parser per job, the reply collected for a whole
 * response, and block callbacks that each API turns into its own streaming events). chat_gen.c
 * says more. */
#ifndef FLOE_CHAT_GEN_H
#define FLOE_CHAT_GEN_H
#include "server/output_parse.h"
#include "server/server.h"

/* What every chat API's request maps onto. Strings are borrowed from the request JSON or kept in
 * the pool; msgs[i].tool_calls is set by chat_req_prompt (calls are appended to the last
 * message, so each message's calls are contiguous). */
typedef struct chat_req {
  floe_chat_msg *msgs;
  size_t n_msgs, cap_msgs;
  size_t *call_at;           /* per message: its first call in calls */
  floe_chat_tool_call *calls;
  size_t n_calls, cap_calls;
  char **pool;
  size_t n_pool, cap_pool;
  cJSON *tools;              /* chat-completions shape {"type":"function","function":{...}}, owned */
  bool parse_calls;          /* tool calls in the output are parsed (tools given, tool_choice not none) */
  bool think;                /* enable_thinking */
  bool join_system;          /* join the leading system messages into one */
  const char *param;         /* the request field errors name ("messages", "input") */
} chat_req;
void chat_req_free(chat_req *r);
/* Takes s (malloc'ed) into the pool; NULL (s freed) when out of memory. */
char *chat_req_keep(chat_req *r, char *s);
/* Takes the buffer's text into the pool (b is reset); NULL when out of memory. */
const char *chat_req_join(chat_req *r, sbuf *b);
int chat_req_msg(chat_req *r, const char *role, const char *content, srv_error *e);
/* Appends a call to the last message, which must be an assistant message. */
int chat_req_call(chat_req *r, const char *id, const char *name, const char *args, srv_error *e);
/* Tool-call arguments (a JSON string holding an object, an object, or absent) as JSON text. */
int chat_req_args(chat_req *r, const cJSON *args, const char *param, const char **out, srv_error *e);
/* Appends a function tool (converted to the chat-completions shape). */
int chat_req_tool(chat_req *r, const char *name, const cJSON *description, const cJSON *parameters,
                  const char *param, srv_error *e);
/* Appends the function tools of a request's `tools` array: those whose type is fn_type or absent
 * (others, the provider's hosted tools, are skipped), with name, description and the parameter
 * schema under schema_key. */
int chat_req_tools(chat_req *r, const cJSON *tools, const char *fn_type, const char *schema_key, srv_error *e);
/* Renders (the model's template) and tokenizes (with replay): *ids malloc'ed; *think_open: the
 * prompt ends inside an open <think> block. */
int chat_req_prompt(srv *s, chat_req *r, int32_t **ids, size_t *n, bool *think_open, srv_error *e);

typedef struct chat_gen chat_gen;
/* An API's wire form. Streaming: the reply is a sequence of blocks (a run of reasoning, a run of
 * content, one tool call); open / delta / close are called for each, with g->blk_kind
 * (OUTP_REASONING / OUTP_CONTENT / OUTP_TOOL), g->n_blocks (blocks so far, this one included)
 * and g->blk_call (the call's index) set. done writes the response (streaming: the closing
 * events). */
typedef struct chat_gen_api {
  const char *name;  /* in the log */
  const char *param; /* named by a context-length error */
  void (*start)(chat_gen *g); /* streaming: the opening events, before the job is queued */
  void (*open)(chat_gen *g);
  void (*delta)(chat_gen *g, const char *s, size_t n);
  void (*close)(chat_gen *g);
  void (*token)(chat_gen *g, const floe_token_event *ev);       /* optional: before the parser */
  void (*token_after)(chat_gen *g, const floe_token_event *ev); /* optional: after the parser */
  void (*done)(chat_gen *g, const floe_gen_result *res);
  void (*fail)(chat_gen *g, int rc, const char *err);           /* NULL: job_fail_generation */
  void (*free)(chat_gen *g);                                    /* frees g->user; may be NULL */
} chat_gen_api;

typedef struct gen_call { char id[40]; sbuf name, args; } gen_call;

struct chat_gen {
  const chat_gen_api *api;
  void *user;          /* the API's state */
  srv_job *job;
  const floe_engine *e;
  srv_queue *queue;
  char id[64];
  char model[256];
  int64_t created;
  int64_t n_prompt;
  bool stream, verbose, think_open;
  cJSON *tools;        /* owned */
  outp parser;
  sbuf content, reasoning; /* the whole reply */
  gen_call *calls;
  int n_calls, cap_calls;
  int64_t n_reasoning; /* tokens generated inside the think block */
  int blk_kind, blk_call, n_blocks;
  int seq;             /* free for the API (event sequence numbers) */
};
chat_gen *chat_gen_new(srv *s, const chat_gen_api *api, const char *id_prefix);
/* Binds g to the job (j->ids set): takes r->tools, sets up the parser and the job's hooks. After
 * this the job owns g. */
void chat_gen_attach(chat_gen *g, srv_job *j, chat_req *r, bool stream, bool think_open, int fd);
/* Ends a chat handler. While e->status is 0 (no error yet): renders rq into j->ids, binds g to j,
 * sends the opening events and queues the job (r->job set). Otherwise, or when that fails: r gets
 * the error in the SRV_ERR_* shape. Takes j and g (either may be NULL after an error). */
void chat_gen_submit(srv *s, chat_req *rq, srv_job *j, chat_gen *g, bool stream, int fd, srv_error *e, int shape,
                     srv_reply *r);
/* Frees a chat_gen that was never attached. */
void chat_gen_discard(chat_gen *g);
/* The text the model sampled (end-of-generation tokens dropped), NUL-terminated. */
void chat_gen_sampled(const chat_gen *g, sbuf *out);
/* A named SSE event {"type": type, ...the fields of ev (taken)..., "sequence_number" when seq}. */
void chat_gen_event(chat_gen *g, const char *type, cJSON *ev, bool seq);
/* The stop string that ended the generation, or NULL (end of turn, length, no stops). */
const char *chat_gen_stop_hit(const chat_gen *g, const floe_gen_result *res);

#endif
