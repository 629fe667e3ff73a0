/* safetensors reader: see safetensors.h for the format and the checks made.
 *
 * One st_model holds every shard (its mapping and __metadata__) and one table of all tensors with
 * an open-addressing hash from name to index, so a 70k-tensor BF16 checkpoint finds by name in
 * O(1). The header JSON is copied into a NUL-terminated buffer before cJSON sees it, so the parser
 * never reads the mapping past the header. */
#include "format/safetensors.h"

#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"

typedef struct st_shard {
  char *path;               /* as opened (or the buffer's name) */
  const uint8_t *map;       /* whole file */
  uint64_t size;
  bool mapped;              /* floe_unmap_file on close (false for caller buffers) */
  size_t map_len;
  int fd;                   /* the mapped file, kept open to notice it shrinking; -1 if none */
  uint64_t data_start;      /* 8 + header length */
  size_t n_meta;
  char **meta_key, **meta_val;
} st_shard;

struct st_model {
  bool copy;                /* shards read into huge-page memory (floe_map_file) */
  st_shard *shards;
  int n_shards;
  st_tensor *tensors;
  size_t n_tensors, cap_tensors;
  uint32_t *hash; /* tensor index + 1, 0 = empty slot */
  size_t hash_cap; /* power of two */
};

/* ---- dtypes ---- */

static const struct { const char *name; size_t size; bool compute; } k_dtypes[ST_DTYPE_COUNT] = {
  [ST_F32] = {"F32", 4, true},   [ST_F16] = {"F16", 2, true},   [ST_BF16] = {"BF16", 2, true},
  [ST_U8] = {"U8", 1, true},     [ST_I8] = {"I8", 1, true},     [ST_U32] = {"U32", 4, true},
  [ST_I32] = {"I32", 4, true},   [ST_I64] = {"I64", 8, true},   [ST_F64] = {"F64", 8, false},
  [ST_I16] = {"I16", 2, false},  [ST_U16] = {"U16", 2, false},  [ST_U64] = {"U64", 8, false},
  [ST_BOOL] = {"BOOL", 1, false}, [ST_F8_E4M3] = {"F8_E4M3", 1, false},
  [ST_F8_E5M2] = {"F8_E5M2", 1, false},
};

const char *st_dtype_name(int dtype) {
  return dtype >= 0 && dtype < ST_DTYPE_COUNT ? k_dtypes[dtype].name : "?";
}
int st_dtype_from_name(const char *name) {
  for (int i = 0; i < ST_DTYPE_COUNT; i++)
    if (strcmp(name, k_dtypes[i].name) == 0) return i;
  return -1;
}
size_t st_dtype_size(int dtype) {
  return dtype >= 0 && dtype < ST_DTYPE_COUNT ? k_dtypes[dtype].size : 0;
}
bool st_dtype_supported(int dtype) {
  return dtype >= 0 && dtype < ST_DTYPE_COUNT && k_dtypes[dtype].compute;
}

/* ---- small helpers ---- */

static uint64_t rd_le64(const uint8_t *p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; i--) v = (v << 8) | p[i];
  return v;
}

/* A JSON number that is a non-negative integer exactly representable as a double. */
static bool json_u64(const cJSON *it, uint64_t *out) {
  if (!cJSON_IsNumber(it)) return false;
  double d = it->valuedouble;
  if (!(d >= 0.0) || d > 9007199254740991.0 || d != (double)(uint64_t)d) return false;
  *out = (uint64_t)d;
  return true;
}

static char *xstrdup(const char *s) {
  size_t n = strlen(s) + 1;
  char *p = malloc(n);
  if (p) memcpy(p, s, n);
  return p;
}

static uint64_t hash_str(const char *s) { /* FNV-1a */
  uint64_t h = 1469598103934665603ull;
  for (; *s; s++) h = (h ^ (unsigned char)*s) * 1099511628211ull;
  return h;
}

/* ---- name index ---- */

