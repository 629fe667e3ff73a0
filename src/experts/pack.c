/* `floe pack`: routed experts rewritten expert-major (see experts.h).
 *
 * DIR/experts.floepack, little-endian:
 *   header   "FLOEPAK1", u32 version (1), u32 n_layer, u32 n_expert, u32 n_part (3..9: one per matrix,
 *            three for an MLX matrix: codes, scales, biases),
 *            u64 source_size, u64 header_bytes (offset of the first block), u64 file_bytes,
 *            u32 source_len, source path (absolute, no NUL), zero padding to 8;
 *   layers   n_layer x { u64 block_base, u64 block_len, u64 part_off[n_part], u64 part_len[n_part] };
 *   checksums n_layer x n_expert x u64 (xs_checksum of the block's first part_off[last]+part_len[last] bytes);
 *   blocks   from header_bytes (a multiple of 16 KiB): layer l's expert e at block_base[l] + e * block_len[l].
 * A block holds the expert's parts in order gate, up, down (each: codes [, scales, biases] for MLX),
 * each part 64-byte aligned, the block padded to 16 KiB, so one aligned read brings one expert.
 *
 * Non-expert weights are not copied: the pack names its source model (GGUF file or HF/MLX
 * directory) and its size, and floe loads that model and points the experts into the pack. The
 * pack is validated like every reader: every count and offset against the file size, overflow-
 * checked, parts inside their block, file size equal to the header's, source size equal to the
 * recorded one, part sizes equal to the model's. Written to a temp file and renamed when complete. */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/hparams.h"
#include "experts/experts.h"

#define XPACK_MAGIC "FLOEPAK1"

typedef struct xpack_layer {
  uint64_t base, len;
  uint64_t part_off[XS_MAX_PARTS], part_len[XS_MAX_PARTS];
} xpack_layer;

struct xpack {
  char *path;    /* DIR/experts.floepack */
  char *source;
  uint32_t n_layer, n_expert, n_part;
  uint64_t source_size, header_bytes, file_bytes;
  xpack_layer *layer;
  uint64_t *cksum;
  const uint8_t *map;
  uint64_t map_size;
};

