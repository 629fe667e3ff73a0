/* Jobs, the request queue with admission control, and the inference worker.
 *
 * One worker thread owns the sessions (slots) and decodes up to n_parallel jobs together
 * (continuous batching): between two steps it admits queued jobs into free slots, then one
 * floe_gen_step evaluates the next row of every decoding job and at most one prompt chunk of a
 * new one in one batched forward pass, and the jobs that finished leave. A new job takes the free
 * session that can reuse the most of its prompt (floe_session_reusable: the common prefix, down
 * to a recurrent-state checkpoint on hybrid models), else the least recently used free one, so
 * agents that resend the whole conversation reuse the KV and recurrent state even when the
 * template re-renders the last reply differently (the result is the same as a cold run). Rows are
 * exact, so a job's output does not depend on the jobs decoded beside it.
 *
 * Replay map: the history an agent sends back is re-rendered and re-tokenized, and a re-tokenized
 * reply may not be the token sequence the model sampled (BPE is not unique). The worker remembers
 * the text of each generation with the ids it sampled; queue_tokenize_prompt puts those ids back
 * wherever that exact text appears in a new prompt (the ds4 trick). The map does not depend on
 * which session holds what, so a request tokenizes the same way whether its prefix is cached or
 * not, and "warm" and "cold" runs of one request see the same tokens.
 *
 * Disconnects: a generation asks should_stop between prefill chunks (so a long prompt is
 * abandoned too) and the token callback after each token; both poll the client socket
 * (POLLRDHUP) and job->cancelled, and a non-zero answer stops the generation at once. */
#define _GNU_SOURCE /* memmem, POLLRDHUP */
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"
#include "server/server.h"

#define REPLAY_MAX 64
#define REPLAY_MIN_TEXT 8
#define TURNS_MAX 256

typedef struct slot {
  floe_session *s;
  uint64_t used;
  srv_job *job;              /* the request decoding in this slot (worker only), NULL: free */
  floe_gen *gen;
  int64_t mtp_steps, mtp_drafted[4], mtp_accepted[4]; /* the session's MTP counters already counted */
} slot;

typedef struct replay {
  char *text;
  size_t len;
  int32_t *ids;
  size_t n;
  uint64_t used;
} replay;

typedef struct turn {
  char id[48];
  char *text;
  uint64_t used;
} turn;

struct srv_queue {
  srv *server;
  pthread_mutex_t mu;
  pthread_cond_t cv;
  srv_job **items; /* FIFO ring */
  size_t head, n, cap;
  int queue_max;
  int n_active;    /* jobs taken from the queue and not finished (at most n_parallel) */
  int n_parallel;  /* requests decoded together */
  int64_t chunk;   /* prompt chunk while others decode */
  bool stopping, started;
  pthread_t worker;
  floe_engine *e;
  slot *slots;
  int n_slots;
  uint64_t tick;
  pthread_mutex_t rmu;
  replay rep[REPLAY_MAX];
  int n_rep;
  turn turns[TURNS_MAX]; /* tool-call id -> the assistant turn as sampled (under rmu) */
  int n_turns;
};

/* ---- jobs ---- */
srv_job *job_new(srv *s) {
  srv_job *j = calloc(1, sizeof *j);
  if (!j) return NULL;
  pthread_mutex_init(&j->mu, NULL);
  pthread_cond_init(&j->cv, NULL);
  j->refs = 1;
  j->fd = -1;
  j->server = s;
  j->state = JOB_QUEUED;
  j->t_queued = floe_time_s();
  return j;
}

void job_ref(srv_job *j) {
  pthread_mutex_lock(&j->mu);
  j->refs++;
  pthread_mutex_unlock(&j->mu);
}

void job_unref(srv_job *j) {
  if (!j) return;
  pthread_mutex_lock(&j->mu);
  int r = --j->refs;
  pthread_mutex_unlock(&j->mu);
  if (r > 0) return;
  free(j->ids);
  for (size_t i = 0; i < j->n_stops; i++) free(j->stops[i]);
  free(j->stops);
  if (j->ops && j->ops->free_proto && j->proto) j->ops->free_proto(j->proto);
  sb_free(&j->out);
  free(j->sampled);
  pthread_mutex_destroy(&j->mu);
  pthread_cond_destroy(&j->cv);
  free(j);
}

void job_emit(srv_job *j, const char *d, size_t n) {
  pthread_mutex_lock(&j->mu);
  sb_add(&j->out, d, n);
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
}

