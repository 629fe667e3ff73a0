/* floe serve: an OpenAI-compatible HTTP server on the public API (include/floe.h) only.
 *
 * Threads: libmicrohttpd runs one thread per connection (the handlers parse, render and tokenize
 * there, in parallel); one inference worker owns the engine's sessions and decodes up to
 * --parallel queued jobs together, one batched step at a time (queue.c); a loader thread opens the
 * model after the socket is bound, so /health answers 503 while it loads.
 *
 * A job is reference counted: the HTTP side (the waiting handler or the streaming response) and
 * the queue each hold a reference. Output produced by the worker goes into job->out under
 * job->mu; the HTTP side reads it from there (non-streaming: the whole body at the end;
 * streaming: SSE bytes as they come). A client that goes away sets job->cancelled (or the
 * worker sees the socket closed), and the token callback stops the generation at once.
 *
 * Files: http.c (daemon, routing, auth, limits, small endpoints), queue.c (jobs, worker,
 * session slots, sampled-token replay), openai_chat.c, openai_completions.c, output_parse.c
 * (<think> / tool-call splitting), metrics.c, util.c (buffers, JSON and error helpers). */
#ifndef FLOE_SERVER_H
#define FLOE_SERVER_H
#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <cjson/cJSON.h>

#include "floe.h"

/* ---- options (cmd_serve.c fills them) ---- */
typedef struct srv_opts {
  const char *model;   /* GGUF file or model directory */
  const char *alias;   /* served model id; NULL: the model file's base name */
  const char *host;    /* default 127.0.0.1 */
  int port;            /* 0: any free port (printed on stderr) */
  const char *api_key; /* NULL: any key accepted */
  int n_threads;       /* engine threads, 0: all */
  int64_t n_ctx;       /* per session, 0: the engine default */
  bool kv_f32;
  int n_slots;         /* sessions kept for prefix reuse (default 1; at least n_parallel are made) */
  int n_parallel;      /* requests decoded together, continuous batching (default 4) */
  bool parallel_set;   /* --parallel given (else a tight memory budget may lower it) */
  int64_t chunk;       /* prompt chunk (tokens) evaluated per step while other requests decode (default 64) */
  int mtp;             /* floe_engine_params.mtp: 0 off (default), -1 auto, 1..4 drafts */
  int n_checkpoints;   /* floe_session_params.n_checkpoints (0: the engine default, < 0: none) */
  int queue_max;       /* pending requests beyond which new ones get 503 (default 64) */
  size_t max_body;     /* request body limit in bytes (default 8 MiB) */
  uint64_t mem_budget; /* engine memory budget (0: none; experts streamed from disk otherwise) */
  uint64_t gpu_mem;    /* GPU memory for the weights (floe_engine_params.gpu_mem; 0: all on the GPU) */
  int load;            /* FLOE_LOAD_* (--mmap / --no-mmap) */
  bool io_direct;      /* O_DIRECT expert reads (--direct, with a memory budget) */
  int device, device_index; /* FLOE_DEVICE_* and the GPU index (--device) */
  int max_conn;        /* connection limit (default 256) */
  int64_t default_max_tokens; /* when the request gives none; <= 0: until the context is full */
  bool verbose;        /* one log line per request */
  /* loading progress (floe_engine_params.progress), called from the loader thread; NULL: none */
  void (*progress)(void *user, uint64_t done, uint64_t total);
  void *progress_user;
} srv_opts;
void srv_opts_init(srv_opts *o);

typedef struct srv srv;
/* Binds and starts serving (the model loads in the background). *out is the running server. */
int srv_start(const srv_opts *o, srv **out, char *err, size_t errlen);
/* The port actually bound. */
int srv_port(const srv *s);
/* True when the model failed to load (the caller should stop the server and exit non-zero). */
bool srv_failed(const srv *s);
/* Stops: cancels every job, closes connections, joins the threads, frees everything. */
void srv_stop(srv *s);