static size_t hash_slot(const st_model *m, const char *name) {
  size_t mask = m->hash_cap - 1, i = (size_t)hash_str(name) & mask;
  while (m->hash[i] && strcmp(m->tensors[m->hash[i] - 1].name, name) != 0) i = (i + 1) & mask;
  return i;
}

static int hash_grow(st_model *m) {
  size_t cap = m->hash_cap ? m->hash_cap * 2 : 64;
  uint32_t *h = calloc(cap, sizeof *h);
  if (!h) return -1;
  free(m->hash);
  m->hash = h;
  m->hash_cap = cap;
  for (size_t t = 0; t < m->n_tensors; t++) m->hash[hash_slot(m, m->tensors[t].name)] = (uint32_t)(t + 1);
  return 0;
}

const st_tensor *st_find(const st_model *m, const char *name) {
  if (!m || !m->hash_cap) return NULL;
  uint32_t v = m->hash[hash_slot(m, name)];
  return v ? &m->tensors[v - 1] : NULL;
}

size_t st_count(const st_model *m) { return m ? m->n_tensors : 0; }
const st_tensor *st_tensor_at(const st_model *m, size_t i) {
  return m && i < m->n_tensors ? &m->tensors[i] : NULL;
}
int st_n_shards(const st_model *m) { return m ? m->n_shards : 0; }
const char *st_shard_path(const st_model *m, int shard) {
  return m && shard >= 0 && shard < m->n_shards ? m->shards[shard].path : NULL;
}
const char *st_meta(const st_model *m, const char *key) {
  if (!m) return NULL;
  for (int s = 0; s < m->n_shards; s++)
    for (size_t i = 0; i < m->shards[s].n_meta; i++)
      if (strcmp(m->shards[s].meta_key[i], key) == 0) return m->shards[s].meta_val[i];
  return NULL;
}

void st_model_close(st_model *m) {
  if (!m) return;
  for (int s = 0; s < m->n_shards; s++) {
    st_shard *sh = &m->shards[s];
    if (sh->mapped && sh->map) floe_unmap_file(sh->map, sh->map_len);
    if (sh->fd >= 0) close(sh->fd);
    for (size_t i = 0; i < sh->n_meta; i++) { free(sh->meta_key[i]); free(sh->meta_val[i]); }
    free(sh->meta_key);
    free(sh->meta_val);
    free(sh->path);
  }
  for (size_t t = 0; t < m->n_tensors; t++) free((char *)m->tensors[t].name);
  free(m->shards);
  free(m->tensors);
  free(m->hash);
  free(m);
}

static st_shard *add_shard(st_model *m, const char *path) {
  st_shard *s = realloc(m->shards, (size_t)(m->n_shards + 1) * sizeof *s);
  if (!s) return NULL;
  m->shards = s;
  s = &m->shards[m->n_shards];
  memset(s, 0, sizeof *s);
  s->fd = -1;
  if (!(s->path = xstrdup(path))) return NULL;
  m->n_shards++;
  return s;
}

/* ---- one shard's header ---- */

