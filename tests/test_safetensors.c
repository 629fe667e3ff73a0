/* safetensors reader: hand-made fixtures (tests/fixtures/st, made by make.py there), files written
 * here with every dtype, sharded directories, and a malformed set where every case asserts the
 * error code and a substring that tells it apart from the others. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "format/safetensors.h"
#include "test.h"

static char err[512];

static void write_file(const char *path, const void *buf, size_t n) {
  FILE *f = fopen(path, "wb");
  if (!f) { printf("cannot write %s\n", path); exit(2); }
  if (n) fwrite(buf, 1, n, f);
  fclose(f);
}

static void write_str(const char *path, const char *s) { write_file(path, s, strlen(s)); }

static uint8_t *read_whole(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  fseek(f, 0, SEEK_END);
  *n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  uint8_t *b = malloc(*n ? *n : 1);
  if (fread(b, 1, *n, f) != *n) { free(b); b = NULL; }
  fclose(f);
  return b;
}

/* A file image: 8-byte length, json, then data_len pattern bytes (byte i = i*31+7). */
static uint8_t *mk(const char *json, size_t data_len, size_t *len) {
  size_t n = strlen(json);
  *len = 8 + n + data_len;
  uint8_t *b = malloc(*len);
  for (int i = 0; i < 8; i++) b[i] = (uint8_t)((uint64_t)n >> (8 * i));
  memcpy(b + 8, json, n);
  for (size_t i = 0; i < data_len; i++) b[8 + n + i] = (uint8_t)(i * 31 + 7);
  return b;
}

/* Opens an image that must fail with `code` and a message containing `sub`. */
static void expect_fail_buf(const uint8_t *b, size_t len, int code, const char *sub, const char *what) {
  st_model *m = (st_model *)1;
  err[0] = 0;
  int rc = st_model_open_buffer(b, len, "bad.safetensors", &m, err, sizeof err);
  CHECK(rc == code && m == NULL && strstr(err, sub) && !strchr(err, '\n'),
        "%s: rc %d (want %d), err \"%s\" (want \"%s\")", what, rc, code, err, sub);
  if (rc == 0) st_model_close(m);
}

static void expect_fail_json(const char *json, size_t data_len, int code, const char *sub) {
  size_t len;
  uint8_t *b = mk(json, data_len, &len);
  expect_fail_buf(b, len, code, sub, json);
  free(b);
}

static void expect_fail_path(const char *path, int code, const char *sub, const char *what) {
  st_model *m = (st_model *)1;
  err[0] = 0;
  int rc = st_model_open(path, &m, err, sizeof err);
  CHECK(rc == code && m == NULL && strstr(err, sub) && !strchr(err, '\n'),
        "%s: rc %d (want %d), err \"%s\" (want \"%s\")", what, rc, code, err, sub);
  if (rc == 0) st_model_close(m);
}

