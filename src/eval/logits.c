/* Logits files of perplexity runs (reader, writer) and the statistics both sides of a comparison
 * use. The format is described in eval.h. Every size read from a file is checked against the
 * file's size before use, and every field against its range, so a truncated, padded or crafted
 * file is refused with one line and never read out of bounds. */
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "eval/eval.h"
#include "floe.h"

struct eval_logits {
  eval_logits_hdr h;
  const uint8_t *buf;
  size_t len;
  bool owned; /* mapped by eval_logits_open */
  char name[256];
};

static uint32_t rd32(const uint8_t *p) {
  return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}
static void wr32(uint8_t *p, uint32_t v) {
  p[0] = (uint8_t)v, p[1] = (uint8_t)(v >> 8), p[2] = (uint8_t)(v >> 16), p[3] = (uint8_t)(v >> 24);
}

/* The field ranges keep every product below 2^64: tokens < 2^24 * n_chunks, rows < n_chunks *
 * 2^24 * 2^24; n_chunks is bounded by the overflow checks. */
uint64_t eval_logits_file_size(const eval_logits_hdr *h) {
  if (h->n_vocab < 1 || h->n_vocab > (1u << 24) || h->n_ctx < 4 || h->n_ctx > (1u << 24) || h->n_chunks < 1 ||
      h->first < 1 || h->first > h->n_ctx - 2)
    return 0;
  const uint64_t per_chunk = 4ull * h->n_ctx + 4ull * eval_logits_n_scored(h) * h->n_vocab;
  if (per_chunk > (UINT64_MAX - EVAL_LOGITS_HEADER) / h->n_chunks) return 0;
  return EVAL_LOGITS_HEADER + per_chunk * h->n_chunks;
}

int eval_logits_open_buffer(const uint8_t *buf, size_t len, const char *name, eval_logits **out, char *err,
                            size_t errlen) {
  *out = NULL;
  char nm[200];
  floe_show(nm, sizeof nm, name);
  if (len < EVAL_LOGITS_HEADER || memcmp(buf, EVAL_LOGITS_MAGIC, 8) != 0)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: not a floe logits file (no FLOELGP1 header)", nm);
  eval_logits_hdr h = {rd32(buf + 8), rd32(buf + 12), rd32(buf + 16), rd32(buf + 20), rd32(buf + 24)};
  if (h.version != EVAL_LOGITS_VERSION)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: logits file version %u (this floe reads %u)", nm, h.version,
                    EVAL_LOGITS_VERSION);
  const uint64_t want = eval_logits_file_size(&h);
  if (!want)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: bad header (n_vocab %u, n_ctx %u, n_chunks %u, first %u)", nm,
                    h.n_vocab, h.n_ctx, h.n_chunks, h.first);
  if (want != (uint64_t)len)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %zu bytes, the header says %llu (truncated or padded)", nm, len,
                    (unsigned long long)want);
  const uint64_t n_tok = (uint64_t)h.n_chunks * h.n_ctx;
  for (uint64_t i = 0; i < n_tok; i++) {
    const uint32_t t = rd32(buf + EVAL_LOGITS_HEADER + 4 * i);
    if (t >= h.n_vocab)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: token %llu is %u, outside the vocabulary of %u", nm,
                      (unsigned long long)i, t, h.n_vocab);
  }
  eval_logits *l = calloc(1, sizeof *l);
  if (!l) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", nm);
  l->h = h;
  l->buf = buf;
  l->len = len;
  snprintf(l->name, sizeof l->name, "%s", nm);
  *out = l;
  return 0;
}