void job_fail_generation(srv_job *j, int rc, const char *err, const char *param) {
  srv_error e;
  if (rc == FLOE_E_CANCELLED) srv_fail(&e, 503, "cancelled", NULL, "the request was cancelled (server stopping)");
  else if (rc == FLOE_E_CONTEXT) srv_fail(&e, 400, "context_length_exceeded", param, "%s", err);
  else srv_fail(&e, 500, NULL, NULL, "generation failed: %s", err);
  char *s = srv_error_json_shape(&e, j->err_shape);
  if (j->stream) {
    sbuf b = {0};
    if (j->err_shape == SRV_ERR_ANTHROPIC) sb_printf(&b, "event: error\ndata: %s\n\n", s ? s : "{}");
    else sb_printf(&b, "data: %s\n\ndata: [DONE]\n\n", s ? s : "{}");
    job_emit(j, b.p, b.n);
    sb_free(&b);
  } else {
    pthread_mutex_lock(&j->mu);
    j->status = e.status;
    pthread_mutex_unlock(&j->mu);
    if (s) job_emit(j, s, strlen(s));
  }
  free(s);
}

void job_emit_event(srv_job *j, cJSON *root) {
  char *js = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!js) return;
  sbuf b = {0};
  sb_printf(&b, "data: %s\n\n", js);
  free(js);
  if (!b.oom) job_emit(j, b.p, b.n);
  sb_free(&b);
}

void job_emit_named(srv_job *j, const char *type, cJSON *root) {
  char *js = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  if (!js) return;
  sbuf b = {0};
  sb_printf(&b, "event: %s\ndata: %s\n\n", type, js);
  free(js);
  if (!b.oom) job_emit(j, b.p, b.n);
  sb_free(&b);
}

void job_emit_body(srv_job *j, cJSON *root) {
  char *s = cJSON_PrintUnformatted(root);
  cJSON_Delete(root);
  pthread_mutex_lock(&j->mu);
  j->status = s ? 200 : 500;
  pthread_mutex_unlock(&j->mu);
  if (s) job_emit(j, s, strlen(s));
  free(s);
}

void job_cancel(srv_job *j) {
  pthread_mutex_lock(&j->mu);
  j->cancelled = true;
  j->fd = -1;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
}

void job_wait(srv_job *j) {
  pthread_mutex_lock(&j->mu);
  while (j->state != JOB_DONE) pthread_cond_wait(&j->cv, &j->mu);
  pthread_mutex_unlock(&j->mu);
}

static void job_finish(srv_job *j) {
  pthread_mutex_lock(&j->mu);
  j->state = JOB_DONE;
  pthread_cond_broadcast(&j->cv);
  pthread_mutex_unlock(&j->mu);
}

/* ---- queue ---- */
srv_queue *queue_new(srv *s, int queue_max) {
  srv_queue *q = calloc(1, sizeof *q);
  if (!q) return NULL;
  q->server = s;
  q->queue_max = queue_max > 0 ? queue_max : 1;
  q->cap = (size_t)q->queue_max + 1;
  q->items = calloc(q->cap, sizeof *q->items);
  if (!q->items) {
    free(q);
    return NULL;
  }
  pthread_mutex_init(&q->mu, NULL);
  pthread_cond_init(&q->cv, NULL);
  pthread_mutex_init(&q->rmu, NULL);
  return q;
}

int queue_submit(srv_queue *q, srv_job *j) {
  pthread_mutex_lock(&q->mu);
  if (q->stopping || !q->started || q->n >= (size_t)q->queue_max) {
    pthread_mutex_unlock(&q->mu);
    return -1;
  }
  job_ref(j);
  q->items[(q->head + q->n) % q->cap] = j;
  q->n++;
  pthread_cond_signal(&q->cv);
  pthread_mutex_unlock(&q->mu);
  return 0;
}

void queue_depth(srv_queue *q, int *pending, int *running) {
  pthread_mutex_lock(&q->mu);
  *pending = (int)q->n;
  *running = q->n_active;
  pthread_mutex_unlock(&q->mu);
}