static void test_tiny_fixture(void) {
  SECTION("fixture st/tiny.safetensors: every field and byte");
  st_model *m = NULL;
  int rc = st_model_open(test_fixture("st/tiny.safetensors"), &m, err, sizeof err);
  CHECK(rc == 0 && m, "open: %d %s", rc, err);
  if (!m) return;
  CHECK(st_count(m) == 5, "count %zu", st_count(m));
  CHECK(st_n_shards(m) == 1 && strstr(st_shard_path(m, 0), "tiny.safetensors"), "one shard");
  CHECK(st_meta(m, "format") && !strcmp(st_meta(m, "format"), "pt"), "meta format");
  CHECK(st_meta(m, "note") && !strcmp(st_meta(m, "note"), "floe fixture"), "meta note");
  CHECK(st_meta(m, "nope") == NULL, "meta absent");
  CHECK(st_find(m, "nope") == NULL && st_find(m, "a.bf1") == NULL, "find absent");

  const st_tensor *a = st_find(m, "a.bf16");
  CHECK(a && a->dtype == ST_BF16 && a->n_dims == 2 && a->shape[0] == 2 && a->shape[1] == 3 && a->shape[2] == 1 &&
            a->n_elements == 6 && a->nbytes == 12 && a->offset == 0 && a->shard == 0 && !strcmp(a->name, "a.bf16"),
        "a.bf16 info");
  for (int i = 0; a && i < 6; i++) {
    uint16_t h;
    memcpy(&h, a->data + 2 * i, 2);
    CHECK(floe_bf16_to_f32(h) == (float)(i + 1), "a[%d] = %g", i, floe_bf16_to_f32(h));
  }
  const st_tensor *b = st_find(m, "b.f32");
  float fb[3] = {0};
  if (b) memcpy(fb, b->data, 12);
  CHECK(b && b->dtype == ST_F32 && b->n_dims == 1 && b->shape[0] == 3 && b->offset == 12 && b->nbytes == 12 &&
            fb[0] == 0.5f && fb[1] == -2.0f && fb[2] == 3.25f,
        "b.f32");
  const st_tensor *c = st_find(m, "c.i64");
  int64_t ic[2] = {0};
  if (c) memcpy(ic, c->data, 16);
  CHECK(c && c->dtype == ST_I64 && c->offset == 24 && c->nbytes == 16 && ic[0] == -1 && ic[1] == (int64_t)1 << 40,
        "c.i64");
  const st_tensor *d = st_find(m, "d.u8.empty");
  CHECK(d && d->dtype == ST_U8 && d->n_dims == 1 && d->shape[0] == 0 && d->n_elements == 0 && d->nbytes == 0 &&
            d->offset == 40,
        "d.u8.empty");
  const st_tensor *e = st_find(m, "e.scalar");
  uint16_t he = 0;
  if (e) memcpy(&he, e->data, 2);
  CHECK(e && e->dtype == ST_F16 && e->n_dims == 0 && e->n_elements == 1 && e->nbytes == 2 && he == 0x3c00 &&
            floe_f16_to_f32(he) == 1.0f,
        "e.scalar");
  /* iteration is header order */
  const char *order[5] = {"a.bf16", "b.f32", "c.i64", "d.u8.empty", "e.scalar"};
  for (size_t i = 0; i < 5; i++)
    CHECK(st_tensor_at(m, i) && !strcmp(st_tensor_at(m, i)->name, order[i]), "tensor_at(%zu)", i);
  CHECK(st_tensor_at(m, 5) == NULL, "tensor_at past end");
  /* data pointers lie in the file image at 8 + N + offset */
  size_t n = 0;
  uint8_t *img = read_whole(test_fixture("st/tiny.safetensors"), &n);
  if (!img) { CHECK(0, "cannot read fixture"); st_model_close(m); return; }
  uint64_t hl = 0;
  for (int i = 7; i >= 0; i--) hl = (hl << 8) | img[i];
  CHECK(a && !memcmp(a->data, img + 8 + hl, 42), "data section bytes");
  CHECK(n == 8 + hl + 42, "fixture size %zu", n);
  st_model_close(m);

  /* the buffer path gives the same table */
  rc = st_model_open_buffer(img, n, "tiny", &m, err, sizeof err);
  CHECK(rc == 0 && st_count(m) == 5 && st_find(m, "c.i64")->data == img + 8 + hl + 24, "buffer open: %s", err);
  st_model_close(m);
  /* a directory holding only model.safetensors */
  const char *dir = test_tmp("st_single_dir");
  mkdir(dir, 0755);
  char p[4200];
  snprintf(p, sizeof p, "%s/model.safetensors", dir);
  write_file(p, img, n);
  rc = st_model_open(dir, &m, err, sizeof err);
  CHECK(rc == 0 && st_count(m) == 5 && st_find(m, "e.scalar") && strstr(st_shard_path(m, 0), "model.safetensors"),
        "dir with model.safetensors: %s", err);
  st_model_close(m);

  SECTION("every prefix of tiny.safetensors is rejected");
  for (size_t L = 0; L < n; L++) {
    uint8_t *cut = malloc(L ? L : 1);
    memcpy(cut, img, L);
    const char *sub = L < 8 ? "too small" : L < 8 + hl ? "runs past end of file" : "past the data section";
    char what[64];
    snprintf(what, sizeof what, "prefix %zu", L);
    expect_fail_buf(cut, L, FLOE_E_FORMAT, sub, what);
    free(cut);
  }
  SECTION("every prefix of the header JSON (length adjusted) is rejected");
  for (size_t k = 0; k < hl; k++) {
    /* the real header ends in padding spaces: a prefix that keeps the whole JSON is valid */
    size_t jl = hl;
    while (jl > 0 && img[8 + jl - 1] == ' ') jl--;
    if (k >= jl) break;
    uint8_t *b2 = malloc(8 + k + 42);
    for (int i = 0; i < 8; i++) b2[i] = (uint8_t)((uint64_t)k >> (8 * i));
    memcpy(b2 + 8, img + 8, k);
    memcpy(b2 + 8 + k, img + 8 + hl, 42);
    char what[64];
    snprintf(what, sizeof what, "header prefix %zu", k);
    expect_fail_buf(b2, 8 + k + 42, FLOE_E_FORMAT, k < 2 ? "too small for JSON" : "parse error", what);
    free(b2);
  }
  free(img);
}