static void fmt_shape(const st_tensor *t, char *buf, size_t n) {
  size_t j = (size_t)snprintf(buf, n, "[");
  for (int d = 0; d < t->n_dims && j < n; d++)
    j += (size_t)snprintf(buf + j, n - j, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
  if (j < n) snprintf(buf + j, n - j, "]");
}

static int parse_metadata(st_shard *sh, const cJSON *meta, char *err, size_t errlen) {
  char cb[256];
  if (cJSON_IsNull(meta)) return 0;
  if (!cJSON_IsObject(meta))
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: __metadata__ is not an object", sh->path);
  size_t n = (size_t)cJSON_GetArraySize(meta);
  sh->meta_key = calloc(n ? n : 1, sizeof(char *));
  sh->meta_val = calloc(n ? n : 1, sizeof(char *));
  if (!sh->meta_key || !sh->meta_val) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", sh->path);
  for (const cJSON *kv = meta->child; kv; kv = kv->next) {
    if (!cJSON_IsString(kv) || !kv->valuestring)
      return floe_err(err, errlen, FLOE_E_FORMAT, "%s: __metadata__ value of '%s' is not a string", sh->path,
                      floe_show(cb, sizeof cb, kv->string));
    size_t i = sh->n_meta;
    sh->meta_key[i] = xstrdup(kv->string);
    sh->meta_val[i] = xstrdup(kv->valuestring);
    sh->n_meta++;
    if (!sh->meta_key[i] || !sh->meta_val[i]) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", sh->path);
  }
  return 0;
}

/* Validates one tensor entry of shard `si` and appends it to m. */
static int parse_tensor(st_model *m, int si, const cJSON *e, uint64_t data_size, char *err, size_t errlen) {
  const st_shard *sh = &m->shards[si];
  char cb[256], shp[256];
  const char *nm = floe_show(cb, sizeof cb, e->string);
  if (!cJSON_IsObject(e))
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': entry is not an object", sh->path, nm);
  const cJSON *jd = cJSON_GetObjectItemCaseSensitive(e, "dtype");
  const cJSON *js = cJSON_GetObjectItemCaseSensitive(e, "shape");
  const cJSON *jo = cJSON_GetObjectItemCaseSensitive(e, "data_offsets");
  if (!jd || !js || !jo)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': missing field '%s'", sh->path, nm,
                    !jd ? "dtype" : !js ? "shape" : "data_offsets");
  if (!cJSON_IsString(jd) || !jd->valuestring)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': dtype is not a string", sh->path, nm);
  st_tensor t;
  memset(&t, 0, sizeof t);
  t.dtype = st_dtype_from_name(jd->valuestring);
  if (t.dtype < 0) {
    char db[64];
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: tensor '%s': unknown dtype '%s'", sh->path, nm,
                    floe_show(db, sizeof db, jd->valuestring));
  }
  if (!cJSON_IsArray(js))
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': shape is not an array", sh->path, nm);
  int nd = cJSON_GetArraySize(js);
  if (nd > ST_MAX_DIMS)
    return floe_err(err, errlen, FLOE_E_UNSUPPORTED, "%s: tensor '%s': shape has %d dims (max %d)", sh->path, nm,
                    nd, ST_MAX_DIMS);
  t.n_dims = nd;
  uint64_t nel = 1;
  int d = 0;
  for (const cJSON *x = js->child; x; x = x->next, d++) {
    uint64_t v;
    if (!json_u64(x, &v)) {
      if (cJSON_IsNumber(x) && x->valuedouble < 0)
        return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': shape dim %d is negative (%.0f)", sh->path,
                        nm, d, x->valuedouble);
      return floe_err(err, errlen, cJSON_IsNumber(x) && x->valuedouble > 9007199254740991.0 ? FLOE_E_OVERFLOW : FLOE_E_FORMAT,
                      "%s: tensor '%s': shape dim %d is not an integer in [0, 2^53)", sh->path, nm, d);
    }
    if (v > INT64_MAX || !floe_mul_ok(nel, v, &nel) || nel > INT64_MAX)
      return floe_err(err, errlen, FLOE_E_OVERFLOW, "%s: tensor '%s': shape element count overflows", sh->path, nm);
    t.shape[d] = (int64_t)v;
  }
  for (int k = nd; k < ST_MAX_DIMS; k++) t.shape[k] = 1;
  t.n_elements = (int64_t)nel;
  if (!floe_mul_ok(nel, st_dtype_size(t.dtype), &t.nbytes))
    return floe_err(err, errlen, FLOE_E_OVERFLOW, "%s: tensor '%s': byte size of shape overflows", sh->path, nm);
  uint64_t b, en;
  if (!cJSON_IsArray(jo) || cJSON_GetArraySize(jo) != 2 || !json_u64(jo->child, &b) ||
      !json_u64(jo->child->next, &en))
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': data_offsets is not [begin, end] of integers >= 0",
                    sh->path, nm);
  if (b > en)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) has begin > end",
                    sh->path, nm, (unsigned long long)b, (unsigned long long)en);
  if (en - b != t.nbytes) {
    fmt_shape(&t, shp, sizeof shp);
    return floe_err(err, errlen, FLOE_E_FORMAT,
                    "%s: tensor '%s': data_offsets [%llu, %llu) hold %llu bytes but shape %s of %s needs %llu",
                    sh->path, nm, (unsigned long long)b, (unsigned long long)en, (unsigned long long)(en - b), shp,
                    st_dtype_name(t.dtype), (unsigned long long)t.nbytes);
  }
  if (en > data_size)
    return floe_err(err, errlen, FLOE_E_FORMAT,
                    "%s: tensor '%s': data_offsets [%llu, %llu) end past the data section (%llu bytes; file truncated?)",
                    sh->path, nm, (unsigned long long)b, (unsigned long long)en, (unsigned long long)data_size);
  t.offset = b;
  t.data = sh->map + sh->data_start + b;
  t.shard = si;
  if (st_find(m, e->string))
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': duplicate name (also in %s)", sh->path, nm,
                    m->shards[st_find(m, e->string)->shard].path);
  if (m->n_tensors >= UINT32_MAX - 1)
    return floe_err(err, errlen, FLOE_E_OVERFLOW, "%s: too many tensors", sh->path);
  if (m->n_tensors == m->cap_tensors) {
    size_t cap = m->cap_tensors ? m->cap_tensors * 2 : 256;
    st_tensor *nt = realloc(m->tensors, cap * sizeof *nt);
    if (!nt) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", sh->path);
    m->tensors = nt;
    m->cap_tensors = cap;
  }
  if ((m->n_tensors + 1) * 2 > m->hash_cap && hash_grow(m) != 0)
    return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", sh->path);
  if (!(t.name = xstrdup(e->string))) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", sh->path);
  m->tensors[m->n_tensors] = t;
  m->hash[hash_slot(m, t.name)] = (uint32_t)(m->n_tensors + 1);
  m->n_tensors++;
  return 0;
}

