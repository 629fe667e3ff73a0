/* Expert store: where each routed expert's bytes live (see experts.h).
 *
 * Derived from the resident binding, which points every expert matrix into a file mapping (GGUF,
 * safetensors shards, or a pack): a pointer minus its mapping's base plus the base's file offset is
 * the file offset of those bytes. Only pointers are compared; no expert page is touched.
 * A matrix that the loader had to copy (unaligned safetensors data) has no file offset: such a model
 * cannot stream and is refused with a message. */
#define _GNU_SOURCE /* O_DIRECT */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "experts/experts.h"
#include "format/gguf.h"
#include "format/safetensors.h"

typedef struct xs_map {
  const uint8_t *base; /* first mapped byte */
  uint64_t size;       /* bytes mapped from base */
  uint64_t file_off;   /* file offset of base */
  int file;            /* index into st->file */
} xs_map;

static int add_file(xs_store *st, const char *path, bool direct, char *err, size_t errlen) {
  for (int i = 0; i < st->n_file; i++)
    if (!strcmp(st->file[i].path, path)) return i;
  if (st->n_file == (int)(sizeof st->file / sizeof st->file[0]))
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "experts spread over more than %d files",
                    (int)(sizeof st->file / sizeof st->file[0]));
  xs_file *f = &st->file[st->n_file];
  memset(f, 0, sizeof *f);
  f->fd = f->fd_direct = -1;
  f->path = strdup(path);
  if (!f->path) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  st->n_file++;
  f->fd = open(path, O_RDONLY | O_CLOEXEC);
  struct stat sb;
  if (f->fd < 0 || fstat(f->fd, &sb) != 0)
    return floe_err(err, errlen, FLOE_E_IO, "%s: cannot open for expert reads: %s", path, strerror(errno));
  f->size = (uint64_t)sb.st_size;
  /* experts are read at random: no readahead (the kernel's default window here is 8 MB) */
  posix_fadvise(f->fd, 0, 0, POSIX_FADV_RANDOM);
  if (direct) {
    f->fd_direct = open(path, O_RDONLY | O_CLOEXEC | O_DIRECT);
    if (f->fd_direct < 0)
      return floe_err(err, errlen, FLOE_E_IO, "%s: cannot open with O_DIRECT: %s", path, strerror(errno));
  }
  return st->n_file - 1;
}

/* The mappings of m's sources. */
static int collect_maps(const xs_model *m, xs_store *st, bool direct, xs_map *maps, int *n_maps, char *err, size_t errlen) {
  int n = 0, rc;
  if (m->pack) {
    const uint8_t *map;
    uint64_t size;
    const char *path;
    xpack_map(m->pack, &map, &size, &path, &st->cksum);
    if ((rc = add_file(st, path, direct, err, errlen)) < 0) return rc;
    maps[n++] = (xs_map){ map, size, 0, rc };
  }
  if (m->gguf) {
    if ((rc = add_file(st, m->gguf->path, direct, err, errlen)) < 0) return rc;
    maps[n++] = (xs_map){ m->gguf->map, m->gguf->map_size, 0, rc };
  }
  if (m->st) {
    const int ns = st_n_shards(m->st);
    for (int s = 0; s < ns && n < 16; s++) {
      const st_tensor *any = NULL;
      for (size_t i = 0; i < st_count(m->st) && !any; i++)
        if (st_tensor_at(m->st, i)->shard == s) any = st_tensor_at(m->st, i);
      if (!any) continue;
      const char *path = st_shard_path(m->st, s);
      if ((rc = add_file(st, path, direct, err, errlen)) < 0) return rc;
      uint8_t hb[8];
      if (pread(st->file[rc].fd, hb, 8, 0) != 8)
        return floe_err(err, errlen, FLOE_E_IO, "%s: cannot read the header length", path);
      uint64_t hl = 0;
      for (int i = 7; i >= 0; i--) hl = hl << 8 | hb[i];
      const uint64_t data0 = 8 + hl;
      if (data0 > st->file[rc].size) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: header past the end", path);
      maps[n++] = (xs_map){ any->data - any->offset, st->file[rc].size - data0, data0, rc };
    }
  }
  *n_maps = n;
  return 0;
}

static int locate(const xs_map *maps, int n, const void *p, uint64_t len, int *file, uint64_t *off) {
  const uint8_t *q = p;
  for (int i = 0; i < n; i++)
    if (q >= maps[i].base && (uint64_t)(q - maps[i].base) <= maps[i].size &&
        len <= maps[i].size - (uint64_t)(q - maps[i].base)) {
      *file = maps[i].file;
      *off = maps[i].file_off + (uint64_t)(q - maps[i].base);
      return 0;
    }
  return -1;
}