static void test_every_dtype(void) {
  SECTION("every dtype, data laid out in reverse header order");
  static const char *names[ST_DTYPE_COUNT] = {"F32", "F16", "BF16", "U8", "I8", "U32", "I32", "I64",
                                              "F64", "I16", "U16", "U64", "BOOL", "F8_E4M3", "F8_E5M2"};
  static const size_t sizes[ST_DTYPE_COUNT] = {4, 2, 2, 1, 1, 4, 4, 8, 8, 2, 2, 8, 1, 1, 1};
  uint64_t off[ST_DTYPE_COUNT], total = 0;
  for (int i = ST_DTYPE_COUNT - 1; i >= 0; i--) { off[i] = total; total += 2 * 3 * 5 * sizes[i]; }
  char json[8192];
  size_t j = (size_t)snprintf(json, sizeof json, "{\"__metadata__\":{\"k\":\"v\\n\\u00e9\"}");
  for (int i = 0; i < ST_DTYPE_COUNT; i++)
    j += (size_t)snprintf(json + j, sizeof json - j,
                          ",\"t.%s\":{\"dtype\":\"%s\",\"shape\":[2,3,5],\"data_offsets\":[%llu,%llu]}", names[i],
                          names[i], (unsigned long long)off[i], (unsigned long long)(off[i] + 30 * sizes[i]));
  snprintf(json + j, sizeof json - j, "}  \n");
  size_t len;
  uint8_t *img = mk(json, total, &len);
  const char *path = test_tmp("st_dtypes.safetensors");
  write_file(path, img, len);
  st_model *m = NULL;
  int rc = st_model_open(path, &m, err, sizeof err);
  CHECK(rc == 0 && st_count(m) == ST_DTYPE_COUNT, "open: %d %s", rc, err);
  if (m) {
    CHECK(st_meta(m, "k") && !strcmp(st_meta(m, "k"), "v\n\xc3\xa9"), "metadata string unescaped");
    for (int i = 0; i < ST_DTYPE_COUNT; i++) {
      char nm[32];
      snprintf(nm, sizeof nm, "t.%s", names[i]);
      const st_tensor *t = st_find(m, nm);
      CHECK(t && t->dtype == i && t->n_dims == 3 && t->shape[0] == 2 && t->shape[1] == 3 && t->shape[2] == 5 &&
                t->shape[3] == 1 && t->n_elements == 30 && t->nbytes == 30 * sizes[i] && t->offset == off[i],
            "%s info", nm);
      CHECK(st_dtype_size(i) == sizes[i] && !strcmp(st_dtype_name(i), names[i]) && st_dtype_from_name(names[i]) == i,
            "%s dtype table", names[i]);
      CHECK(st_dtype_supported(i) == (i <= ST_I64), "%s supported flag", names[i]);
      bool same = t != NULL;
      for (uint64_t k = 0; t && k < t->nbytes; k++) same &= t->data[k] == (uint8_t)((off[i] + k) * 31 + 7);
      CHECK(same, "%s bytes", nm);
    }
    st_model_close(m);
  }
  CHECK(st_dtype_from_name("Q4_K") == -1 && st_dtype_size(-1) == 0 && !strcmp(st_dtype_name(99), "?"), "dtype edges");
  free(img);
}

