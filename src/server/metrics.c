/* Server counters and their Prometheus text exposition (GET /metrics). Names follow Prometheus
 * conventions: counters end in _total, durations are seconds. Expert-cache figures come from the
 * engine's streaming counters (floe_session_stats); they stay 0 without a memory budget. */
#include <string.h>

#include "server/server.h"

_Static_assert(sizeof ((srv_metrics *)0)->requests / sizeof(uint64_t) == SRV_EP_OTHER + 1, "one counter per endpoint");

void metrics_init(srv_metrics *m) {
  memset(m, 0, sizeof *m);
  pthread_mutex_init(&m->mu, NULL);
}

void metrics_request(srv_metrics *m, int ep) {
  pthread_mutex_lock(&m->mu);
  m->requests[ep < 0 || ep > SRV_EP_OTHER ? SRV_EP_OTHER : ep]++;
  pthread_mutex_unlock(&m->mu);
}

void metrics_status(srv_metrics *m, int status) {
  pthread_mutex_lock(&m->mu);
  if (status < 300) m->responses_2xx++;
  else if (status < 500) m->responses_4xx++;
  else m->responses_5xx++;
  if (status == 503) m->rejected_queue_full++;
  pthread_mutex_unlock(&m->mu);
}

void metrics_gen(srv_metrics *m, const floe_gen_result *r, bool cancelled) {
  pthread_mutex_lock(&m->mu);
  m->prompt_tokens += (uint64_t)r->n_prompt;
  m->prompt_tokens_cached += (uint64_t)r->n_reused;
  m->gen_tokens += (uint64_t)r->n_gen;
  m->prefill_s += r->prefill_s;
  m->decode_s += r->decode_s;
  if (r->prefill_s > 0 && r->n_prompt > r->n_reused)
    m->last_prefill_tps = (double)(r->n_prompt - r->n_reused) / r->prefill_s;
  if (r->decode_s > 0 && r->n_gen > 1) m->last_decode_tps = (double)(r->n_gen - 1) / r->decode_s;
  if (cancelled) m->cancelled++;
  pthread_mutex_unlock(&m->mu);
}

void metrics_experts(srv_metrics *m, const floe_session_stats *st) {
  pthread_mutex_lock(&m->mu);
  m->expert_hits = st->expert_hits;
  m->expert_misses = st->expert_misses;
  m->expert_bytes_read = st->bytes_read;
  pthread_mutex_unlock(&m->mu);
}