/* MLX switch_mlp stacks whose slices the loader copied (unaligned safetensors data): the slice of
 * expert e of part p, found by name in the mapping (the names the loader resolves, VLM prefixes
 * included). NULL when the model has no such stack. */
static const void *mlx_slice(const xs_model *m, int l, int p, int e, uint64_t len) {
  static const char *const proj[3] = { "gate_proj", "up_proj", "down_proj" };
  const int j = p / 3, k = p % 3; /* p here is mat * 3 + kind */
  static const char *const kind[3] = { "weight", "scales", "biases" };
  static const char *const pre[3] = { "model.layers", "model.language_model.layers", "language_model.model.layers" };
  if (!m->st) return NULL;
  for (int i = 0; i < 3; i++) {
    char nm[256];
    snprintf(nm, sizeof nm, "%s.%d.mlp.switch_mlp.%s.%s", pre[i], l, proj[j], kind[k]);
    const st_tensor *t = st_find(m->st, nm);
    if (t && t->n_dims == 3 && t->shape[0] == m->n_expert && t->nbytes / (uint64_t)t->shape[0] == len)
      return t->data + (uint64_t)e * len;
  }
  return NULL;
}

static uint64_t round_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

uint64_t xs_checksum(const void *p, size_t n) {
  /* word-wise multiply-rotate (not cryptographic: catches a wrong or damaged block) */
  const uint8_t *b = p;
  uint64_t h = 0x9e3779b97f4a7c15ull ^ (uint64_t)n;
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    uint64_t w;
    memcpy(&w, b + i, 8);
    h = (h ^ w) * 0xff51afd7ed558ccdull;
    h = (h << 29) | (h >> 35);
  }
  for (; i < n; i++) h = (h ^ b[i]) * 0xc4ceb9fe1a85ec53ull;
  return h ^ (h >> 31);
}

/* Matrix bytes of part kind k (0 data, 1 scales, 2 biases). */
const void *xs_part_ptr(const floe_mat *w, int k) { return k == 0 ? w->data : k == 1 ? w->scales : w->biases; }
uint64_t xs_part_len(const floe_mat *w, int k) { return (uint64_t)w->rows * (k == 0 ? w->row_bytes : w->sb_row_bytes); }
void xs_part_set(floe_mat *w, int k, const void *p) {
  if (k == 0) w->data = p;
  else if (k == 1) w->scales = p;
  else w->biases = p;
}

int xs_parts(const floe_mat *const w[3], uint8_t *mat, uint8_t *kind) {
  int n = 0;
  for (int j = 0; j < 3; j++)
    for (int k = 0; k < (w[j]->type == FLOE_TYPE_MLX ? 3 : 1); k++) {
      mat[n] = (uint8_t)j;
      kind[n++] = (uint8_t)k;
    }
  return n;
}