static void test_sharded(void) {
  SECTION("fixture st/sharded: index json + 2 shards");
  st_model *m = NULL;
  const char *paths[2] = {test_fixture("st/sharded"), test_fixture("st/sharded/model.safetensors.index.json")};
  for (int k = 0; k < 2; k++) {
    int rc = st_model_open(paths[k], &m, err, sizeof err);
    CHECK(rc == 0 && m, "open %s: %d %s", paths[k], rc, err);
    if (!m) continue;
    CHECK(st_count(m) == 3 && st_n_shards(m) == 2, "3 tensors in 2 shards");
    const st_tensor *e = st_find(m, "model.embed_tokens.weight"), *nw = st_find(m, "model.norm.weight"),
                    *lm = st_find(m, "lm_head.weight");
    CHECK(e && nw && lm, "all found");
    if (!e || !nw || !lm) { st_model_close(m); continue; }
    CHECK(strstr(st_shard_path(m, e->shard), "model-00001-of-00002") && e->shard == nw->shard &&
              strstr(st_shard_path(m, lm->shard), "model-00002-of-00002"),
          "shard of each tensor");
    CHECK(e->dtype == ST_BF16 && e->n_dims == 2 && e->shape[0] == 4 && e->shape[1] == 2 && e->nbytes == 16, "embed");
    bool ok = true;
    for (int i = 0; i < 8; i++) {
      uint16_t h;
      memcpy(&h, e->data + 2 * i, 2);
      ok &= floe_bf16_to_f32(h) == (float)i;
    }
    CHECK(ok, "embed values 0..7");
    float f[2];
    memcpy(f, nw->data, 8);
    CHECK(nw->dtype == ST_F32 && f[0] == 1.0f && f[1] == 2.0f && nw->offset == 16, "norm values");
    uint32_t u[2];
    memcpy(u, lm->data, 8);
    CHECK(lm->dtype == ST_U32 && lm->shape[0] == 2 && lm->shape[1] == 1 && u[0] == 0xdeadbeefu && u[1] == 7,
          "lm_head values");
    CHECK(st_meta(m, "format") && !strcmp(st_meta(m, "format"), "pt"), "metadata from shard 1");
    st_model_close(m);
  }
}