/* Rejects two non-empty tensors of one shard sharing bytes: tensors [t0, t1) of m. */
static int check_overlap(st_model *m, size_t t0, size_t t1, char *err, size_t errlen) {
  size_t n = 0, *ix = malloc((t1 - t0 + 1) * sizeof *ix);
  if (!ix) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  for (size_t t = t0; t < t1; t++)
    if (m->tensors[t].nbytes) ix[n++] = t;
  /* Sort by offset with a bottom-up merge sort (qsort has no context pointer and qsort_r is not
   * C11); then each range only needs checking against its predecessor. */
  size_t *tmp = malloc((n + 1) * sizeof *tmp);
  if (!tmp) { free(ix); return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory"); }
  for (size_t w = 1; w < n; w *= 2) {
    for (size_t lo = 0; lo < n; lo += 2 * w) {
      size_t mid = lo + w < n ? lo + w : n, hi = lo + 2 * w < n ? lo + 2 * w : n, i = lo, j = mid, k = lo;
      while (i < mid && j < hi)
        tmp[k++] = m->tensors[ix[j]].offset < m->tensors[ix[i]].offset ? ix[j++] : ix[i++];
      while (i < mid) tmp[k++] = ix[i++];
      while (j < hi) tmp[k++] = ix[j++];
    }
    memcpy(ix, tmp, n * sizeof *ix);
  }
  free(tmp);
  int rc = 0;
  for (size_t k = 1; k < n && rc == 0; k++) {
    const st_tensor *a = &m->tensors[ix[k - 1]], *b = &m->tensors[ix[k]];
    if (b->offset < a->offset + a->nbytes) {
      char ca[256], cb2[256];
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s': data_offsets [%llu, %llu) overlap tensor '%s' [%llu, %llu)",
                    m->shards[b->shard].path, floe_show(cb2, sizeof cb2, b->name), (unsigned long long)b->offset,
                    (unsigned long long)(b->offset + b->nbytes), floe_show(ca, sizeof ca, a->name),
                    (unsigned long long)a->offset, (unsigned long long)(a->offset + a->nbytes));
    }
  }
  free(ix);
  return rc;
}