static void metric(sbuf *o, const char *name, const char *type, const char *help) {
  sb_printf(o, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
}

void metrics_render(srv_metrics *m, sbuf *o, int queue_depth, int processing, bool loaded) {
  static const char *const ep_names[] = {"chat_completions", "completions", "models", "health",
                                         "metrics", "tokenize", "detokenize", "responses",
                                         "messages", "count_tokens", "other"};
  pthread_mutex_lock(&m->mu);
  srv_metrics c = *m;
  pthread_mutex_unlock(&m->mu);
  metric(o, "floe_requests_total", "counter", "HTTP requests received, by endpoint.");
  for (int i = 0; i <= SRV_EP_OTHER; i++)
    sb_printf(o, "floe_requests_total{endpoint=\"%s\"} %llu\n", ep_names[i], (unsigned long long)c.requests[i]);
  metric(o, "floe_responses_total", "counter", "HTTP responses sent, by status class.");
  sb_printf(o, "floe_responses_total{class=\"2xx\"} %llu\nfloe_responses_total{class=\"4xx\"} %llu\n"
               "floe_responses_total{class=\"5xx\"} %llu\n",
            (unsigned long long)c.responses_2xx, (unsigned long long)c.responses_4xx,
            (unsigned long long)c.responses_5xx);
  metric(o, "floe_requests_rejected_total", "counter", "Requests answered 503 (queue full or model loading).");
  sb_printf(o, "floe_requests_rejected_total %llu\n", (unsigned long long)c.rejected_queue_full);
  metric(o, "floe_requests_cancelled_total", "counter", "Generations stopped because the client went away.");
  sb_printf(o, "floe_requests_cancelled_total %llu\n", (unsigned long long)c.cancelled);
  metric(o, "floe_prompt_tokens_total", "counter", "Prompt tokens processed (cached ones included).");
  sb_printf(o, "floe_prompt_tokens_total %llu\n", (unsigned long long)c.prompt_tokens);
  metric(o, "floe_prompt_tokens_cached_total", "counter", "Prompt tokens whose state was reused (prefix cache).");
  sb_printf(o, "floe_prompt_tokens_cached_total %llu\n", (unsigned long long)c.prompt_tokens_cached);
  metric(o, "floe_generated_tokens_total", "counter", "Tokens generated.");
  sb_printf(o, "floe_generated_tokens_total %llu\n", (unsigned long long)c.gen_tokens);
  metric(o, "floe_prefill_seconds_total", "counter", "Time spent evaluating prompts.");
  sb_printf(o, "floe_prefill_seconds_total %.6f\n", c.prefill_s);
  metric(o, "floe_decode_seconds_total", "counter", "Time spent generating.");
  sb_printf(o, "floe_decode_seconds_total %.6f\n", c.decode_s);
  metric(o, "floe_prefill_tokens_per_second", "gauge", "Prompt evaluation speed of the last request.");
  sb_printf(o, "floe_prefill_tokens_per_second %.3f\n", c.last_prefill_tps);
  metric(o, "floe_decode_tokens_per_second", "gauge", "Generation speed of the last request.");
  sb_printf(o, "floe_decode_tokens_per_second %.3f\n", c.last_decode_tps);
  metric(o, "floe_queue_depth", "gauge", "Requests waiting for the inference worker.");
  sb_printf(o, "floe_queue_depth %d\n", queue_depth);
  metric(o, "floe_requests_processing", "gauge", "Requests being generated now.");
  sb_printf(o, "floe_requests_processing %d\n", processing);
  uint64_t lookups = c.expert_hits + c.expert_misses;
  metric(o, "floe_expert_cache_hit_ratio", "gauge", "Routed-expert cache hit ratio since start (0 when not streaming).");
  sb_printf(o, "floe_expert_cache_hit_ratio %.6f\n", lookups ? (double)c.expert_hits / (double)lookups : 0.0);
  metric(o, "floe_expert_cache_hits_total", "counter", "Routed-expert lookups found in the cache.");
  sb_printf(o, "floe_expert_cache_hits_total %llu\n", (unsigned long long)c.expert_hits);
  metric(o, "floe_expert_cache_misses_total", "counter", "Routed-expert lookups read from disk.");
  sb_printf(o, "floe_expert_cache_misses_total %llu\n", (unsigned long long)c.expert_misses);
  metric(o, "floe_expert_bytes_read_total", "counter", "Routed-expert bytes read from disk.");
  sb_printf(o, "floe_expert_bytes_read_total %llu\n", (unsigned long long)c.expert_bytes_read);
  metric(o, "floe_batch_steps_total", "counter", "Worker steps (one batched forward pass each, plus any pass run alone).");
  sb_printf(o, "floe_batch_steps_total %llu\n", (unsigned long long)c.steps);
  metric(o, "floe_batch_rows_total", "counter", "Rows (tokens) evaluated by the worker's steps.");
  sb_printf(o, "floe_batch_rows_total %llu\n", (unsigned long long)c.step_rows);
  metric(o, "floe_batch_rows_max", "gauge", "Most rows of one forward pass since start.");
  sb_printf(o, "floe_batch_rows_max %llu\n", (unsigned long long)c.step_rows_max);
  metric(o, "floe_batch_sessions_max", "gauge", "Most requests evaluated in one forward pass since start.");
  sb_printf(o, "floe_batch_sessions_max %llu\n", (unsigned long long)c.step_sessions_max);
  metric(o, "floe_batched_steps_total", "counter", "Steps whose forward pass held the rows of several requests.");
  sb_printf(o, "floe_batched_steps_total %llu\n", (unsigned long long)c.batched_steps);
  metric(o, "floe_batched_rows_total", "counter", "Rows of those passes.");
  sb_printf(o, "floe_batched_rows_total %llu\n", (unsigned long long)c.batched_rows);
  uint64_t dr = 0, ac = 0;
  for (int k = 0; k < 4; k++) dr += c.mtp_drafted[k], ac += c.mtp_accepted[k];
  metric(o, "floe_mtp_steps_total", "counter", "Speculative (MTP draft + verify) decode steps.");
  sb_printf(o, "floe_mtp_steps_total %llu\n", (unsigned long long)c.mtp_steps);
  metric(o, "floe_mtp_drafted_tokens_total", "counter", "MTP draft tokens verified, all positions.");
  sb_printf(o, "floe_mtp_drafted_tokens_total %llu\n", (unsigned long long)dr);
  metric(o, "floe_mtp_accepted_tokens_total", "counter", "MTP draft tokens accepted, all positions.");
  sb_printf(o, "floe_mtp_accepted_tokens_total %llu\n", (unsigned long long)ac);
  metric(o, "floe_mtp_acceptance_ratio", "gauge", "Accepted / drafted MTP tokens since start (0: none drafted).");
  sb_printf(o, "floe_mtp_acceptance_ratio %.6f\n", dr ? (double)ac / (double)dr : 0.0);
  metric(o, "floe_mtp_position_drafted_total", "counter",
         "MTP drafts at draft position N (counted when drafts 1..N-1 of the step were accepted).");
  for (int k = 0; k < 4; k++)
    sb_printf(o, "floe_mtp_position_drafted_total{position=\"%d\"} %llu\n", k + 1, (unsigned long long)c.mtp_drafted[k]);
  metric(o, "floe_mtp_position_accepted_total", "counter", "MTP drafts accepted at draft position N.");
  for (int k = 0; k < 4; k++)
    sb_printf(o, "floe_mtp_position_accepted_total{position=\"%d\"} %llu\n", k + 1, (unsigned long long)c.mtp_accepted[k]);
  metric(o, "floe_model_loaded", "gauge", "1 once the model is loaded.");
  sb_printf(o, "floe_model_loaded %d\n", loaded ? 1 : 0);
}