static uint64_t rup(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

bool xpack_is_dir(const char *path) {
  char p[PATH_MAX];
  struct stat sb;
  if (stat(path, &sb) || !S_ISDIR(sb.st_mode)) return false;
  snprintf(p, sizeof p, "%s/%s", path, XPACK_FILE);
  return access(p, F_OK) == 0;
}

const char *xpack_source(const xpack *p) { return p->source; }

void xpack_map(const xpack *p, const uint8_t **map, uint64_t *size, const char **path, const uint64_t **cksum) {
  *map = p->map;
  *size = p->map_size;
  *path = p->path;
  *cksum = p->cksum;
}

void xpack_close(xpack *p) {
  if (!p) return;
  if (p->map) munmap((void *)p->map, p->map_size);
  free(p->path);
  free(p->source);
  free(p->layer);
  free(p->cksum);
  free(p);
}

/* Little-endian reader over the header bytes. */
typedef struct rd { const uint8_t *b; uint64_t n, at; bool bad; } rd;
static uint64_t rd_u(rd *r, int w) {
  if (r->at + (uint64_t)w > r->n) {
    r->bad = true;
    return 0;
  }
  uint64_t v = 0;
  for (int i = w - 1; i >= 0; i--) v = v << 8 | r->b[r->at + (uint64_t)i];
  r->at += (uint64_t)w;
  return v;
}

int xpack_open(const char *dir, xpack **out, char *err, size_t errlen) {
  *out = NULL;
  xpack *p = calloc(1, sizeof *p);
  if (!p) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  int rc = 0, fd = -1;
  uint8_t *hb = NULL;
  char path[PATH_MAX];
  snprintf(path, sizeof path, "%s/%s", dir, XPACK_FILE);
  p->path = strdup(path);
  struct stat sb;
  if (!p->path) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto done;
  }
  if ((fd = open(path, O_RDONLY | O_CLOEXEC)) < 0 || fstat(fd, &sb)) {
    rc = floe_err(err, errlen, FLOE_E_IO, "%s: cannot open: %s", path, strerror(errno));
    goto done;
  }
  const uint64_t fsize = (uint64_t)sb.st_size;
  uint8_t h0[48];
  if (fsize < sizeof h0 || pread(fd, h0, sizeof h0, 0) != (ssize_t)sizeof h0 || memcmp(h0, XPACK_MAGIC, 8)) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: not a floe expert pack (bad magic or too short)", path);
    goto done;
  }
  rd r = { h0, sizeof h0, 8, false };
  const uint32_t ver = (uint32_t)rd_u(&r, 4);
  p->n_layer = (uint32_t)rd_u(&r, 4);
  p->n_expert = (uint32_t)rd_u(&r, 4);
  p->n_part = (uint32_t)rd_u(&r, 4);
  p->source_size = rd_u(&r, 8);
  p->header_bytes = rd_u(&r, 8);
  p->file_bytes = rd_u(&r, 8);
  if (ver != 1 || p->n_layer < 1 || p->n_layer > FLOE_MAX_LAYERS || p->n_expert < 1 || p->n_expert > 65536 ||
      p->n_part < 3 || p->n_part > XS_MAX_PARTS || p->header_bytes % XPACK_ALIGN || p->header_bytes > fsize) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: bad header (version %u, %u layers, %u experts, %u parts)", path, ver,
                  p->n_layer, p->n_expert, p->n_part);
    goto done;
  }
  if (p->file_bytes != fsize) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: is %llu bytes but its header says %llu (truncated or damaged)", path,
                  (unsigned long long)fsize, (unsigned long long)p->file_bytes);
    goto done;
  }
  hb = malloc(p->header_bytes);
  if (!hb || pread(fd, hb, p->header_bytes, 0) != (ssize_t)p->header_bytes) {
    rc = floe_err(err, errlen, hb ? FLOE_E_IO : FLOE_E_NOMEM, "%s: cannot read the header", path);
    goto done;
  }
  r = (rd){ hb, p->header_bytes, 48, false };
  const uint64_t sl = rd_u(&r, 4);
  if (r.bad || sl == 0 || sl >= PATH_MAX || r.at + sl > r.n) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: bad source path length", path);
    goto done;
  }
  p->source = strndup((const char *)hb + r.at, sl);
  r.at = rup(r.at + sl, 8);
  p->layer = calloc(p->n_layer, sizeof *p->layer);
  p->cksum = malloc((size_t)p->n_layer * p->n_expert * sizeof *p->cksum);
  if (!p->source || !p->layer || !p->cksum) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto done;
  }
  for (uint32_t l = 0; l < p->n_layer; l++) {
    xpack_layer *L = &p->layer[l];
    L->base = rd_u(&r, 8);
    L->len = rd_u(&r, 8);
    for (uint32_t k = 0; k < p->n_part; k++) L->part_off[k] = rd_u(&r, 8);
    for (uint32_t k = 0; k < p->n_part; k++) L->part_len[k] = rd_u(&r, 8);
    uint64_t span, end, prev = 0;
    bool ok = !r.bad && L->base % XPACK_ALIGN == 0 && L->len % XPACK_ALIGN == 0 && L->len > 0 &&
              L->base >= p->header_bytes && floe_mul_ok(L->len, p->n_expert, &span) && floe_add_ok(L->base, span, &end) &&
              end <= fsize;
    for (uint32_t k = 0; ok && k < p->n_part; k++) {
      uint64_t pe;
      ok = L->part_off[k] >= prev && L->part_off[k] % 64 == 0 && L->part_len[k] > 0 &&
           floe_add_ok(L->part_off[k], L->part_len[k], &pe) && pe <= L->len;
      prev = pe;
    }
    if (!ok) {
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: layer %u: blocks or parts out of range of the file", path, l);
      goto done;
    }
  }
  for (uint64_t i = 0; i < (uint64_t)p->n_layer * p->n_expert; i++) p->cksum[i] = rd_u(&r, 8);
  if (r.bad) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: index larger than the header", path);
    goto done;
  }
  void *m = mmap(NULL, (size_t)fsize, PROT_READ, MAP_PRIVATE, fd, 0);
  if (m == MAP_FAILED) {
    rc = floe_err(err, errlen, FLOE_E_IO, "%s: mmap failed: %s", path, strerror(errno));
    goto done;
  }
  p->map = m;
  p->map_size = fsize;
done:
  if (fd >= 0) close(fd);
  free(hb);
  if (rc) xpack_close(p);
  else *out = p;
  return rc;
}