/* Parses and validates the header of shard si (its map/size already set). */
static int parse_shard(st_model *m, int si, char *err, size_t errlen) {
  st_shard *sh = &m->shards[si];
  if (sh->size < 8)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: file is %llu bytes, too small for the 8-byte header length",
                    sh->path, (unsigned long long)sh->size);
  uint64_t n = rd_le64(sh->map);
  if (n > ST_MAX_HEADER)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: header length %llu exceeds the %u-byte limit (not a safetensors file?)",
                    sh->path, (unsigned long long)n, ST_MAX_HEADER);
  if (n > sh->size - 8)
    return floe_err(err, errlen, FLOE_E_FORMAT, "%s: header length %llu runs past end of file (%llu bytes)",
                    sh->path, (unsigned long long)n, (unsigned long long)sh->size);
  if (n < 2) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: header length %llu is too small for JSON", sh->path,
                             (unsigned long long)n);
  sh->data_start = 8 + n;
  char *txt = malloc(n + 1);
  if (!txt) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory for a %llu-byte header", sh->path,
                            (unsigned long long)n);
  memcpy(txt, sh->map + 8, n);
  txt[n] = 0;
  const char *end = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(txt, n, &end, 0);
  int rc = 0;
  if (!root) {
    long at = end ? (long)(end - txt) : -1;
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: header JSON parse error at byte %ld of %llu", sh->path, at,
                  (unsigned long long)n);
    goto done;
  }
  for (const char *p = end; p < txt + n; p++)
    if (*p != ' ' && *p != '\t' && *p != '\n' && *p != '\r') {
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: header JSON has trailing bytes at byte %ld", sh->path,
                    (long)(p - txt));
      goto done;
    }
  if (!cJSON_IsObject(root)) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: header JSON is not an object", sh->path);
    goto done;
  }
  size_t t0 = m->n_tensors;
  bool seen_meta = false;
  for (const cJSON *e = root->child; e && rc == 0; e = e->next) {
    if (strcmp(e->string, "__metadata__") == 0) {
      if (seen_meta) rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: duplicate __metadata__", sh->path);
      else rc = parse_metadata(sh, e, err, errlen);
      seen_meta = true;
    } else {
      rc = parse_tensor(m, si, e, sh->size - sh->data_start, err, errlen);
    }
  }
  if (rc == 0) rc = check_overlap(m, t0, m->n_tensors, err, errlen);
done:
  cJSON_Delete(root);
  free(txt);
  return rc;
}

static int map_shard(st_model *m, const char *path, char *err, size_t errlen) {
  st_shard *sh = add_shard(m, path);
  if (!sh) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", path);
  int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    int e = errno;
    return floe_err(err, errlen, e == ENOENT ? FLOE_E_NOTFOUND : FLOE_E_IO, "%s: cannot open: %s", path, strerror(e));
  }
  struct stat st;
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    close(fd);
    return floe_err(err, errlen, FLOE_E_IO, "%s: not a regular file", path);
  }
  sh->size = (uint64_t)st.st_size;
  if (sh->size > 0) {
    const uint8_t *p;
    int rc = floe_map_file(fd, sh->size, m->copy, path, &p, &sh->map_len, err, errlen);
    if (rc) {
      close(fd);
      return rc;
    }
    sh->map = p;
    sh->mapped = true;
    sh->fd = fd;
  } else {
    close(fd);
  }
  return parse_shard(m, m->n_shards - 1, err, errlen);
}

int st_model_check_unchanged(const st_model *m, char *err, size_t errlen) {
  for (int i = 0; i < m->n_shards; i++) {
    const st_shard *sh = &m->shards[i];
    if (sh->fd < 0) continue;
    struct stat st;
    if (fstat(sh->fd, &st) != 0)
      return floe_err(err, errlen, FLOE_E_IO, "%s: cannot stat: %s", sh->path, strerror(errno));
    if ((uint64_t)st.st_size < sh->size)
      return floe_err(err, errlen, FLOE_E_IO, "%s: file shrank after it was loaded (%llu bytes, now %llu)", sh->path,
                      (unsigned long long)sh->size, (unsigned long long)st.st_size);
  }
  return 0;
}