/* ---- growable byte buffer ---- */
typedef struct sbuf { char *p; size_t n, cap; bool oom; } sbuf;
void sb_add(sbuf *b, const void *d, size_t n);
void sb_str(sbuf *b, const char *s);
void sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void sb_free(sbuf *b);
/* Appends s as a JSON string literal (quotes included); invalid UTF-8 becomes U+FFFD. */
void sb_json_str(sbuf *b, const char *s, size_t n);
/* Makes a cJSON string from bytes (invalid UTF-8 replaced by U+FFFD). */
cJSON *json_str_n(const char *s, size_t n);
bool utf8_valid(const char *s, size_t n);
/* Random alphanumeric id with a prefix ("chatcmpl-", "call_"). */
void srv_rand_id(char *out, size_t cap, const char *prefix, int n_chars);

/* ---- errors: OpenAI's shape ---- */
typedef struct srv_error {
  int status;          /* HTTP status */
  char type[48];       /* invalid_request_error, ... */
  char code[48];       /* "" = null */
  char param[48];      /* "" = null */
  char message[512];
} srv_error;
/* Sets e and returns -1 (so handlers can `return srv_fail(...)`). */
int srv_fail(srv_error *e, int status, const char *code, const char *param, const char *fmt, ...)
    __attribute__((format(printf, 5, 6)));
/* {"error":{"message","type","param","code"}} as malloc'ed text. */
char *srv_error_json(const srv_error *e);
/* The error in an API's shape: SRV_ERR_OPENAI as above, SRV_ERR_ANTHROPIC
 * {"type":"error","error":{"type","message"}} with Anthropic's type for the status. */
enum { SRV_ERR_OPENAI = 0, SRV_ERR_ANTHROPIC = 1 };
char *srv_error_json_shape(const srv_error *e, int shape);

/* ---- metrics ---- */
typedef struct srv_metrics {
  pthread_mutex_t mu;
  uint64_t requests[11]; /* by endpoint, see SRV_EP_* (SRV_EP_OTHER + 1 entries) */
  uint64_t responses_2xx, responses_4xx, responses_5xx;
  uint64_t rejected_queue_full, cancelled;
  uint64_t prompt_tokens, prompt_tokens_cached, gen_tokens;
  double prefill_s, decode_s;
  double last_prefill_tps, last_decode_tps;
  uint64_t expert_hits, expert_misses, expert_bytes_read; /* engine-wide counters (streaming) */
  /* continuous batching: worker steps, rows evaluated, the largest pass (rows, sessions), and the
   * steps whose pass held several sessions with their rows */
  uint64_t steps, step_rows, step_rows_max, step_sessions_max, batched_steps, batched_rows;
  /* MTP speculative decoding: steps, drafted / accepted per draft position (floe_session_stats) */
  uint64_t mtp_steps, mtp_drafted[4], mtp_accepted[4];
} srv_metrics;
enum { SRV_EP_CHAT, SRV_EP_COMPLETIONS, SRV_EP_MODELS, SRV_EP_HEALTH, SRV_EP_METRICS, SRV_EP_TOKENIZE,
       SRV_EP_DETOKENIZE, SRV_EP_RESPONSES, SRV_EP_MESSAGES, SRV_EP_COUNT_TOKENS, SRV_EP_OTHER };
void metrics_init(srv_metrics *m);
void metrics_request(srv_metrics *m, int ep);
void metrics_status(srv_metrics *m, int status);
void metrics_gen(srv_metrics *m, const floe_gen_result *r, bool cancelled);
/* Copies the engine's expert-streaming counters (cumulative; zero without a memory budget). */
void metrics_experts(srv_metrics *m, const floe_session_stats *st);
/* Prometheus text exposition. */
void metrics_render(srv_metrics *m, sbuf *out, int queue_depth, int processing, bool loaded);

/* ---- jobs and the worker (queue.c) ---- */
typedef struct srv_job srv_job;
typedef struct srv_queue srv_queue;

/* Protocol hooks, called by the worker thread. on_token runs inside floe_generate's callback
 * (job->mu NOT held; append output with job_emit). on_done runs once after the generation
 * (rc != 0: err holds the engine's message). */
typedef struct srv_job_ops {
  void (*on_token)(srv_job *j, const floe_token_event *ev);
  void (*on_done)(srv_job *j, int rc, const floe_gen_result *res, const char *err);
  void (*free_proto)(void *proto);
} srv_job_ops;