int xpack_bind(const xpack *p, const xs_model *m, char *err, size_t errlen) {
  struct stat sb;
  if (stat(p->source, &sb) == 0 && !S_ISDIR(sb.st_mode) && (uint64_t)sb.st_size != p->source_size)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: its source %s is %llu bytes, the pack was made from %llu bytes",
                    p->path, p->source, (unsigned long long)sb.st_size, (unsigned long long)p->source_size);
  if ((int64_t)p->n_layer != m->n_layer || (int64_t)p->n_expert != m->n_expert)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %u layers x %u experts, the model has %lld x %lld", p->path,
                    p->n_layer, p->n_expert, (long long)m->n_layer, (long long)m->n_expert);
  for (uint32_t l = 0; l < p->n_layer; l++) {
    const xpack_layer *X = &p->layer[l];
    floe_mat *w[3] = { m->gate[l], m->up[l], m->down[l] };
    const floe_mat *w0[3] = { &w[0][0], &w[1][0], &w[2][0] };
    uint8_t pm[XS_MAX_PARTS], pk[XS_MAX_PARTS];
    const int np = xs_parts(w0, pm, pk);
    if ((uint32_t)np != p->n_part)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: %u parts per expert, the model's experts have %d", p->path,
                      p->n_part, np);
    for (uint32_t k = 0; k < p->n_part; k++)
      if (xs_part_len(w0[pm[k]], pk[k]) != X->part_len[k])
        return floe_err(err, errlen, FLOE_E_FORMAT, "%s: layer %u part %u is %llu bytes, the model's is %llu", p->path,
                        l, k, (unsigned long long)X->part_len[k], (unsigned long long)xs_part_len(w0[pm[k]], pk[k]));
    for (uint32_t e = 0; e < p->n_expert; e++) {
      const uint8_t *b = p->map + X->base + (uint64_t)e * X->len;
      for (uint32_t k = 0; k < p->n_part; k++) xs_part_set(&w[pm[k]][e], pk[k], b + X->part_off[k]);
    }
  }
  return 0;
}

/* ---- writer ---- */
typedef struct wbuf { uint8_t *b; size_t n, cap; } wbuf;
static int wb_put(wbuf *w, uint64_t v, int width) {
  if (w->n + (size_t)width > w->cap) {
    size_t cap = w->cap ? w->cap * 2 : 4096;
    uint8_t *nb = realloc(w->b, cap);
    if (!nb) return -1;
    memset(nb + w->cap, 0, cap - w->cap);
    w->b = nb;
    w->cap = cap;
  }
  for (int i = 0; i < width; i++) w->b[w->n++] = (uint8_t)(v >> (8 * i));
  return 0;
}

static int write_all(int fd, const void *b, size_t n, uint64_t off) {
  const uint8_t *p = b;
  while (n) {
    ssize_t k = pwrite(fd, p, n, (off_t)off);
    if (k < 0 && errno == EINTR) continue;
    if (k <= 0) return -1;
    p += k;
    n -= (size_t)k;
    off += (uint64_t)k;
  }
  return 0;
}

