/* Expert reads (see experts.h): io_uring with a deep queue, or a pool of pread threads.
 *
 * A request is one contiguous range; it is handed to the disk as chunks of at most `chunk` bytes
 * (aligned: O_DIRECT needs page-aligned offsets, lengths and buffers), up to `depth` chunks in
 * flight across all requests, so one large expert is read by several commands at once. Two
 * queues: demand requests are always taken before prefetch requests; promoting a queued prefetch
 * moves its remaining chunks to the demand queue (chunks already in flight stay in flight).
 *
 * A read that returns fewer bytes than asked is continued; one that reaches the end of the file
 * before the request's `need` bytes fails with -EFBIG ("the file shrank"); a negative result is
 * the request's status. io_uring: the submission queue is filled under the mutex by whoever queues
 * work, and a reaper thread owns the completion queue: it waits for completions, accounts them and
 * refills the ring at once, so the disk stays busy while the evaluating thread computes (a first
 * version reaped only when the evaluating thread polled: 1.32 tok/s against 1.81 for the pread
 * pool on the 80B benchmark). pread workers take chunks under the mutex. Both post finished
 * requests on the done list.
 *
 * Default (XIO_AUTO) = the pread pool: on the dev VM (2 cores, virtio disk) 3 interleaved runs of
 * the 80B at 4G gave pread 1.92 tok/s [1.82-2.13] vs io_uring 1.55 [1.44-1.75]; with io_uring the
 * disk sat idle ~95 ms per token with reads pending (the reaper competes for the 2 cores), with
 * pread 10 ms (bench/results.tsv). io_uring stays available (--io uring). */
#define _GNU_SOURCE
#include <errno.h>
#include <liburing.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "experts/experts.h"

typedef struct xio_chunk {
  xio_req *r;
  uint64_t rel, len; /* relative to r->off */
  int next_free;
} xio_chunk;

struct xio {
  int kind;
  int depth;
  uint64_t chunk;
  pthread_mutex_t mu;
  pthread_cond_t work, donecv;
  xio_req *qh[2], *qt[2]; /* demand, prefetch */
  xio_req *done_h, *done_t;
  int n_done;
  int inflight;
  /* disk time accounting (under mu): the engine is busy while a chunk is in flight */
  double busy_s, busy_t0, last_done;
  /* io_uring */
  struct io_uring ring;
  bool ring_ok;
  xio_chunk *chunks;
  int free_chunk;
  pthread_t reaper;
  bool reaper_on;
  /* pread pool */
  pthread_t *th;
  int n_th;
  bool stop;
};

static int64_t inject_nth;

void xio_test_inject_eio(int64_t nth) { __atomic_store_n(&inject_nth, nth, __ATOMIC_SEQ_CST); }

/* true when this chunk read must fail (test hook) */
static bool inject_now(void) {
  int64_t v = __atomic_load_n(&inject_nth, __ATOMIC_SEQ_CST);
  while (v > 0) {
    if (__atomic_compare_exchange_n(&inject_nth, &v, v - 1, false, __ATOMIC_SEQ_CST, __ATOMIC_SEQ_CST))
      return v == 1;
  }
  return false;
}

static void q_unlink(xio *io, xio_req *r) {
  const int p = r->prio;
  if (r->qp) r->qp->qn = r->qn;
  else io->qh[p] = r->qn;
  if (r->qn) r->qn->qp = r->qp;
  else io->qt[p] = r->qp;
  r->qn = r->qp = NULL;
  r->queued = false;
}

static void q_append(xio *io, xio_req *r, int p) {
  r->prio = p;
  r->qn = NULL;
  r->qp = io->qt[p];
  if (io->qt[p]) io->qt[p]->qn = r;
  else io->qh[p] = r;
  io->qt[p] = r;
  r->queued = true;
}

/* Next chunk to read (under mu): from the demand queue first. */
static xio_req *take(xio *io, uint64_t *rel, uint64_t *len) {
  xio_req *r = io->qh[XIO_DEMAND] ? io->qh[XIO_DEMAND] : io->qh[XIO_PREFETCH];
  if (!r) return NULL;
  *rel = r->next;
  *len = r->len - r->next < io->chunk ? r->len - r->next : io->chunk;
  r->next += *len;
  r->inflight++;
  if (io->inflight++ == 0) io->busy_t0 = floe_time_s();
  if (r->next >= r->len) q_unlink(io, r);
  return r;
}

static void finish_if_done(xio *io, xio_req *r) {
  if (r->next < r->len || r->inflight > 0 || r->done) return;
  r->done = true;
  r->qn = NULL;
  if (io->done_t) io->done_t->qn = r;
  else io->done_h = r;
  io->done_t = r;
  io->n_done++;
}

/* Accounts one finished chunk piece (under mu). Returns true when the chunk is complete; false
 * when its remainder [rel+res, rel+len) must be read again (short read inside the file). */