enum { JOB_QUEUED, JOB_RUNNING, JOB_DONE };

struct srv_job {
  pthread_mutex_t mu;
  pthread_cond_t cv;
  int refs;
  /* input (owned by the job) */
  int32_t *ids;
  size_t n_ids;
  floe_gen_params gp;
  char **stops;
  size_t n_stops;
  bool stream;
  const srv_job_ops *ops;
  void *proto;        /* openai_chat / openai_completions state */
  srv *server;
  /* state (under mu) */
  int state;
  bool cancelled;     /* client gone or server stopping */
  int fd;             /* client socket for disconnect polling, -1 when unknown / gone */
  sbuf out;           /* response bytes produced so far */
  size_t out_read;    /* streaming: bytes handed to the connection */
  int status;         /* HTTP status of a non-streaming response (0 until decided) */
  int err_shape;      /* SRV_ERR_*: the shape of the job's error bodies */
  /* worker bookkeeping */
  int32_t *sampled;   /* ids the model sampled (for slot history and replay) */
  size_t n_sampled, cap_sampled;
  double t_queued;
};

srv_job *job_new(srv *s);
void job_ref(srv_job *j);
void job_unref(srv_job *j);
/* Appends response bytes and wakes the reader. */
void job_emit(srv_job *j, const char *d, size_t n);
/* Ends a job whose generation failed with rc: an OpenAI error object (503 cancelled, 400
 * context_length_exceeded naming `param`, else 500), as an SSE event + [DONE] when streaming. */
void job_fail_generation(srv_job *j, int rc, const char *err, const char *param);
/* Emits root (taken) as one SSE event "data: <json>\n\n"; nothing when it cannot be printed. */
void job_emit_event(srv_job *j, cJSON *root);
/* The same with an event name: "event: <type>\ndata: <json>\n\n" (Responses, Anthropic). */
void job_emit_named(srv_job *j, const char *type, cJSON *root);
/* Ends a non-streaming job with root (taken) as its body: status 200, or 500 with an empty body
 * when it cannot be printed. */
void job_emit_body(srv_job *j, cJSON *root);
/* Marks the job cancelled (client gone); forgets the socket. */
void job_cancel(srv_job *j);
/* Waits until the job is done. */
void job_wait(srv_job *j);

/* Creates the queue (no worker yet). */
srv_queue *queue_new(srv *s, int queue_max);
/* Starts the worker on the loaded engine with max(n_slots, n_parallel) sessions, decoding up to
 * n_parallel jobs together; chunk: prompt tokens per step while others decode. shrink: when a
 * memory budget cannot hold that many sessions, use as many as it holds (the default --parallel)
 * instead of failing. */
int queue_start(srv_queue *q, floe_engine *e, const floe_session_params *sp, int n_slots, int n_parallel,
                bool shrink, int64_t chunk, char *err, size_t errlen);
/* Submits a job (takes a reference). Returns 0, or -1 when the queue is full / stopping. */
int queue_submit(srv_queue *q, srv_job *j);
void queue_depth(srv_queue *q, int *pending, int *running);
/* Sessions and requests decoded together (after queue_start). */
void queue_slots(srv_queue *q, int *n_slots, int *n_parallel);
/* Context size of the sessions (after queue_start). */
int64_t queue_n_ctx(srv_queue *q);
/* Cancels everything, stops and joins the worker, frees the sessions. */
void queue_stop(srv_queue *q);
void queue_free(srv_queue *q);

/* Tool-call id -> the assistant turn's text exactly as sampled (with the "<think>\n" the prompt
 * opened, if any). A request that sends that assistant message back is rendered from this text
 * instead of the structured fields, so the history matches what the model saw (the ds4 trick:
 * templates re-render arguments differently, e.g. Qwen3.5 writes booleans as True). */
void queue_remember_turn(srv_queue *q, const char *call_id, const char *text);
char *queue_lookup_turn(srv_queue *q, const char *call_id); /* malloc'ed copy or NULL */

/* Prompt tokenization with the replay map: spans of the text that are an earlier generation's
 * exact output are replaced by the token ids the model sampled (so the history matches the
 * session's cache); the rest is tokenized with parse_special. *ids malloc'ed. */