int xpack_write(const xs_model *m, const char *source, const char *dir, char *err, size_t errlen) {
  xs_store *st = NULL;
  int rc = xs_store_open(m, false, &st, err, errlen); /* where the source's experts are */
  if (rc) return rc;
  const int NL = st->n_layer, NE = st->n_expert, NP = st->layer[0].n_part;
  char src_abs[PATH_MAX], path[PATH_MAX], tmp[PATH_MAX + 32];
  struct stat sb;
  uint8_t *blk = NULL;
  uint64_t *ck = NULL;
  xpack_layer *lay = NULL;
  wbuf h = { 0 };
  int fd = -1;
  if (!realpath(source, src_abs) || stat(src_abs, &sb)) {
    rc = floe_err(err, errlen, FLOE_E_IO, "%s: %s", source, strerror(errno));
    goto done;
  }
  if (mkdir(dir, 0755) && errno != EEXIST) {
    rc = floe_err(err, errlen, FLOE_E_IO, "%s: cannot create: %s", dir, strerror(errno));
    goto done;
  }
  snprintf(path, sizeof path, "%s/%s", dir, XPACK_FILE);
  snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
  lay = calloc((size_t)NL, sizeof *lay);
  ck = calloc((size_t)NL * (size_t)NE, sizeof *ck);
  if (!lay || !ck) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto done;
  }
  /* layout: parts 64-byte aligned inside a block padded to 16 KiB */
  const size_t hsz = 48 + 4 + rup(strlen(src_abs), 8) + 8 + (size_t)NL * (16 + 16 * (size_t)NP) + (size_t)NL * NE * 8;
  uint64_t at = rup(hsz, XPACK_ALIGN), maxblk = 0;
  const uint64_t header_bytes = at;
  for (int l = 0; l < NL; l++) {
    const xs_layer *xl = &st->layer[l];
    if (xl->n_part != NP) {
      rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED, "layers with different expert layouts");
      goto done;
    }
    uint64_t o = 0;
    for (int k = 0; k < NP; k++) {
      lay[l].part_off[k] = o;
      lay[l].part_len[k] = xl->len[k];
      o = rup(o + xl->len[k], 64);
    }
    lay[l].len = rup(o, XPACK_ALIGN);
    lay[l].base = at;
    at += lay[l].len * (uint64_t)NE;
    if (lay[l].len > maxblk) maxblk = lay[l].len;
  }
  const uint64_t file_bytes = at;
  blk = malloc(maxblk);
  if (!blk || (fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644)) < 0) {
    rc = floe_err(err, errlen, blk ? FLOE_E_IO : FLOE_E_NOMEM, "%s: cannot create: %s", tmp, strerror(errno));
    goto done;
  }
  for (int l = 0; l < NL; l++) {
    const xs_layer *xl = &st->layer[l];
    for (int e = 0; e < NE; e++) {
      memset(blk, 0, lay[l].len);
      for (int k = 0; k < NP; k++) {
        const xs_file *f = &st->file[xl->file[k]];
        const uint64_t off = xl->off[(size_t)e * NP + k];
        uint64_t got = 0;
        while (got < xl->len[k]) {
          ssize_t r = pread(f->fd, blk + lay[l].part_off[k] + got, xl->len[k] - got, (off_t)(off + got));
          if (r < 0 && errno == EINTR) continue;
          if (r <= 0) {
            rc = floe_err(err, errlen, FLOE_E_IO, "%s: layer %d expert %d: read failed", f->path, l, e);
            goto done;
          }
          got += (uint64_t)r;
        }
      }
      ck[(size_t)l * NE + e] = xs_checksum(blk, lay[l].part_off[NP - 1] + lay[l].part_len[NP - 1]);
      if (write_all(fd, blk, lay[l].len, lay[l].base + (uint64_t)e * lay[l].len)) {
        rc = floe_err(err, errlen, FLOE_E_IO, "%s: write failed: %s", tmp, strerror(errno));
        goto done;
      }
      floe_thread_progress(lay[l].base + (uint64_t)(e + 1) * lay[l].len, file_bytes);
    }
    posix_fadvise(st->file[xl->file[0]].fd, 0, 0, POSIX_FADV_DONTNEED); /* don't keep the copy in the page cache */
  }
  bool bad = false;
  for (int i = 0; i < 8; i++) bad |= wb_put(&h, (uint8_t)XPACK_MAGIC[i], 1) != 0;
  bad |= wb_put(&h, 1, 4) || wb_put(&h, (uint64_t)NL, 4) || wb_put(&h, (uint64_t)NE, 4) || wb_put(&h, (uint64_t)NP, 4);
  bad |= wb_put(&h, (uint64_t)sb.st_size, 8) || wb_put(&h, header_bytes, 8) || wb_put(&h, file_bytes, 8);
  bad |= wb_put(&h, strlen(src_abs), 4);
  for (const char *c = src_abs; *c; c++) bad |= wb_put(&h, (uint8_t)*c, 1) != 0;
  while (h.n % 8) bad |= wb_put(&h, 0, 1) != 0;
  for (int l = 0; l < NL; l++) {
    bad |= wb_put(&h, lay[l].base, 8) || wb_put(&h, lay[l].len, 8);
    for (int k = 0; k < NP; k++) bad |= wb_put(&h, lay[l].part_off[k], 8) != 0;
    for (int k = 0; k < NP; k++) bad |= wb_put(&h, lay[l].part_len[k], 8) != 0;
  }
  for (size_t i = 0; i < (size_t)NL * NE; i++) bad |= wb_put(&h, ck[i], 8) != 0;
  if (bad || h.n > header_bytes) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "pack header: out of memory");
    goto done;
  }
  if (write_all(fd, h.b, h.n, 0) || ftruncate(fd, (off_t)file_bytes) || fsync(fd)) {
    rc = floe_err(err, errlen, FLOE_E_IO, "%s: write failed: %s", tmp, strerror(errno));
    goto done;
  }
  close(fd);
  fd = -1;
  if (rename(tmp, path)) {
    rc = floe_err(err, errlen, FLOE_E_IO, "%s: rename failed: %s", path, strerror(errno));
    goto done;
  }
done:
  if (fd >= 0) {
    close(fd);
    unlink(tmp);
  }
  free(h.b);
  free(blk);
  free(ck);
  free(lay);
  xs_store_close(st);
  return rc;
}