int eval_logits_open(const char *path, eval_logits **out, char *err, size_t errlen) {
  *out = NULL;
  char nm[200];
  floe_show(nm, sizeof nm, path);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return floe_err(err, errlen, errno == ENOENT ? FLOE_E_NOTFOUND : FLOE_E_IO, "%s: %s", nm, strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return floe_err(err, errlen, FLOE_E_IO, "%s: not a regular file", nm);
  }
  if ((uint64_t)st.st_size < EVAL_LOGITS_HEADER) {
    close(fd);
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: not a floe logits file (%lld bytes)", nm, (long long)st.st_size);
  }
  const uint8_t *map = NULL;
  size_t map_len = 0;
  int rc = floe_map_file(fd, (uint64_t)st.st_size, false, path, &map, &map_len, err, errlen);
  close(fd);
  if (rc) return rc;
  rc = eval_logits_open_buffer(map, (size_t)st.st_size, path, out, err, errlen);
  if (rc) {
    floe_unmap_file(map, map_len);
    return rc;
  }
  (*out)->owned = true;
  (*out)->len = map_len;
  return 0;
}

void eval_logits_close(eval_logits *l) {
  if (!l) return;
  if (l->owned) floe_unmap_file(l->buf, l->len);
  free(l);
}

const eval_logits_hdr *eval_logits_header(const eval_logits *l) { return &l->h; }

const int32_t *eval_logits_tokens(const eval_logits *l, uint32_t c) {
  if (c >= l->h.n_chunks) return NULL;
  /* the header is 32 bytes and the ids 4 each: always 4-aligned in a mapping */
  return (const int32_t *)(const void *)(l->buf + EVAL_LOGITS_HEADER + 4ull * c * l->h.n_ctx);
}

int eval_logits_row(const eval_logits *l, uint32_t c, uint32_t j, float *out, char *err, size_t errlen) {
  const uint32_t ns = eval_logits_n_scored(&l->h);
  if (c >= l->h.n_chunks || j >= ns)
    return floe_err(err, errlen, FLOE_E_INVALID, "%s: no row %u of window %u", l->name, j, c);
  const uint64_t off = EVAL_LOGITS_HEADER + 4ull * l->h.n_chunks * l->h.n_ctx +
                       4ull * l->h.n_vocab * ((uint64_t)c * ns + j);
  memcpy(out, l->buf + off, 4ull * l->h.n_vocab);
  if (!eval_row_ok(out, l->h.n_vocab))
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: row %u of window %u is not a log-probability row", l->name, j, c);
  return 0;
}

/* ---- writer ---- */

struct eval_logits_writer {
  FILE *f;
  eval_logits_hdr h;
  uint64_t rows, want_rows;
  char *path, *tmp;
};