int st_model_open_buffer(const void *buf, size_t size, const char *name, st_model **out, char *err, size_t errlen) {
  *out = NULL;
  st_model *m = calloc(1, sizeof *m);
  if (!m) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  st_shard *sh = add_shard(m, name ? name : "<buffer>");
  if (!sh) { st_model_close(m); return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory"); }
  sh->map = buf;
  sh->size = size;
  int rc = parse_shard(m, 0, err, errlen);
  if (rc != 0) { st_model_close(m); return rc; }
  *out = m;
  return 0;
}

/* ---- sharded models ---- */

static bool shard_name_ok(const char *s) {
  return s[0] && !strchr(s, '/') && !strchr(s, '\\') && !strstr(s, "..");
}

int st_index_parse(const char *json, size_t len, const char *name, st_index_fn fn, void *ctx, char *err,
                   size_t errlen) {
  char cb[256], cs[256];
  char *txt = malloc(len + 1); /* NUL-terminated copy: cJSON never reads past the caller's bytes */
  if (!txt) return floe_err(err, errlen, FLOE_E_NOMEM, "%s: out of memory", name);
  memcpy(txt, json, len);
  txt[len] = 0;
  cJSON *root = cJSON_ParseWithLength(txt, len);
  free(txt);
  int rc = 0;
  if (!root) return floe_err(err, errlen, FLOE_E_FORMAT, "%s: JSON parse error", name);
  const cJSON *wm = cJSON_IsObject(root) ? cJSON_GetObjectItemCaseSensitive(root, "weight_map") : NULL;
  if (!cJSON_IsObject(wm)) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: no \"weight_map\" object", name);
  } else if (!wm->child) {
    rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: weight_map is empty", name);
  }
  for (const cJSON *e = wm && rc == 0 ? wm->child : NULL; e && rc == 0; e = e->next) {
    if (!cJSON_IsString(e) || !e->valuestring)
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: weight_map['%s'] is not a string", name,
                    floe_show(cb, sizeof cb, e->string));
    else if (!shard_name_ok(e->valuestring))
      rc = floe_err(err, errlen, FLOE_E_FORMAT,
                    "%s: weight_map['%s'] names shard '%s', which is not a plain file name (path traversal?)", name,
                    floe_show(cb, sizeof cb, e->string), floe_show(cs, sizeof cs, e->valuestring));
    else
      rc = fn(e->string, e->valuestring, ctx);
  }
  cJSON_Delete(root);
  return rc;
}

typedef struct idx_entry { char *tensor; int shard; } idx_entry;
typedef struct idx_ctx {
  idx_entry *ents;
  size_t n, cap;
  char **shards; /* unique shard file names, in first-seen order */
  int n_shards;
  int last; /* shard of the previous entry: weight maps are grouped, so this usually hits */
} idx_ctx;

static int idx_add(const char *tensor, const char *shard, void *vctx) {
  idx_ctx *c = vctx;
  int s = -1;
  if (c->last >= 0 && strcmp(c->shards[c->last], shard) == 0) s = c->last;
  for (int i = 0; s < 0 && i < c->n_shards; i++)
    if (strcmp(c->shards[i], shard) == 0) s = i;
  if (s < 0) {
    char **ns = realloc(c->shards, (size_t)(c->n_shards + 1) * sizeof *ns);
    if (!ns) return FLOE_E_NOMEM;
    c->shards = ns;
    if (!(c->shards[c->n_shards] = xstrdup(shard))) return FLOE_E_NOMEM;
    s = c->n_shards++;
  }
  c->last = s;
  if (c->n == c->cap) {
    size_t cap = c->cap ? c->cap * 2 : 256;
    idx_entry *ne = realloc(c->ents, cap * sizeof *ne);
    if (!ne) return FLOE_E_NOMEM;
    c->ents = ne;
    c->cap = cap;
  }
  if (!(c->ents[c->n].tensor = xstrdup(tensor))) return FLOE_E_NOMEM;
  c->ents[c->n++].shard = s;
  return 0;
}

