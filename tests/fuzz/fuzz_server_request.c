/* libFuzzer target for the server's request handlers: the input is a request body, given to each
 * body endpoint in turn (chat completions, completions, responses, messages, count_tokens) on a
 * server whose engine holds the default model and whose queue was never started. So every input
 * runs the whole path up to the queue: JSON and UTF-8 checks, each API's mapping onto the chat
 * request (messages, content blocks, tool calls and results, tools, tool_choice, thinking), the
 * sampling fields and stop strings, the model's chat template, tokenization with the replay map,
 * the context check; a request that passes all of it is refused at the queue (503 queue_full),
 * count_tokens answers 200.
 *
 * Asserted for every input and endpoint: no crash, no leak, no overread (ASan / UBSan / LSan); a
 * reply with a status and a JSON body; no job left behind; bad input is a 4xx in the API's own
 * error shape, never a 500.
 *
 * The model: FLOE_FUZZ_MODEL, else models/default.gguf of the source tree this file is in. Seeds:
 * tests/fixtures/server_requests (run_fuzz.sh). Built only with -DFLOE_FUZZ=ON (clang). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "floe.h"
#include "server/server.h"

static srv g_s;

int LLVMFuzzerInitialize(int *argc, char ***argv) {
  (void)argc, (void)argv;
  static char path[4096];
  const char *env = getenv("FLOE_FUZZ_MODEL");
  if (env) {
    snprintf(path, sizeof path, "%s", env);
  } else { /* this file is tests/fuzz/fuzz_server_request.c: the tree's root is two folders up */
    snprintf(path, sizeof path, "%s", __FILE__);
    for (int up = 0; up < 3; up++) {
      char *sl = strrchr(path, '/');
      if (sl) *sl = 0;
      else snprintf(path, sizeof path, ".");
    }
    strncat(path, "/models/default.gguf", sizeof path - strlen(path) - 1);
  }
  srv_opts_init(&g_s.o);
  g_s.o.model = path;
  snprintf(g_s.model_id, sizeof g_s.model_id, "default");
  snprintf(g_s.model_file, sizeof g_s.model_file, "default.gguf");
  floe_engine_params ep;
  floe_engine_params_init(&ep);
  ep.model = path;
  ep.n_threads = 1;
  ep.device = FLOE_DEVICE_CPU;
  char err[512];
  if (floe_engine_open(&ep, &g_s.engine, err, sizeof err)) {
    fprintf(stderr, "fuzz_server_request: %s: %s\n", path, err);
    exit(1);
  }
  g_s.n_ctx = 4096;
  g_s.loaded = 1;
  metrics_init(&g_s.metrics);
  g_s.queue = queue_new(&g_s, 4); /* never started: every submit is refused */
  if (!g_s.queue) exit(1);
  return 0;
}

/* The reply of endpoint `ep`: a status, a JSON body, no job; an error in the API's shape */
static void check(const srv_reply *r, int ep, bool anthropic) {
  (void)ep;
  if (r->job) __builtin_trap();                         /* the queue took nothing */
  if (r->status != 200 && (r->status < 400 || r->status > 599)) __builtin_trap();
  if (r->status == 500) __builtin_trap();               /* bad input is the client's error */
  if (!r->body) __builtin_trap();
  cJSON *b = cJSON_Parse(r->body);
  if (!b) __builtin_trap();
  if (r->status != 200) {
    const cJSON *er = cJSON_GetObjectItemCaseSensitive(b, "error");
    const cJSON *msg = cJSON_GetObjectItemCaseSensitive(er, "message");
    if (!cJSON_IsString(msg) || !msg->valuestring[0]) __builtin_trap();
    if (anthropic) {
      const cJSON *ty = cJSON_GetObjectItemCaseSensitive(b, "type");
      if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "error")) __builtin_trap();
    }
  }
  cJSON_Delete(b);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const char *body = (const char *)data;
  for (int ep = 0; ep < 5; ep++) {
    srv_reply r = {0};
    switch (ep) {
      case 0: openai_chat(&g_s, body, size, -1, &r); break;
      case 1: openai_completions(&g_s, body, size, -1, &r); break;
      case 2: openai_responses(&g_s, body, size, -1, &r); break;
      case 3: anthropic_messages(&g_s, body, size, -1, &r); break;
      default: anthropic_count_tokens(&g_s, body, size, &r); break;
    }
    check(&r, ep, ep >= 3);
    free(r.body);
  }
  int pending = 0, running = 0;
  queue_depth(g_s.queue, &pending, &running);
  if (pending || running) __builtin_trap();
  return 0;
}