/* ---- replay map ---- */
static void replay_add(srv_queue *q, const int32_t *ids, size_t n) {
  sbuf t = {0};
  for (size_t i = 0; i < n; i++) {
    size_t len;
    const char *pc = floe_token_piece(q->e, ids[i], &len);
    if (pc) sb_add(&t, pc, len);
  }
  if (t.oom || t.n < REPLAY_MIN_TEXT) {
    sb_free(&t);
    return;
  }
  int32_t *cp = malloc(n * sizeof *cp);
  if (!cp) {
    sb_free(&t);
    return;
  }
  memcpy(cp, ids, n * sizeof *cp);
  pthread_mutex_lock(&q->rmu);
  int k = 0;
  if (q->n_rep < REPLAY_MAX) k = q->n_rep++;
  else
    for (int i = 1; i < REPLAY_MAX; i++)
      if (q->rep[i].used < q->rep[k].used) k = i;
  free(q->rep[k].text);
  free(q->rep[k].ids);
  q->rep[k] = (replay){t.p, t.n, cp, n, ++q->tick};
  pthread_mutex_unlock(&q->rmu);
}

void queue_remember_turn(srv_queue *q, const char *call_id, const char *text) {
  char *cp = strdup(text);
  if (!cp || strlen(call_id) >= sizeof q->turns[0].id) {
    free(cp);
    return;
  }
  pthread_mutex_lock(&q->rmu);
  int k = 0;
  if (q->n_turns < TURNS_MAX) k = q->n_turns++;
  else
    for (int i = 1; i < TURNS_MAX; i++)
      if (q->turns[i].used < q->turns[k].used) k = i;
  free(q->turns[k].text);
  snprintf(q->turns[k].id, sizeof q->turns[k].id, "%s", call_id);
  q->turns[k].text = cp;
  q->turns[k].used = ++q->tick;
  pthread_mutex_unlock(&q->rmu);
}

char *queue_lookup_turn(srv_queue *q, const char *call_id) {
  char *r = NULL;
  pthread_mutex_lock(&q->rmu);
  for (int k = 0; k < q->n_turns && !r; k++)
    if (!strcmp(q->turns[k].id, call_id)) {
      r = strdup(q->turns[k].text);
      q->turns[k].used = ++q->tick;
    }
  pthread_mutex_unlock(&q->rmu);
  return r;
}

typedef struct replay_seg { size_t at, len; int32_t *ids; size_t n; } replay_seg;

/* Appends ids to a growable array. */
static int ids_append(int32_t **v, size_t *n, size_t *cap, const int32_t *src, size_t k) {
  if (*n + k > *cap) {
    size_t nc = (*n + k) * 2 + 64;
    int32_t *nb = realloc(*v, nc * sizeof *nb);
    if (!nb) return -1;
    *v = nb;
    *cap = nc;
  }
  if (k) memcpy(*v + *n, src, k * sizeof *src);
  *n += k;
  return 0;
}