static int open_index(st_model *m, const char *index_path, char *err, size_t errlen) {
  char *json = NULL;
  size_t len = 0;
  int rc = floe_read_file(index_path, ST_MAX_HEADER, &json, &len, err, errlen);
  if (rc != 0) return rc;
  idx_ctx c = {.last = -1};
  rc = st_index_parse(json, len, index_path, idx_add, &c, err, errlen);
  free(json);
  if (rc == FLOE_E_NOMEM) floe_err(err, errlen, rc, "%s: out of memory", index_path); /* from idx_add */
  /* shard files live in the index's directory */
  const char *slash = strrchr(index_path, '/');
  size_t dlen = slash ? (size_t)(slash - index_path + 1) : 0;
  for (int s = 0; s < c.n_shards && rc == 0; s++) {
    size_t pl = dlen + strlen(c.shards[s]) + 1;
    char *p = malloc(pl);
    if (!p) { rc = floe_err(err, errlen, FLOE_E_NOMEM, "out of memory"); break; }
    memcpy(p, index_path, dlen);
    strcpy(p + dlen, c.shards[s]);
    rc = map_shard(m, p, err, errlen);
    if (rc == FLOE_E_NOTFOUND)
      floe_err(err, errlen, rc, "%s: shard '%s' listed in %s does not exist", p, c.shards[s], index_path);
    free(p);
  }
  for (size_t i = 0; i < c.n && rc == 0; i++) {
    const st_tensor *t = st_find(m, c.ents[i].tensor);
    char cb[256];
    if (!t)
      rc = floe_err(err, errlen, FLOE_E_NOTFOUND, "%s: tensor '%s' is listed in weight_map but missing from %s",
                    index_path, floe_show(cb, sizeof cb, c.ents[i].tensor), m->shards[c.ents[i].shard].path);
    else if (t->shard != c.ents[i].shard)
      rc = floe_err(err, errlen, FLOE_E_FORMAT, "%s: tensor '%s' is listed in weight_map for %s but lives in %s",
                    index_path, floe_show(cb, sizeof cb, c.ents[i].tensor), m->shards[c.ents[i].shard].path,
                    m->shards[t->shard].path);
  }
  for (size_t i = 0; i < c.n; i++) free(c.ents[i].tensor);
  for (int s = 0; s < c.n_shards; s++) free(c.shards[s]);
  free(c.ents);
  free(c.shards);
  return rc;
}

static bool ends_with(const char *s, const char *suf) {
  size_t a = strlen(s), b = strlen(suf);
  return a >= b && strcmp(s + a - b, suf) == 0;
}

int st_model_open(const char *path, st_model **out, char *err, size_t errlen) {
  return st_model_open_ex(path, false, out, err, errlen);
}

int st_model_open_ex(const char *path, bool copy, st_model **out, char *err, size_t errlen) {
  *out = NULL;
  struct stat st;
  if (stat(path, &st) != 0)
    return floe_err(err, errlen, errno == ENOENT ? FLOE_E_NOTFOUND : FLOE_E_IO, "%s: %s", path, strerror(errno));
  st_model *m = calloc(1, sizeof *m);
  if (!m) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
  m->copy = copy;
  int rc;
  if (S_ISDIR(st.st_mode)) {
    size_t pl = strlen(path) + 64;
    char *p = malloc(pl);
    if (!p) { st_model_close(m); return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory"); }
    snprintf(p, pl, "%s/model.safetensors.index.json", path);
    if (access(p, F_OK) == 0) {
      rc = open_index(m, p, err, errlen);
    } else {
      snprintf(p, pl, "%s/model.safetensors", path);
      if (access(p, F_OK) == 0)
        rc = map_shard(m, p, err, errlen);
      else
        rc = floe_err(err, errlen, FLOE_E_NOTFOUND, "%s: no model.safetensors.index.json or model.safetensors", path);
    }
    free(p);
  } else if (ends_with(path, ".json")) {
    rc = open_index(m, path, err, errlen);
  } else {
    rc = map_shard(m, path, err, errlen);
  }
  if (rc != 0) { st_model_close(m); return rc; }
  *out = m;
  return 0;
}