static bool chunk_result(xio *io, xio_req *r, uint64_t rel, uint64_t len, int64_t res, bool final) {
  if (res < 0) {
    if (!r->status) r->status = (int)res;
  } else {
    r->got += (uint64_t)res;
    if ((uint64_t)res < len && rel + (uint64_t)res < r->need) {
      if (res > 0 && !final) return false;
      if (!r->status) r->status = -EFBIG;
    }
  }
  r->inflight--;
  if (--io->inflight == 0) {
    io->last_done = floe_time_s();
    io->busy_s += io->last_done - io->busy_t0;
  }
  finish_if_done(io, r);
  return true;
}

/* ---- pread pool ---- */
static void *pread_worker(void *arg) {
  xio *io = arg;
  pthread_mutex_lock(&io->mu);
  for (;;) {
    uint64_t rel, len;
    xio_req *r = NULL;
    while (!io->stop && !(r = take(io, &rel, &len))) pthread_cond_wait(&io->work, &io->mu);
    if (!r) break;
    pthread_mutex_unlock(&io->mu);
    int64_t res = 0;
    if (inject_now()) res = -EIO;
    else {
      const int fd = r->fd;
      while ((uint64_t)res < len) {
        ssize_t k = pread(fd, r->dst + rel + res, (size_t)(len - (uint64_t)res), (off_t)(r->off + rel + (uint64_t)res));
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
          res = -errno;
          break;
        }
        if (k == 0) break;
        res += k;
      }
    }
    pthread_mutex_lock(&io->mu);
    chunk_result(io, r, rel, len, res, true); /* the loop above read until the end of the file */
    pthread_cond_broadcast(&io->donecv);
  }
  pthread_mutex_unlock(&io->mu);
  return NULL;
}

/* ---- io_uring ---- */
static void uring_fill(xio *io) {
  bool any = false;
  while (io->free_chunk >= 0) {
    uint64_t rel, len;
    xio_req *r = take(io, &rel, &len);
    if (!r) break;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    if (!sqe) { /* cannot happen: one sqe per free chunk; undo defensively */
      r->next -= len;
      r->inflight--;
      io->inflight--;
      if (!r->queued) q_append(io, r, r->prio);
      break;
    }
    const int ci = io->free_chunk;
    xio_chunk *c = &io->chunks[ci];
    io->free_chunk = c->next_free;
    c->r = r;
    c->rel = rel;
    c->len = len;
    io_uring_prep_read(sqe, r->fd, r->dst + rel, (unsigned)len, r->off + rel);
    io_uring_sqe_set_data64(sqe, (uint64_t)ci);
    any = true;
  }
  if (any) io_uring_submit(&io->ring);
}

static void uring_complete(xio *io, struct io_uring_cqe *cqe) {
  const int ci = (int)io_uring_cqe_get_data64(cqe);
  int64_t res = cqe->res;
  io_uring_cqe_seen(&io->ring, cqe);
  xio_chunk *c = &io->chunks[ci];
  if (inject_now()) res = -EIO;
  if (!chunk_result(io, c->r, c->rel, c->len, res, false)) { /* short read: the rest again */
    c->rel += (uint64_t)res;
    c->len -= (uint64_t)res;
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    io_uring_prep_read(sqe, c->r->fd, c->r->dst + c->rel, (unsigned)c->len, c->r->off + c->rel);
    io_uring_sqe_set_data64(sqe, (uint64_t)ci);
    io_uring_submit(&io->ring);
    return;
  }
  c->next_free = io->free_chunk;
  io->free_chunk = ci;
}

/* Owns the completion queue (the only thread that reads it). Exits on a NOP with user data -1. */
static void *uring_reaper(void *arg) {
  xio *io = arg;
  for (;;) {
    struct io_uring_cqe *cqe;
    int rc = io_uring_wait_cqe(&io->ring, &cqe);
    if (rc == -EINTR) continue;
    pthread_mutex_lock(&io->mu);
    if (rc) { /* the ring failed: nothing will complete; fail what is in flight */
      io->stop = true;
      pthread_cond_broadcast(&io->donecv);
      pthread_mutex_unlock(&io->mu);
      return NULL;
    }
    bool quit = false;
    do {
      if (io_uring_cqe_get_data64(cqe) == UINT64_MAX) {
        io_uring_cqe_seen(&io->ring, cqe);
        quit = true;
      } else {
        uring_complete(io, cqe);
      }
    } while (io_uring_peek_cqe(&io->ring, &cqe) == 0);
    uring_fill(io);
    pthread_cond_broadcast(&io->donecv);
    pthread_mutex_unlock(&io->mu);
    if (quit) return NULL;
  }
}