int xs_store_open(const xs_model *m, bool direct, xs_store **out, char *err, size_t errlen) {
  *out = NULL;
  xs_store *st = calloc(1, sizeof *st);
  if (!st) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  st->n_layer = (int)m->n_layer;
  st->n_expert = (int)m->n_expert;
  st->n_used = (int)m->n_expert_used;
  st->layer = calloc((size_t)m->n_layer, sizeof *st->layer);
  xs_map maps[20];
  int n_maps = 0, rc;
  if (!st->layer) {
    rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    goto fail;
  }
  if ((rc = collect_maps(m, st, direct, maps, &n_maps, err, errlen))) goto fail;
  for (int l = 0; l < st->n_layer; l++) {
    xs_layer *xl = &st->layer[l];
    if (!m->gate[l]) {
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "layer %d has no routed experts", l);
      goto fail;
    }
    const floe_mat *w0[3] = { &m->gate[l][0], &m->up[l][0], &m->down[l][0] };
    xl->n_part = xs_parts(w0, xl->part_mat, xl->part_kind);
    for (int j = 0; j < 3; j++) {
      xl->tmpl[j] = *w0[j];
      xl->tmpl[j].data = xl->tmpl[j].scales = xl->tmpl[j].biases = NULL;
      xl->tmpl[j].k4_lanes = 0; /* read from the file: its own layout */
    }
    xl->off = malloc((size_t)st->n_expert * (size_t)xl->n_part * sizeof *xl->off);
    if (!xl->off) {
      rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
      goto fail;
    }
    for (int e = 0; e < st->n_expert; e++) {
      const floe_mat *w[3] = { &m->gate[l][e], &m->up[l][e], &m->down[l][e] };
      for (int p = 0; p < xl->n_part; p++) {
        const int j = xl->part_mat[p], k = xl->part_kind[p];
        const floe_mat *W = w[j];
        const uint64_t len = xs_part_len(W, k);
        int file;
        uint64_t off;
        const void *src = xs_part_ptr(W, k);
        if (locate(maps, n_maps, src, len, &file, &off) && !m->pack) src = mlx_slice(m, l, j * 3 + k, e, len);
        if (W->type != w0[j]->type || W->rows != w0[j]->rows || !src ||
            locate(maps, n_maps, src, len, &file, &off)) {
          rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED,
                        "layer %d expert %d: weights are not a plain range of the model file (copied at load); "
                        "this model cannot stream its experts",
                        l, e);
          goto fail;
        }
        if (e == 0) {
          xl->file[p] = file;
          xl->len[p] = len;
        } else if (file != xl->file[p] || len != xl->len[p]) {
          rc = floe_err(err, errlen, FLOE_E_UNSUPPORTED, "layer %d expert %d: parts in different files or sizes", l, e);
          goto fail;
        }
        xl->off[(size_t)e * xl->n_part + p] = off;
      }
    }
    xl->expert_bytes = 0;
    for (int p = 0; p < xl->n_part; p++) xl->expert_bytes += xl->len[p];
    if (m->pack) {
      xl->block = true;
      for (int p = 0; p < xl->n_part; p++) xl->part_off[p] = xl->off[p] - xl->off[0];
      xl->block_len = round_up(xl->part_off[xl->n_part - 1] + xl->len[xl->n_part - 1], XPACK_ALIGN);
      xl->slot_bytes = xl->block_len;
    } else {
      xl->slot_bytes = 0;
      for (int p = 0; p < xl->n_part; p++) xl->slot_bytes += round_up(xl->len[p], XS_PAGE) + XS_PAGE;
    }
    if (xl->slot_bytes > st->slot_bytes) st->slot_bytes = xl->slot_bytes;
  }
  /* resident: every mapped byte that is not a routed expert of a trunk layer, plus the buffers the
   * loader converted. Unused tensors (MTP blocks) are counted too: an upper bound. */
  uint64_t mapped = 0, experts = 0;
  for (int i = 0; i < n_maps; i++)
    if (!(m->pack && i == 0)) mapped += maps[i].size;
  if (!m->pack)
    for (int l = 0; l < st->n_layer; l++) experts += st->layer[l].expert_bytes * (uint64_t)st->n_expert;
  if (m->gguf) { /* MTP blocks' routed experts are never read either */
    experts = 0;
    for (uint64_t i = 0; i < m->gguf->n_tensors; i++) {
      const gguf_tensor *t = &m->gguf->tensors[i];
      if (memmem(t->name.ptr, t->name.len, "_exps.", 6)) experts += t->size;
    }
  }
  st->resident_bytes = (mapped > experts ? mapped - experts : 0) + m->owned_bytes;
  *out = st;
  return 0;
fail:
  xs_store_close(st);
  return rc;
}

void xs_store_close(xs_store *st) {
  if (!st) return;
  for (int i = 0; i < st->n_file; i++) {
    if (st->file[i].fd >= 0) close(st->file[i].fd);
    if (st->file[i].fd_direct >= 0) close(st->file[i].fd_direct);
    free(st->file[i].path);
  }
  if (st->layer)
    for (int l = 0; l < st->n_layer; l++) free(st->layer[l].off);
  free(st->layer);
  free(st);
}

int xs_store_reads(const xs_store *st, int l, int e, xs_range *r, uint64_t *ptr) {
  const xs_layer *xl = &st->layer[l];
  const uint64_t *off = xl->off + (size_t)e * xl->n_part;
  if (xl->block) {
    r[0] = (xs_range){ xl->file[0], off[0], xl->block_len, xl->block_len, 0 };
    r[0].need = xl->part_off[xl->n_part - 1] + xl->len[xl->n_part - 1]; /* the padding may lie past EOF */
    for (int p = 0; p < xl->n_part; p++) ptr[p] = xl->part_off[p];
    return 1;
  }
  uint64_t dst = 0;
  for (int p = 0; p < xl->n_part; p++) {
    const uint64_t a = off[p] / XS_PAGE * XS_PAGE, end = off[p] + xl->len[p];
    r[p] = (xs_range){ xl->file[p], a, round_up(end, XS_PAGE) - a, end - a, dst };
    ptr[p] = dst + (off[p] - a);
    dst += round_up(xl->len[p], XS_PAGE) + XS_PAGE;
  }
  return xl->n_part;
}