int queue_tokenize_prompt(srv_queue *q, const floe_engine *e, const char *text, size_t len, int32_t **ids,
                          size_t *n, char *err, size_t errlen);

/* ---- the server object, shared by the handlers ---- */
struct srv {
  srv_opts o;
  char model_id[256];
  char model_file[256];  /* base name of the model path */
  floe_engine *engine;   /* set once loaded */
  int64_t n_ctx;         /* of the sessions */
  int loaded;            /* 0 loading, 1 ready, -1 failed (atomic access) */
  srv_queue *queue;
  srv_metrics metrics;
  void *mhd;             /* struct MHD_Daemon */
  pthread_t loader;
  bool loader_started;
  int port;
  int64_t created;       /* unix time the server started */
  char load_err[512];
};

/* ---- endpoint handlers: parse the body, fill a response or a job ---- */
typedef struct srv_reply {
  int status;
  char *body;          /* malloc'ed JSON / text, or NULL */
  const char *content_type;
  srv_job *job;        /* set when the response is produced by a job */
  int retry_after;     /* seconds, for 503 */
  int err_shape;       /* SRV_ERR_* of an error body (for the HTTP side's own errors too) */
} srv_reply;

/* Fills r with the error (status, body in the given SRV_ERR_* shape, Retry-After for 503). */
void srv_reply_error(srv_reply *r, const srv_error *e, int shape);
/* Common request checks: model name, n, and engine readiness. */
int srv_check_model(srv *s, const cJSON *req, srv_error *e);
/* Queue the job or fail with 503 (sets reply). */
int srv_enqueue(srv *s, srv_job *j, srv_error *e, srv_reply *r);

void openai_chat(srv *s, const char *body, size_t len, int fd, srv_reply *r);
void openai_completions(srv *s, const char *body, size_t len, int fd, srv_reply *r);

/* ---- sampling / generation fields shared by both endpoints ---- */
/* Parses temperature, top_p, top_k, min_p, seed, stop, max_tokens / max_completion_tokens into
 * j->gp / j->stops. */
int srv_parse_gen(srv *s, const cJSON *req, srv_job *j, srv_error *e);
/* Reads an optional number / bool / int field with a type check. */
int json_opt_num(const cJSON *o, const char *key, double lo, double hi, double *out, bool *present, srv_error *e);
int json_opt_bool(const cJSON *o, const char *key, bool *out, srv_error *e);
/* Token text for logprobs: the piece as a (U+FFFD-repaired) string and its raw bytes. */
cJSON *json_token_bytes(const char *piece, size_t n);
/* A JSON token id: an integer number in [0, n_vocab). The range is tested before any cast, so a
 * huge or fractional number from a request is refused without undefined behaviour. */
bool json_token_id(const cJSON *t, int64_t n_vocab, int32_t *id);
/* Checks the prompt is not empty and fits: 0, or fills e (invalid_value / context_length_exceeded)
 * naming `param` ("messages" or "prompt"). */
int srv_check_context(srv *s, size_t n_prompt, const char *param, srv_error *e);
/* The fields every response object starts with: id, object, created, model, system_fingerprint. */
cJSON *json_response_root(const char *id, const char *object, int64_t created, const char *model);
/* Usage object from a result. */
cJSON *json_usage(const floe_gen_result *res, int64_t reasoning_tokens);
/* Parses a request body: valid UTF-8, JSON, an object. *out owned by the caller. */
int srv_parse_request(const char *body, size_t len, cJSON **out, srv_error *e);
/* Reads the stop strings of `key` (a string or an array of strings) into j->stops / j->gp. */
int srv_parse_stops(const cJSON *req, const char *key, srv_job *j, srv_error *e);

/* chat APIs beside openai_chat (their shared path: chat_gen.h) */
void openai_responses(srv *s, const char *body, size_t len, int fd, srv_reply *r);
void anthropic_messages(srv *s, const char *body, size_t len, int fd, srv_reply *r);
void anthropic_count_tokens(srv *s, const char *body, size_t len, srv_reply *r);
#endif