int xio_open(int kind, int depth, int threads, uint64_t chunk, xio **out, char *err, size_t errlen) {
  *out = NULL;
  if (depth < 1) depth = 64;
  if (threads < 1) threads = 8;
  if (chunk < XS_PAGE) chunk = 512 * 1024;
  chunk = chunk / XS_PAGE * XS_PAGE;
  xio *io = calloc(1, sizeof *io);
  if (!io) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  io->depth = depth;
  io->chunk = chunk;
  pthread_mutex_init(&io->mu, NULL);
  pthread_cond_init(&io->work, NULL);
  pthread_cond_init(&io->donecv, NULL);
  if (kind == XIO_URING) { /* AUTO: the pread pool, measured faster here (see the header) */
    int rc = io_uring_queue_init((unsigned)depth, &io->ring, 0);
    if (rc == 0) {
      io->ring_ok = true;
      io->kind = XIO_URING;
      io->chunks = calloc((size_t)depth, sizeof *io->chunks);
      if (!io->chunks) {
        xio_close(io);
        return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
      }
      for (int i = 0; i < depth; i++) io->chunks[i].next_free = i + 1 < depth ? i + 1 : -1;
      io->free_chunk = 0;
      if (pthread_create(&io->reaper, NULL, uring_reaper, io)) {
        xio_close(io);
        return floe_err(err, errlen, FLOE_E_NOMEM, "cannot start the I/O thread");
      }
      io->reaper_on = true;
    } else if (kind == XIO_URING) {
      xio_close(io);
      return floe_err(err, errlen, FLOE_E_IO, "io_uring unavailable: %s", strerror(-rc));
    }
  }
  if (!io->ring_ok) {
    io->kind = XIO_PREAD;
    io->th = calloc((size_t)threads, sizeof *io->th);
    if (!io->th) {
      xio_close(io);
      return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    }
    for (int i = 0; i < threads; i++) {
      if (pthread_create(&io->th[i], NULL, pread_worker, io)) {
        xio_close(io);
        return floe_err(err, errlen, FLOE_E_NOMEM, "cannot start I/O threads");
      }
      io->n_th++;
    }
  }
  *out = io;
  return 0;
}

void xio_close(xio *io) {
  if (!io) return;
  if (io->reaper_on) {
    pthread_mutex_lock(&io->mu);
    io->qh[0] = io->qh[1] = io->qt[0] = io->qt[1] = NULL; /* queued work is dropped */
    while (io->inflight > 0 && !io->stop) pthread_cond_wait(&io->donecv, &io->mu); /* the kernel writes into our buffers */
    struct io_uring_sqe *sqe = io_uring_get_sqe(&io->ring);
    if (sqe) {
      io_uring_prep_nop(sqe);
      io_uring_sqe_set_data64(sqe, UINT64_MAX);
      io_uring_submit(&io->ring);
    }
    pthread_mutex_unlock(&io->mu);
    pthread_join(io->reaper, NULL);
  }
  if (io->ring_ok) io_uring_queue_exit(&io->ring);
  if (io->n_th) {
    pthread_mutex_lock(&io->mu);
    io->stop = true;
    io->qh[0] = io->qh[1] = io->qt[0] = io->qt[1] = NULL; /* queued work is dropped */
    pthread_cond_broadcast(&io->work);
    pthread_mutex_unlock(&io->mu);
    for (int i = 0; i < io->n_th; i++) pthread_join(io->th[i], NULL);
  }
  free(io->th);
  free(io->chunks);
  pthread_mutex_destroy(&io->mu);
  pthread_cond_destroy(&io->work);
  pthread_cond_destroy(&io->donecv);
  free(io);
}

int xio_kind(const xio *io) { return io->kind; }

void xio_times(xio *io, double *busy_s, double *last_done) {
  pthread_mutex_lock(&io->mu);
  const double t = floe_time_s();
  *busy_s = io->busy_s + (io->inflight > 0 ? t - io->busy_t0 : 0);
  *last_done = io->inflight > 0 ? t : io->last_done;
  pthread_mutex_unlock(&io->mu);
}

void xio_submit(xio *io, xio_req *r, int prio) {
  r->status = 0;
  r->got = 0;
  r->next = 0;
  r->inflight = 0;
  r->done = false;
  pthread_mutex_lock(&io->mu);
  if (r->len == 0) finish_if_done(io, r);
  else q_append(io, r, prio);
  if (io->n_th) pthread_cond_signal(&io->work);
  if (io->ring_ok) uring_fill(io);
  pthread_mutex_unlock(&io->mu);
}

void xio_promote(xio *io, xio_req *r) {
  pthread_mutex_lock(&io->mu);
  if (r->queued && r->prio == XIO_PREFETCH) {
    q_unlink(io, r);
    q_append(io, r, XIO_DEMAND);
  }
  r->prio = XIO_DEMAND;
  pthread_mutex_unlock(&io->mu);
}

int xio_poll(xio *io, int min, xio_req **out, int max) {
  int n = 0;
  pthread_mutex_lock(&io->mu);
  if (io->ring_ok) {
    uring_fill(io);
    if (io->stop) {
      pthread_mutex_unlock(&io->mu);
      return FLOE_E_IO;
    }
  } else if (io->qh[0] || io->qh[1]) {
    pthread_cond_broadcast(&io->work);
  }
  while (io->n_done < min && io->n_done < max && !io->stop && (io->inflight > 0 || io->qh[0] || io->qh[1]))
    pthread_cond_wait(&io->donecv, &io->mu);
  while (n < max && io->done_h) {
    xio_req *r = io->done_h;
    io->done_h = r->qn;
    if (!io->done_h) io->done_t = NULL;
    io->n_done--;
    r->qn = NULL;
    out[n++] = r;
  }
  pthread_mutex_unlock(&io->mu);
  return n;
}