/* A sharded dir in tmp: shard s1 = {x}, s2 = {y, z}, and the given index text. */
static const char *mk_shard_dir(const char *name, const char *index) {
  static char dir[4200];
  snprintf(dir, sizeof dir, "%s", test_tmp(name));
  mkdir(dir, 0755);
  char p[4300];
  size_t len;
  uint8_t *b = mk("{\"x\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8, &len);
  snprintf(p, sizeof p, "%s/s1.safetensors", dir);
  write_file(p, b, len);
  free(b);
  b = mk("{\"y\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]},"
         "\"z\":{\"dtype\":\"I8\",\"shape\":[1],\"data_offsets\":[3,4]}}", 4, &len);
  snprintf(p, sizeof p, "%s/s2.safetensors", dir);
  write_file(p, b, len);
  free(b);
  snprintf(p, sizeof p, "%s/model.safetensors.index.json", dir);
  write_str(p, index);
  return dir;
}

static void test_sharded_bad(void) {
  SECTION("sharded: good tmp dir, then malformed indexes");
  const char *dir = mk_shard_dir("st_sh_ok", "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s2.safetensors\"}}");
  st_model *m = NULL;
  int rc = st_model_open(dir, &m, err, sizeof err);
  /* z is in s2 but not in the weight map: still indexed (it is in a listed shard) */
  CHECK(rc == 0 && st_count(m) == 3 && st_find(m, "z") && st_find(m, "z")->shard == st_find(m, "y")->shard,
        "ok dir: %s", err);
  st_model_close(m);

  expect_fail_path(mk_shard_dir("st_sh_missing_t", "{\"weight_map\":{\"x\":\"s1.safetensors\",\"w\":\"s2.safetensors\"}}"),
                   FLOE_E_NOTFOUND, "tensor 'w' is listed in weight_map but missing from", "index names a missing tensor");
  expect_fail_path(mk_shard_dir("st_sh_missing_s", "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s9.safetensors\"}}"),
                   FLOE_E_NOTFOUND, "shard 's9.safetensors' listed in", "index names a missing shard");
  expect_fail_path(mk_shard_dir("st_sh_trav", "{\"weight_map\":{\"x\":\"../x.safetensors\"}}"), FLOE_E_FORMAT,
                   "path traversal", "../ shard");
  expect_fail_path(mk_shard_dir("st_sh_abs", "{\"weight_map\":{\"x\":\"/etc/passwd\"}}"), FLOE_E_FORMAT,
                   "path traversal", "absolute shard");
  expect_fail_path(mk_shard_dir("st_sh_dots", "{\"weight_map\":{\"x\":\"..\"}}"), FLOE_E_FORMAT, "path traversal",
                   ".. shard");
  expect_fail_path(mk_shard_dir("st_sh_wrong", "{\"weight_map\":{\"x\":\"s2.safetensors\"}}"), FLOE_E_NOTFOUND,
                   "tensor 'x' is listed in weight_map but missing from", "tensor listed in the wrong shard");
  expect_fail_path(mk_shard_dir("st_sh_lives", "{\"weight_map\":{\"x\":\"s2.safetensors\",\"y\":\"s1.safetensors\"}}"),
                   FLOE_E_FORMAT, "tensor 'x' is listed in weight_map for", "tensor listed in the other shard");
  expect_fail_path(mk_shard_dir("st_sh_empty", "{\"weight_map\":{}}"), FLOE_E_FORMAT, "weight_map is empty",
                   "empty weight_map");
  expect_fail_path(mk_shard_dir("st_sh_nowm", "{\"metadata\":{}}"), FLOE_E_FORMAT, "no \"weight_map\"",
                   "no weight_map");
  expect_fail_path(mk_shard_dir("st_sh_nostr", "{\"weight_map\":{\"x\":1}}"), FLOE_E_FORMAT, "is not a string",
                   "weight_map value not a string");
  expect_fail_path(mk_shard_dir("st_sh_json", "{\"weight_map\":{\"x\":\"s1.safetensors\""), FLOE_E_FORMAT,
                   "JSON parse error", "index bad JSON");
  /* the same tensor name in two shards */
  const char *d2 = mk_shard_dir("st_sh_dup", "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s2.safetensors\"}}");
  char p[4300];
  size_t len;
  uint8_t *b = mk("{\"x\":{\"dtype\":\"U8\",\"shape\":[3],\"data_offsets\":[0,3]}}", 3, &len);
  snprintf(p, sizeof p, "%s/s2.safetensors", d2);
  write_file(p, b, len);
  free(b);
  expect_fail_path(d2, FLOE_E_FORMAT, "duplicate name (also in", "tensor in two shards");
  /* a shard that is itself malformed: the message names that shard */
  const char *d3 = mk_shard_dir("st_sh_badshard", "{\"weight_map\":{\"x\":\"s1.safetensors\",\"y\":\"s2.safetensors\"}}");
  snprintf(p, sizeof p, "%s/s2.safetensors", d3);
  write_str(p, "junk");
  expect_fail_path(d3, FLOE_E_FORMAT, "s2.safetensors: file is 4 bytes", "malformed shard");

  const char *empty = test_tmp("st_empty_dir");
  mkdir(empty, 0755);
  expect_fail_path(empty, FLOE_E_NOTFOUND, "no model.safetensors.index.json or model.safetensors", "empty dir");
  expect_fail_path(test_tmp("st_does_not_exist.safetensors"), FLOE_E_NOTFOUND, "No such file", "missing file");
}

static void test_malformed(void) {
  SECTION("malformed headers");
  /* header length past EOF / over the cap */
  uint8_t b[16] = {0xff, 0, 0, 0, 0, 0, 0, 0, '{', '}'};
  expect_fail_buf(b, 10, FLOE_E_FORMAT, "header length 255 runs past end of file (10 bytes)", "len past EOF");
  uint8_t big[16] = {0, 0, 0, 0, 0, 0, 0, 0x80};
  expect_fail_buf(big, 16, FLOE_E_FORMAT, "exceeds the", "len huge");
  uint8_t cap[12] = {0x01, 0, 0x40, 0x06}; /* 100 MiB + 1 */
  expect_fail_buf(cap, 12, FLOE_E_FORMAT, "exceeds the 104857600-byte limit", "len over cap");
  expect_fail_buf(b, 0, FLOE_E_FORMAT, "file is 0 bytes, too small", "empty file");

  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}", 4, FLOE_E_FORMAT,
                   "header JSON parse error");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}x", 4, FLOE_E_FORMAT,
                   "trailing bytes");
  expect_fail_json("[1,2,3]", 0, FLOE_E_FORMAT, "header JSON is not an object");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,8]}}", 4, FLOE_E_FORMAT,
                   "tensor 'a': data_offsets [0, 8) hold 8 bytes but shape [1] of F32 needs 4");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 4, FLOE_E_FORMAT,
                   "tensor 'a': data_offsets [0, 8) end past the data section (4 bytes");
  expect_fail_json("{\"model.embed_tokens.weight\":{\"dtype\":\"BF16\",\"shape\":[4,8],\"data_offsets\":[0,100]}}", 100,
                   FLOE_E_FORMAT,
                   "bad.safetensors: tensor 'model.embed_tokens.weight': data_offsets [0, 100) hold 100 bytes but shape "
                   "[4, 8] of BF16 needs 64");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[8,4]}}", 8, FLOE_E_FORMAT,
                   "has begin > end");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   12, FLOE_E_FORMAT, "tensor 'b': data_offsets [4, 12) overlap tensor 'a' [0, 8)");
  expect_fail_json("{\"b\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[4,8]},"
                   "\"a\":{\"dtype\":\"U8\",\"shape\":[8],\"data_offsets\":[0,8]}}",
                   8, FLOE_E_FORMAT, "overlap");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]},"
                   "\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[4,8]}}",
                   8, FLOE_E_FORMAT, "tensor 'a': duplicate name");
  expect_fail_json("{\"a\":{\"dtype\":\"Q4\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FLOE_E_UNSUPPORTED,
                   "unknown dtype 'Q4'");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[2,-3],\"data_offsets\":[0,4]}}", 4, FLOE_E_FORMAT,
                   "shape dim 1 is negative (-3)");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,4]}}", 4,
                   FLOE_E_OVERFLOW, "shape element count overflows");
  expect_fail_json("{\"a\":{\"dtype\":\"F64\",\"shape\":[1152921504606846,4096],\"data_offsets\":[0,4]}}", 4,
                   FLOE_E_OVERFLOW, "byte size of shape overflows");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4, FLOE_E_OVERFLOW,
                   "shape dim 0 is not an integer");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1.5],\"data_offsets\":[0,4]}}", 4, FLOE_E_FORMAT,
                   "shape dim 0 is not an integer");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[\"1\"],\"data_offsets\":[0,4]}}", 4, FLOE_E_FORMAT,
                   "shape dim 0 is not an integer");
  expect_fail_json("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
                   FLOE_E_UNSUPPORTED, "shape has 9 dims (max 8)");
  expect_fail_json("{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FLOE_E_FORMAT, "missing field 'dtype'");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"data_offsets\":[0,4]}}", 4, FLOE_E_FORMAT, "missing field 'shape'");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", 4, FLOE_E_FORMAT, "missing field 'data_offsets'");
  expect_fail_json("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FLOE_E_FORMAT,
                   "dtype is not a string");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":1,\"data_offsets\":[0,4]}}", 4, FLOE_E_FORMAT,
                   "shape is not an array");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4,8]}}", 8, FLOE_E_FORMAT,
                   "data_offsets is not [begin, end]");
  expect_fail_json("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[-4,0]}}", 8, FLOE_E_FORMAT,
                   "data_offsets is not [begin, end]");
  expect_fail_json("{\"a\":[1]}", 0, FLOE_E_FORMAT, "tensor 'a': entry is not an object");
  expect_fail_json("{\"__metadata__\":{\"k\":1}}", 0, FLOE_E_FORMAT, "__metadata__ value of 'k' is not a string");
  expect_fail_json("{\"__metadata__\":[]}", 0, FLOE_E_FORMAT, "__metadata__ is not an object");
  expect_fail_json("{\"__metadata__\":{},\"__metadata__\":{}}", 0, FLOE_E_FORMAT, "duplicate __metadata__");
  expect_fail_json("{\"a\\nb\":{\"dtype\":\"Q\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, FLOE_E_UNSUPPORTED,
                   "tensor 'a?b'");

  SECTION("edge cases that are valid");
  size_t len;
  uint8_t *img = mk("{}", 0, &len);
  st_model *m = NULL;
  CHECK(st_model_open_buffer(img, len, "e", &m, err, sizeof err) == 0 && st_count(m) == 0 && st_find(m, "a") == NULL,
        "empty header {}: %s", err);
  st_model_close(m);
  free(img);
  /* empty tensors may share an offset with anything; gaps and trailing bytes are allowed */
  img = mk("{\"__metadata__\":null,\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[2,6]},"
           "\"e\":{\"dtype\":\"F32\",\"shape\":[0,5],\"data_offsets\":[3,3]}}",
           10, &len);
  m = NULL;
  CHECK(st_model_open_buffer(img, len, "e", &m, err, sizeof err) == 0 && st_count(m) == 2 &&
            st_find(m, "e")->n_elements == 0 && st_find(m, "a")->data[0] == (uint8_t)(2 * 31 + 7),
        "gap, empty tensor inside another, trailing bytes: %s", err);
  st_model_close(m);
  free(img);
  st_model_close(NULL);
}