int eval_logits_create(const char *path, const eval_logits_hdr *h, const int32_t *tokens, eval_logits_writer **out,
                       char *err, size_t errlen) {
  *out = NULL;
  char nm[200];
  floe_show(nm, sizeof nm, path);
  if (h->version != EVAL_LOGITS_VERSION || !eval_logits_file_size(h))
    return floe_err(err, errlen, FLOE_E_INVALID, "%s: bad logits header", nm);
  eval_logits_writer *w = calloc(1, sizeof *w);
  const size_t tl = strlen(path) + 32;
  if (!w || !(w->path = strdup(path)) || !(w->tmp = malloc(tl))) {
    if (w) free(w->path);
    free(w);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  snprintf(w->tmp, tl, "%s.tmp.%d", path, (int)getpid());
  w->h = *h;
  w->want_rows = (uint64_t)h->n_chunks * eval_logits_n_scored(h);
  w->f = fopen(w->tmp, "wb");
  if (!w->f) {
    int rc = floe_err(err, errlen, FLOE_E_IO, "%s: %s", nm, strerror(errno));
    free(w->tmp), free(w->path), free(w);
    return rc;
  }
  uint8_t hd[EVAL_LOGITS_HEADER] = {0};
  memcpy(hd, EVAL_LOGITS_MAGIC, 8);
  wr32(hd + 8, h->version), wr32(hd + 12, h->n_vocab), wr32(hd + 16, h->n_ctx);
  wr32(hd + 20, h->n_chunks), wr32(hd + 24, h->first);
  bool ok = fwrite(hd, 1, sizeof hd, w->f) == sizeof hd;
  const uint64_t n_tok = (uint64_t)h->n_chunks * h->n_ctx;
  for (uint64_t i = 0; ok && i < n_tok; i++) {
    uint8_t b[4];
    if (tokens[i] < 0 || (uint32_t)tokens[i] >= h->n_vocab) {
      eval_logits_abort(w);
      return floe_err(err, errlen, FLOE_E_INVALID, "%s: token %d outside the vocabulary", nm, tokens[i]);
    }
    wr32(b, (uint32_t)tokens[i]);
    ok = fwrite(b, 1, 4, w->f) == 4;
  }
  if (!ok) {
    int rc = floe_err(err, errlen, FLOE_E_IO, "%s: write failed: %s", nm, strerror(errno));
    eval_logits_abort(w);
    return rc;
  }
  *out = w;
  return 0;
}

int eval_logits_write_row(eval_logits_writer *w, const float *row, char *err, size_t errlen) {
  if (w->rows >= w->want_rows) return floe_err(err, errlen, FLOE_E_INVALID, "logits file: more rows than the header says");
  /* the file is little-endian; floe runs on little-endian hosts only (x86-64, the CUDA hosts) */
  if (fwrite(row, 4, w->h.n_vocab, w->f) != w->h.n_vocab)
    return floe_err(err, errlen, FLOE_E_IO, "logits file: write failed: %s", strerror(errno));
  w->rows++;
  return 0;
}

int eval_logits_finish(eval_logits_writer *w, char *err, size_t errlen) {
  char nm[200];
  floe_show(nm, sizeof nm, w->path);
  int rc = 0;
  if (w->rows != w->want_rows)
    rc = floe_err(err, errlen, FLOE_E_INVALID, "%s: %llu of %llu rows written", nm, (unsigned long long)w->rows,
                  (unsigned long long)w->want_rows);
  else if (fflush(w->f) != 0 || ferror(w->f))
    rc = floe_err(err, errlen, FLOE_E_IO, "%s: write failed: %s", nm, strerror(errno));
  if (fclose(w->f) != 0 && !rc) rc = floe_err(err, errlen, FLOE_E_IO, "%s: close failed: %s", nm, strerror(errno));
  w->f = NULL;
  if (!rc && rename(w->tmp, w->path) != 0) rc = floe_err(err, errlen, FLOE_E_IO, "%s: rename failed: %s", nm, strerror(errno));
  if (rc) unlink(w->tmp);
  free(w->tmp), free(w->path), free(w);
  return rc;
}

void eval_logits_abort(eval_logits_writer *w) {
  if (!w) return;
  if (w->f) fclose(w->f);
  unlink(w->tmp);
  free(w->tmp), free(w->path), free(w);
}

/* ---- statistics ---- */

int32_t eval_argmax(const float *row, size_t n) {
  size_t best = 0;
  for (size_t i = 1; i < n; i++)
    if (row[i] > row[best]) best = i;
  return (int32_t)best;
}

int32_t eval_log_softmax(const float *logits, size_t n, float *out) {
  const int32_t am = eval_argmax(logits, n);
  const double mx = logits[am];
  double s = 0;
  for (size_t i = 0; i < n; i++) s += exp((double)logits[i] - mx);
  const double lse = mx + log(s);
  for (size_t i = 0; i < n; i++) out[i] = (float)((double)logits[i] - lse);
  return am;
}

bool eval_row_ok(const float *row, size_t n) {
  for (size_t i = 0; i < n; i++)
    if (!(row[i] <= 0.0f) || isinf(row[i])) return false; /* NaN fails the comparison */
  return true;
}

double eval_kld(const float *base, const float *cur, size_t n) {
  double s = 0;
  for (size_t i = 0; i < n; i++) s += exp((double)base[i]) * ((double)base[i] - (double)cur[i]);
  return s;
}

double eval_acc_mean(const eval_acc *a) { return a->n ? a->sum / (double)a->n : 0; }

double eval_acc_err(const eval_acc *a) {
  if (a->n < 2) return 0;
  const double m = a->sum / (double)a->n;
  double var = (a->sum2 - (double)a->n * m * m) / (double)(a->n - 1);
  return var > 0 ? sqrt(var / (double)a->n) : 0;
}