int queue_tokenize_prompt(srv_queue *q, const floe_engine *e, const char *text, size_t len, int32_t **ids,
                          size_t *n, char *err, size_t errlen) {
  *ids = NULL;
  *n = 0;
  /* 1. under the lock: where remembered generations occur (earliest first, the longest at a tie) */
  replay_seg *segs = NULL;
  size_t n_segs = 0, cap_segs = 0;
  int rc = 0;
  bool oom = false;
  pthread_mutex_lock(&q->rmu);
  for (size_t pos = 0; pos < len;) {
    const char *best = NULL;
    int bk = -1;
    for (int k = 0; k < q->n_rep; k++) {
      const char *hit = memmem(text + pos, len - pos, q->rep[k].text, q->rep[k].len);
      if (hit && (!best || hit < best || (hit == best && q->rep[k].len > q->rep[bk].len))) {
        best = hit;
        bk = k;
      }
    }
    if (!best) break;
    if (n_segs == cap_segs) {
      size_t nc = cap_segs ? cap_segs * 2 : 4;
      replay_seg *nb = realloc(segs, nc * sizeof *nb);
      if (!nb) {
        oom = true;
        break;
      }
      segs = nb;
      cap_segs = nc;
    }
    replay_seg *sg = &segs[n_segs];
    sg->at = (size_t)(best - text);
    sg->len = q->rep[bk].len;
    sg->n = q->rep[bk].n;
    sg->ids = malloc(sg->n * sizeof *sg->ids);
    if (!sg->ids) {
      oom = true;
      break;
    }
    memcpy(sg->ids, q->rep[bk].ids, sg->n * sizeof *sg->ids);
    n_segs++;
    q->rep[bk].used = ++q->tick;
    pos = sg->at + sg->len;
  }
  pthread_mutex_unlock(&q->rmu);
  /* 2. tokenize the text between them */
  int32_t *out = NULL;
  size_t no = 0, cap = 0, pos = 0;
  for (size_t i = 0; rc == 0 && !oom && i <= n_segs; i++) {
    size_t upto = i < n_segs ? segs[i].at : len;
    if (upto > pos) {
      int32_t *part = NULL;
      size_t np = 0;
      rc = floe_tokenize(e, text + pos, upto - pos, true, &part, &np, err, errlen);
      if (rc == 0 && ids_append(&out, &no, &cap, part, np)) oom = true;
      free(part);
    }
    if (rc == 0 && i < n_segs) {
      if (ids_append(&out, &no, &cap, segs[i].ids, segs[i].n)) oom = true;
      pos = segs[i].at + segs[i].len;
    }
  }
  for (size_t i = 0; i < n_segs; i++) free(segs[i].ids);
  free(segs);
  if (rc || oom) {
    free(out);
    return rc ? rc : floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  *ids = out;
  *n = no;
  return 0;
}

/* ---- worker ---- */
/* True when the client went away (or the server is stopping). */
static bool job_gone(srv_job *j) {
  pthread_mutex_lock(&j->mu);
  if (!j->cancelled && j->fd >= 0) {
    struct pollfd pf = {.fd = j->fd, .events = POLLRDHUP};
    if (poll(&pf, 1, 0) > 0 && (pf.revents & (POLLRDHUP | POLLHUP | POLLERR | POLLNVAL))) j->cancelled = true;
  }
  bool gone = j->cancelled;
  pthread_mutex_unlock(&j->mu);
  return gone;
}

static int should_stop_cb(void *user) { return job_gone(user) ? 1 : 0; }

static int on_token_cb(void *user, const floe_token_event *ev) {
  srv_job *j = user;
  if (ev->id >= 0) {
    if (j->n_sampled == j->cap_sampled) {
      size_t nc = j->cap_sampled ? j->cap_sampled * 2 : 256;
      int32_t *nb = realloc(j->sampled, nc * sizeof *nb);
      if (nb) {
        j->sampled = nb;
        j->cap_sampled = nc;
      }
    }
    if (j->n_sampled < j->cap_sampled) j->sampled[j->n_sampled++] = ev->id;
  }
  j->ops->on_token(j, ev);
  return job_gone(j) ? 1 : 0;
}

/* The free session that reuses the most of the prompt; none reuses anything: the least recently
 * used free one. NULL: every session is busy. */
static slot *pick_slot(srv_queue *q, const int32_t *ids, size_t n) {
  slot *best = NULL;
  int64_t best_n = 0;
  for (int i = 0; i < q->n_slots; i++) {
    if (q->slots[i].job) continue;
    const int64_t r = floe_session_reusable(q->slots[i].s, ids, n);
    if (r > best_n) {
      best = &q->slots[i];
      best_n = r;
    }
  }
  if (!best)
    for (int i = 0; i < q->n_slots; i++)
      if (!q->slots[i].job && (!best || q->slots[i].used < best->used)) best = &q->slots[i];
  if (best) best->used = ++q->tick;
  return best;
}

/* Adds what the slot's session counted since the last look (MTP drafts) to the server's metrics,
 * and copies the engine-wide streaming counters. */
static void slot_metrics(srv_queue *q, slot *sl) {
  floe_session_stats st;
  floe_session_stats_get(sl->s, &st);
  srv_metrics *m = &q->server->metrics;
  pthread_mutex_lock(&m->mu);
  m->mtp_steps += (uint64_t)(st.mtp_steps - sl->mtp_steps);
  for (int k = 0; k < 4; k++) {
    m->mtp_drafted[k] += (uint64_t)(st.mtp_drafted[k] - sl->mtp_drafted[k]);
    m->mtp_accepted[k] += (uint64_t)(st.mtp_accepted[k] - sl->mtp_accepted[k]);
    sl->mtp_drafted[k] = st.mtp_drafted[k];
    sl->mtp_accepted[k] = st.mtp_accepted[k];
  }
  sl->mtp_steps = st.mtp_steps;
  pthread_mutex_unlock(&m->mu);
  metrics_experts(m, &st);
}

/* A job leaves its slot: the protocol's on_done, the metrics, the waiting handler woken. */
static void end_job(srv_queue *q, srv_job *j, slot *sl, int rc, const floe_gen_result *res, const char *err) {
  if (sl) {
    if (rc == 0) {
      size_t n = j->n_sampled;
      while (n && floe_token_is_eog(q->e, j->sampled[n - 1])) n--;
      if (res->finish != FLOE_FINISH_CANCELLED && n) replay_add(q, j->sampled, n);
    }
    slot_metrics(q, sl);
    sl->job = NULL;
    sl->gen = NULL;
  }
  metrics_gen(&q->server->metrics, res, res->finish == FLOE_FINISH_CANCELLED);
  j->ops->on_done(j, rc, res, err);
  job_finish(j);
  pthread_mutex_lock(&q->mu);
  q->n_active--;
  pthread_mutex_unlock(&q->mu);
  job_unref(j);
}

/* Starts a job taken from the queue in a free slot (the caller made sure one is free). */
static void start_job(srv_queue *q, srv_job *j) {
  floe_gen_result res = {0};
  char err[512] = "";
  pthread_mutex_lock(&j->mu);
  const bool cancelled = j->cancelled;
  j->state = JOB_RUNNING;
  pthread_mutex_unlock(&j->mu);
  if (cancelled) { /* the client went away while the job was queued: count it like any cancellation */
    snprintf(err, sizeof err, "cancelled");
    res.finish = FLOE_FINISH_CANCELLED;
    end_job(q, j, NULL, FLOE_E_CANCELLED, &res, err);
    return;
  }
  slot *sl = pick_slot(q, j->ids, j->n_ids);
  FLOE_ASSERT(sl);
  j->gp.should_stop = should_stop_cb;
  floe_gen *g;
  int rc = floe_gen_begin(sl->s, j->ids, j->n_ids, &j->gp, on_token_cb, j, &g, err, sizeof err);
  if (rc) {
    end_job(q, j, NULL, rc, &res, err);
    return;
  }
  sl->job = j;
  sl->gen = g;
}

/* One step of every active job (continuous batching): the decoding ones and at most one prompt
 * chunk, so a new long prompt delays the others by one chunk per step at most; then the jobs
 * that finished leave their slots. */
static void step_jobs(srv_queue *q) {
  floe_gen *g[q->n_slots];
  slot *own[q->n_slots];
  int n = 0, n_dec = 0;
  bool chunk_taken = false;
  for (int i = 0; i < q->n_slots; i++) {
    slot *sl = &q->slots[i];
    if (sl->gen && !floe_gen_prefilling(sl->gen)) n_dec++;
  }
  /* the prompt chunk: the oldest prefilling job's (slots in admission order would be fairer, the
   * lowest slot is simpler and a prompt only takes a few steps) */
  for (int i = 0; i < q->n_slots; i++) {
    slot *sl = &q->slots[i];
    if (!sl->gen) continue;
    if (floe_gen_prefilling(sl->gen)) {
      if (chunk_taken) continue;
      chunk_taken = true;
    }
    g[n] = sl->gen;
    own[n++] = sl;
  }
  if (n == 0) return;
  floe_step_info info;
  /* a prompt evaluated while others decode goes in small chunks; alone, in the engine's large ones */
  floe_gen_step(g, n, n_dec > 0 ? q->chunk : 0, &info);
  srv_metrics *m = &q->server->metrics;
  pthread_mutex_lock(&m->mu);
  m->steps++;
  m->step_rows += (uint64_t)info.rows_total;
  if ((uint64_t)info.rows > m->step_rows_max) m->step_rows_max = (uint64_t)info.rows;
  if (info.sessions > 1) {
    m->batched_steps++;
    m->batched_rows += (uint64_t)info.rows;
  }
  if ((uint64_t)info.sessions > m->step_sessions_max) m->step_sessions_max = (uint64_t)info.sessions;
  pthread_mutex_unlock(&m->mu);
  for (int i = 0; i < n; i++) {
    if (!floe_gen_done(g[i])) continue;
    floe_gen_result res = {0};
    char err[512] = "";
    slot *sl = own[i];
    srv_job *j = sl->job;
    const int rc = floe_gen_end(g[i], &res, err, sizeof err);
    end_job(q, j, sl, rc, &res, err);
  }
}

static void *worker_main(void *arg) {
  srv_queue *q = arg;
  for (;;) {
    pthread_mutex_lock(&q->mu);
    while (!q->stopping && q->n == 0 && q->n_active == 0) pthread_cond_wait(&q->cv, &q->mu);
    if (q->stopping) {
      pthread_mutex_unlock(&q->mu);
      break;
    }
    /* admit queued jobs while a slot is free (between steps: a request joins here) */
    srv_job *adm[q->n_parallel];
    int na = 0;
    while (q->n && q->n_active < q->n_parallel) {
      adm[na++] = q->items[q->head];
      q->head = (q->head + 1) % q->cap;
      q->n--;
      q->n_active++;
    }
    pthread_mutex_unlock(&q->mu);
    for (int i = 0; i < na; i++) start_job(q, adm[i]);
    step_jobs(q);
  }
  /* stopping: the running generations end as cancelled (their callbacks see job->cancelled) */
  for (int i = 0; i < q->n_slots; i++) {
    slot *sl = &q->slots[i];
    if (!sl->gen) continue;
    job_cancel(sl->job);
    while (!floe_gen_done(sl->gen)) {
      floe_gen *g = sl->gen;
      floe_gen_step(&g, 1, 0, NULL);
    }
    floe_gen_result res = {0};
    char err[512] = "";
    const int rc = floe_gen_end(sl->gen, &res, err, sizeof err);
    end_job(q, sl->job, sl, rc, &res, err);
  }
  return NULL;
}

int queue_start(srv_queue *q, floe_engine *e, const floe_session_params *sp, int n_slots, int n_parallel,
                bool shrink, int64_t chunk, char *err, size_t errlen) {
  q->e = e;
  q->n_parallel = n_parallel > 0 ? n_parallel : 1;
  q->n_slots = n_slots > q->n_parallel ? n_slots : q->n_parallel; /* a session per parallel request */
  const int want = q->n_slots;
  q->chunk = chunk > 0 ? chunk : 64;
  q->slots = calloc((size_t)q->n_slots, sizeof *q->slots);
  if (!q->slots) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  for (int i = 0; i < q->n_slots; i++) {
    floe_session_params p = *sp;
    p.share_threads = i ? q->slots[0].s : NULL;      /* one set of threads: one step at a time anyway */
    p.budget_sessions = i ? 0 : q->n_slots - 1;      /* a memory budget keeps room for every slot */
    int rc = floe_session_new(e, &p, &q->slots[i].s, err, errlen);
    if (rc == FLOE_E_NOMEM && i == 0 && shrink && q->n_slots > 1) {
      /* the default --parallel under a tight --mem-budget: as many slots as the budget holds */
      q->n_slots--;
      q->n_parallel = q->n_slots;
      i--;
      continue;
    }
    if (rc) return rc;
  }
  if (shrink && q->n_slots < want)
    fprintf(stderr, "floe serve: the memory budget holds %d session%s: decoding %d request%s together\n", q->n_slots,
            q->n_slots == 1 ? "" : "s", q->n_parallel, q->n_parallel == 1 ? "" : "s");
  if (pthread_create(&q->worker, NULL, worker_main, q))
    return floe_err(err, errlen, FLOE_E_NOMEM, "cannot start the worker thread");
  pthread_mutex_lock(&q->mu);
  q->started = true;
  pthread_mutex_unlock(&q->mu);
  return 0;
}

void queue_slots(srv_queue *q, int *n_slots, int *n_parallel) {
  *n_slots = q->n_slots;
  *n_parallel = q->n_parallel;
}

int64_t queue_n_ctx(srv_queue *q) { return q->n_slots ? floe_session_n_ctx(q->slots[0].s) : 0; }

void queue_stop(srv_queue *q) {
  pthread_mutex_lock(&q->mu);
  bool started = q->started;
  q->stopping = true;
  pthread_cond_broadcast(&q->cv);
  pthread_mutex_unlock(&q->mu);
  if (started) pthread_join(q->worker, NULL); /* it cancels and ends the running jobs */
  /* jobs still queued: finish them as cancelled so their handlers return */
  for (;;) {
    pthread_mutex_lock(&q->mu);
    srv_job *j = NULL;
    if (q->n) {
      j = q->items[q->head];
      q->head = (q->head + 1) % q->cap;
      q->n--;
      q->n_active++;
    }
    pthread_mutex_unlock(&q->mu);
    if (!j) break;
    job_cancel(j);
    start_job(q, j);
  }
  q->started = false;
}

void queue_free(srv_queue *q) {
  if (!q) return;
  for (int i = 0; i < q->n_slots && q->slots; i++) floe_session_free(q->slots[i].s);
  free(q->slots);
  for (int k = 0; k < q->n_rep; k++) {
    free(q->rep[k].text);
    free(q->rep[k].ids);
  }
  for (int k = 0; k < q->n_turns; k++) free(q->turns[k].text);
  free(q->items);
  pthread_mutex_destroy(&q->mu);
  pthread_cond_destroy(&q->cv);
  pthread_mutex_destroy(&q->rmu);
  free(q);
}
