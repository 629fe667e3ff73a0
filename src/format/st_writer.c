/* Small safetensors writer: see st_writer.h. */
#include "format/st_writer.h"

#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "format/safetensors.h"

typedef struct st_wtensor {
  char *name;
  int dtype, n_dims;
  int64_t shape[ST_MAX_DIMS];
  uint8_t *data;
  uint64_t nbytes;
} st_wtensor;

struct st_writer {
  char *path;
  st_wtensor *t;
  size_t n, cap;
  char **meta; /* key, value pairs */
  size_t n_meta;
};

/* A JSON string body we can write without escaping. */
static int name_ok(const char *s) {
  if (!s || !*s) return 0;
  for (const unsigned char *p = (const unsigned char *)s; *p; p++)
    if (*p < 0x20 || *p == '"' || *p == '\\') return 0;
  return 1;
}

static char *dupstr(const char *s) {
  size_t n = strlen(s) + 1;
  char *d = malloc(n);
  if (d) memcpy(d, s, n);
  return d;
}

int st_writer_open(const char *path, st_writer **out, char *err, size_t errlen) {
  *out = NULL;
  st_writer *w = calloc(1, sizeof *w);
  if (!w || !(w->path = dupstr(path))) {
    free(w);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  *out = w;
  return 0;
}

int st_writer_set_meta(st_writer *w, const char *key, const char *value, char *err, size_t errlen) {
  if (!name_ok(key) || !value || !name_ok(value[0] ? value : "x"))
    return floe_err(err, errlen, FLOE_E_INVALID, "safetensors metadata: bad key or value");
  char **m = realloc(w->meta, (w->n_meta + 1) * 2 * sizeof *m);
  if (!m) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  w->meta = m;
  m[2 * w->n_meta] = dupstr(key);
  m[2 * w->n_meta + 1] = dupstr(value);
  w->n_meta++;
  if (!m[2 * w->n_meta - 2] || !m[2 * w->n_meta - 1]) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  return 0;
}

int st_writer_add(st_writer *w, const char *name, int dtype, int n_dims, const int64_t *shape, const void *data,
                  char *err, size_t errlen) {
  if (!name_ok(name)) return floe_err(err, errlen, FLOE_E_INVALID, "safetensors: bad tensor name");
  if (st_dtype_size(dtype) == 0 || n_dims < 0 || n_dims > ST_MAX_DIMS)
    return floe_err(err, errlen, FLOE_E_INVALID, "safetensors: tensor '%s': bad dtype or rank", name);
  for (size_t i = 0; i < w->n; i++)
    if (!strcmp(w->t[i].name, name)) return floe_err(err, errlen, FLOE_E_INVALID, "safetensors: duplicate tensor '%s'", name);
  uint64_t nb = st_dtype_size(dtype);
  for (int i = 0; i < n_dims; i++)
    if (shape[i] < 0 || !floe_mul_ok(nb, (uint64_t)shape[i], &nb))
      return floe_err(err, errlen, FLOE_E_OVERFLOW, "safetensors: tensor '%s': bad shape", name);
  if (w->n == w->cap) {
    size_t cap = w->cap ? 2 * w->cap : 64;
    st_wtensor *t = realloc(w->t, cap * sizeof *t);
    if (!t) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    w->t = t;
    w->cap = cap;
  }
  st_wtensor *t = &w->t[w->n];
  memset(t, 0, sizeof *t);
  t->name = dupstr(name);
  t->data = malloc(nb ? (size_t)nb : 1);
  if (!t->name || !t->data) {
    free(t->name);
    free(t->data);
    return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  }
  memcpy(t->data, data, (size_t)nb);
  t->dtype = dtype;
  t->n_dims = n_dims;
  for (int i = 0; i < n_dims; i++) t->shape[i] = shape[i];
  t->nbytes = nb;
  w->n++;
  return 0;
}

void st_writer_abort(st_writer *w) {
  if (!w) return;
  for (size_t i = 0; i < w->n; i++) {
    free(w->t[i].name);
    free(w->t[i].data);
  }
  for (size_t i = 0; i < 2 * w->n_meta; i++) free(w->meta[i]);
  free(w->meta);
  free(w->t);
  free(w->path);
  free(w);
}

/* Appends printf output to a growing buffer; returns 0 or -1 on allocation failure. */
typedef struct sbuf { char *p; size_t n, cap; } sbuf;
static int sb_printf(sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static int sb_printf(sbuf *b, const char *fmt, ...) {
  for (;;) {
    va_list ap;
    va_start(ap, fmt);
    int k = vsnprintf(b->p ? b->p + b->n : NULL, b->p ? b->cap - b->n : 0, fmt, ap);
    va_end(ap);
    if (k < 0) return -1;
    if (b->p && b->n + (size_t)k < b->cap) {
      b->n += (size_t)k;
      return 0;
    }
    size_t cap = (b->cap + (size_t)k + 1) * 2;
    char *p = realloc(b->p, cap);
    if (!p) return -1;
    b->p = p;
    b->cap = cap;
  }
}

int st_writer_finish(st_writer *w, char *err, size_t errlen) {
  int rc = 0;
  sbuf h = { 0 };
  FILE *f = NULL;
  char tmp[4096];
  snprintf(tmp, sizeof tmp, "%s.tmp.%ld", w->path, (long)getpid());
  int bad = sb_printf(&h, "{");
  if (w->n_meta) {
    bad |= sb_printf(&h, "\"__metadata__\":{");
    for (size_t i = 0; i < w->n_meta; i++)
      bad |= sb_printf(&h, "%s\"%s\":\"%s\"", i ? "," : "", w->meta[2 * i], w->meta[2 * i + 1]);
    bad |= sb_printf(&h, "}%s", w->n ? "," : "");
  }
  uint64_t off = 0;
  for (size_t i = 0; i < w->n; i++) {
    const st_wtensor *t = &w->t[i];
    bad |= sb_printf(&h, "%s\"%s\":{\"dtype\":\"%s\",\"shape\":[", i ? "," : "", t->name, st_dtype_name(t->dtype));
    for (int d = 0; d < t->n_dims; d++) bad |= sb_printf(&h, "%s%lld", d ? "," : "", (long long)t->shape[d]);
    bad |= sb_printf(&h, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)off,
                     (unsigned long long)(off + t->nbytes));
    off += t->nbytes;
  }
  bad |= sb_printf(&h, "}");
  while (!bad && h.n % 8) bad |= sb_printf(&h, " ");
  if (bad) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto done;
  }
  f = fopen(tmp, "wb");
  if (!f) {
    rc = floe_err(err, errlen, FLOE_E_IO, "%s: cannot create: %s", w->path, strerror(errno));
    goto done;
  }
  uint8_t len[8];
  for (int i = 0; i < 8; i++) len[i] = (uint8_t)((uint64_t)h.n >> (8 * i));
  int ok = fwrite(len, 1, 8, f) == 8 && fwrite(h.p, 1, h.n, f) == h.n;
  for (size_t i = 0; ok && i < w->n; i++) ok = fwrite(w->t[i].data, 1, (size_t)w->t[i].nbytes, f) == w->t[i].nbytes;
  if (fclose(f) != 0) ok = 0;
  f = NULL;
  if (!ok || rename(tmp, w->path) != 0) {
    rc = floe_err(err, errlen, FLOE_E_IO, "%s: write failed: %s", w->path, strerror(errno));
    remove(tmp);
  }
done:
  free(h.p);
  st_writer_abort(w);
  return rc;
}