/* Many tensors: the name index grows and still finds every one. */
static void test_many(void) {
  SECTION("5000 tensors");
  enum { N = 5000 };
  size_t cap = (size_t)N * 100 + 16, j = 0;
  char *json = malloc(cap);
  j += (size_t)snprintf(json + j, cap - j, "{");
  for (int i = 0; i < N; i++)
    j += (size_t)snprintf(json + j, cap - j, "%s\"model.layers.%d.mlp.experts.%d.w\":{\"dtype\":\"U8\",\"shape\":[1],"
                          "\"data_offsets\":[%d,%d]}", i ? "," : "", i / 100, i % 100, i, i + 1);
  snprintf(json + j, cap - j, "}");
  size_t len;
  uint8_t *img = mk(json, N, &len);
  st_model *m = NULL;
  int rc = st_model_open_buffer(img, len, "many", &m, err, sizeof err);
  CHECK(rc == 0 && st_count(m) == N, "open: %s", err);
  int bad = 0;
  for (int i = 0; m && i < N; i++) {
    char nm[64];
    snprintf(nm, sizeof nm, "model.layers.%d.mlp.experts.%d.w", i / 100, i % 100);
    const st_tensor *t = st_find(m, nm);
    bad += !t || t->offset != (uint64_t)i || t != st_tensor_at(m, (size_t)i);
  }
  CHECK(bad == 0, "%d lookups wrong", bad);
  st_model_close(m);
  free(img);
  free(json);
}

int main(void) {
  test_tiny_fixture();
  test_every_dtype();
  test_sharded();
  test_sharded_bad();
  test_malformed();
  test_many();
  return TEST_DONE();
}
