/* Malformed GGUF files: each variant is made in memory from a valid small file written by the
 * writer (field offsets found by parsing that file), then corrupted; the reader must refuse it
 * with the expected error code and a one-line message that names the file and the problem.
 * Covers: truncation at every byte of the header and inside the data, bad magic, versions 1/4 and
 * a big-endian file, absurd n_kv/n_tensors, string/array lengths past EOF or overflowing, unknown
 * value types, nesting depth, duplicate keys and tensor names, n_dims 0/5, ne 0/negative/2^62,
 * element and byte count overflow, unknown tensor types, block-size mismatch, misaligned and
 * out-of-file offsets, overlapping tensors, bad alignment values. Every byte of the header is
 * also overwritten with 0x00 / 0xff / +1 to check that nothing crashes (run this under ASan).
 * Some variants are kept as files in tests/fixtures/bad/ and opened from disk with gguf_open;
 * FLOE_WRITE_BAD=<dir> regenerates them. */
#include <stdint.h>
#include <sys/stat.h>
#include <unistd.h>

#include "base/base.h"
#include "format/gguf.h"
#include "quant/quant.h"
#include "test.h"

typedef struct blob { uint8_t *p; size_t n; } blob;

static void put32(uint8_t *p, uint32_t v) { for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i)); }
static void put64(uint8_t *p, uint64_t v) { for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i)); }

static blob read_all(const char *path) {
  blob b = {0};
  FILE *f = fopen(path, "rb");
  if (!f) return b;
  fseek(f, 0, SEEK_END);
  b.n = (size_t)ftell(f);
  fseek(f, 0, SEEK_SET);
  b.p = malloc(b.n ? b.n : 1);
  if (fread(b.p, 1, b.n, f) != b.n) b.n = 0;
  fclose(f);
  return b;
}

/* The base file: a few KVs of each kind and three tensors (f32, q8_0, f16). */
static blob make_base(uint32_t alignment) {
  char name[64], err[512];
  snprintf(name, sizeof name, "gguf_bad_base_%u.gguf", alignment);
  const char *path = test_tmp(name);
  gguf_writer *w;
  if (gguf_writer_open(path, &w, err, sizeof err)) { printf("FAIL writer: %s\n", err); exit(1); }
  gguf_writer_set_alignment(w, alignment);
  gguf_writer_add_str(w, "general.architecture", "test");
  gguf_writer_add_u32(w, "a.u32", 7);
  gguf_writer_add_str(w, "a.str", "hello");
  static const uint32_t arr[] = {1, 2, 3};
  gguf_writer_add_arr(w, "a.arr", GGUF_TYPE_UINT32, arr, 3);
  static const char *const sar[] = {"x", "yz"};
  gguf_writer_add_arr_str(w, "a.sar", sar, 2);
  static const int32_t i1[] = {1}, i2[] = {2, 3};
  gguf_value items[2] = {{.type = GGUF_TYPE_ARRAY, .arr_type = GGUF_TYPE_INT32, .n = 1, .data = i1},
                         {.type = GGUF_TYPE_ARRAY, .arr_type = GGUF_TYPE_INT32, .n = 2, .data = i2}};
  gguf_value nst = {.type = GGUF_TYPE_ARRAY, .arr_type = GGUF_TYPE_ARRAY, .n = 2, .items = items};
  gguf_writer_add_value(w, "a.nst", &nst);
  gguf_writer_add_tensor(w, "t0", FLOE_TYPE_F32, 2, (const int64_t[]){8, 2});
  gguf_writer_add_tensor(w, "t1", FLOE_TYPE_Q8_0, 2, (const int64_t[]){32, 2});
  gguf_writer_add_tensor(w, "t2", FLOE_TYPE_F16, 1, (const int64_t[]){3});
  uint8_t data[64 + 68 + 6];
  for (size_t i = 0; i < sizeof data; i++) data[i] = (uint8_t)(i * 7 + 1);
  gguf_writer_write_data(w, data, sizeof data);
  if (gguf_writer_finish(w)) { printf("FAIL finish: %s\n", gguf_writer_error(NULL)); exit(1); }
  blob b = read_all(path);
  unlink(path);
  return b;
}

/* ---- field locations in the base, from its parse ---- */
enum field {
  F_ABS,      /* absolute file offset `idx` */
  F_KEYLEN,   /* u64 length of key `target` */
  F_KEYNAME,  /* the key's bytes (patch with `s`) */
  F_KTYPE,    /* u32 value type of key `target` */
  F_VAL,      /* value of key `target`, + idx bytes (arrays: +0 elem type, +4 count) */
  F_TNAMELEN, /* u64 name length of tensor `target` */
  F_TNAME,    /* tensor name bytes (patch with `s`) */
  F_NDIMS, F_NE /* ne[idx] */, F_TTYPE, F_TOFF,
  F_TRUNC,    /* cut the file to `val` bytes */
};

static size_t locate(const gguf_file *g, enum field f, const char *target, int idx) {
  const uint8_t *m = g->map;
  if (f == F_ABS) return (size_t)idx;
  if (f <= F_VAL) {
    const gguf_kv *kv = gguf_find_kv(g, target);
    if (!kv) { printf("FAIL no key %s in base\n", target); exit(1); }
    size_t k = (size_t)((const uint8_t *)kv->key.ptr - m);
    switch (f) {
      case F_KEYLEN: return k - 8;
      case F_KEYNAME: return k;
      case F_KTYPE: return k + kv->key.len;
      default: return k + kv->key.len + 4 + (size_t)idx;
    }
  }
  const gguf_tensor *t = gguf_find_tensor(g, target);
  if (!t) { printf("FAIL no tensor %s in base\n", target); exit(1); }
  size_t k = (size_t)((const uint8_t *)t->name.ptr - m);
  switch (f) {
    case F_TNAMELEN: return k - 8;
    case F_TNAME: return k;
    case F_NDIMS: return k + t->name.len;
    case F_NE: return k + t->name.len + 4 + 8 * (size_t)idx;
    case F_TTYPE: return k + t->name.len + 4 + 8 * t->n_dims;
    default: return k + t->name.len + 4 + 8 * t->n_dims + 4; /* F_TOFF */
  }
}

typedef struct bcase {
  const char *name;   /* also the fixture file name when save */
  uint32_t align;     /* which base */
  enum field f;
  const char *target;
  int idx;
  int width;          /* 4 or 8 (patch), 0 with s */
  uint64_t val;
  const char *s;
  int code;
  const char *sub;
  bool save;
} bcase;

#define U64MAX 0xffffffffffffffffull
static const bcase g_cases[] = {
  {"bad_magic", 32, F_ABS, NULL, 0, 4, 0x58554747 /* "GGUX" */, NULL, FLOE_E_FORMAT, "bad magic 0x47475558", true},
  {"version_1", 32, F_ABS, NULL, 4, 4, 1, NULL, FLOE_E_UNSUPPORTED, "unsupported GGUF version 1", true},
  {"version_4", 32, F_ABS, NULL, 4, 4, 4, NULL, FLOE_E_UNSUPPORTED, "unsupported GGUF version 4", false},
  {"version_0", 32, F_ABS, NULL, 4, 4, 0, NULL, FLOE_E_UNSUPPORTED, "unsupported GGUF version 0", false},
  {"big_endian", 32, F_ABS, NULL, 4, 4, 0x03000000, NULL, FLOE_E_UNSUPPORTED, "big-endian", false},
  {"n_kv_2p63", 32, F_ABS, NULL, 16, 8, 1ull << 63, NULL, FLOE_E_FORMAT, "more than the file could hold", true},
  {"n_kv_max", 32, F_ABS, NULL, 16, 8, U64MAX, NULL, FLOE_E_FORMAT, "more than the file could hold", false},
  {"n_tensors_2p63", 32, F_ABS, NULL, 8, 8, 1ull << 63, NULL, FLOE_E_FORMAT, "more than the file could hold", false},
  {"n_tensors_1000", 32, F_ABS, NULL, 8, 8, 1000, NULL, FLOE_E_FORMAT, "more than the file could hold", false},
  {"key_len_max", 32, F_KEYLEN, "a.u32", 0, 8, U64MAX, NULL, FLOE_E_FORMAT, "key of length 18446744073709551615", true},
  {"key_len_2p63", 32, F_KEYLEN, "a.u32", 0, 8, 1ull << 63, NULL, FLOE_E_FORMAT, "past end of file", false},
  {"string_len_max", 32, F_VAL, "a.str", 0, 8, U64MAX, NULL, FLOE_E_FORMAT, "string of length 18446744073709551615", true},
  {"string_len_2p62", 32, F_VAL, "a.str", 0, 8, 1ull << 62, NULL, FLOE_E_FORMAT, "past end of file", false},
  {"string_len_eof", 32, F_VAL, "general.architecture", 0, 8, 100000, NULL, FLOE_E_FORMAT, "string of length 100000", false},
  {"array_len_2p62", 32, F_VAL, "a.arr", 4, 8, 1ull << 62, NULL, FLOE_E_FORMAT, "array of 4611686018427387904 u32", true},
  {"array_len_max", 32, F_VAL, "a.arr", 4, 8, U64MAX, NULL, FLOE_E_FORMAT, "past end of file", false},
  {"array_len_100k", 32, F_VAL, "a.arr", 4, 8, 100000, NULL, FLOE_E_FORMAT, "array of 100000 u32", false},
  {"str_array_len_2p61", 32, F_VAL, "a.sar", 4, 8, 1ull << 61, NULL, FLOE_E_FORMAT, "array of 2305843009213693952 string", false},
  {"str_array_len_max", 32, F_VAL, "a.sar", 4, 8, U64MAX, NULL, FLOE_E_FORMAT, "past end of file", false},
  {"nested_len_2p40", 32, F_VAL, "a.nst", 4, 8, 1ull << 40, NULL, FLOE_E_FORMAT, "array of 1099511627776 array", false},
  {"nested_inner_len", 32, F_VAL, "a.nst", 12 + 4, 8, 1ull << 60, NULL, FLOE_E_FORMAT, "array of 1152921504606846976 i32", false},
  {"value_type_13", 32, F_KTYPE, "a.u32", 0, 4, 13, NULL, FLOE_E_FORMAT, "key 'a.u32': unknown value type 13", true},
  {"value_type_max", 32, F_KTYPE, "a.u32", 0, 4, 0xffffffffu, NULL, FLOE_E_FORMAT, "unknown value type 4294967295", false},
  {"array_elem_type", 32, F_VAL, "a.arr", 0, 4, 200, NULL, FLOE_E_FORMAT, "unknown value type 200 of array elements", false},
  {"nested_elem_type", 32, F_VAL, "a.nst", 12, 4, 77, NULL, FLOE_E_FORMAT, "unknown value type 77 of array elements", false},
  {"dup_key", 32, F_KEYNAME, "a.arr", 0, 0, 0, "a.str", FLOE_E_FORMAT, "duplicate key 'a.str'", true},
  {"dup_tensor", 32, F_TNAME, "t1", 0, 0, 0, "t0", FLOE_E_FORMAT, "duplicate tensor name 't0'", true},
  {"tname_len_max", 32, F_TNAMELEN, "t1", 0, 8, U64MAX, NULL, FLOE_E_FORMAT, "tensor name of length", false},
  {"n_dims_0", 32, F_NDIMS, "t0", 0, 4, 0, NULL, FLOE_E_FORMAT, "tensor 't0': n_dims = 0", false},
  {"n_dims_5", 32, F_NDIMS, "t0", 0, 4, 5, NULL, FLOE_E_FORMAT, "tensor 't0': n_dims = 5", true},
  {"n_dims_max", 32, F_NDIMS, "t2", 0, 4, 0xffffffffu, NULL, FLOE_E_FORMAT, "n_dims = 4294967295", false},
  {"ne_0", 32, F_NE, "t2", 0, 8, 0, NULL, FLOE_E_FORMAT, "tensor 't2': ne[0] = 0", false},
  {"ne_negative", 32, F_NE, "t0", 1, 8, (uint64_t)-1, NULL, FLOE_E_FORMAT, "tensor 't0': ne[1] = -1", true},
  {"ne_min", 32, F_NE, "t0", 0, 8, 1ull << 63, NULL, FLOE_E_FORMAT, "ne[0] = -9223372036854775808", false},
  {"ne_2p62_elems", 32, F_NE, "t0", 0, 8, 1ull << 62, NULL, FLOE_E_OVERFLOW, "element count overflows", true},
  {"ne_2p61_bytes", 32, F_NE, "t0", 0, 8, 1ull << 61, NULL, FLOE_E_OVERFLOW, "byte size overflows", false},
  {"ne_2p62_1d", 32, F_NE, "t2", 0, 8, 1ull << 62, NULL, FLOE_E_FORMAT, "ends past end of file", false},
  {"unknown_type_99", 32, F_TTYPE, "t1", 0, 4, 99, NULL, FLOE_E_UNSUPPORTED, "tensor 't1': unknown type id 99", true},
  {"unknown_type_4", 32, F_TTYPE, "t1", 0, 4, 4, NULL, FLOE_E_UNSUPPORTED, "unknown type id 4", false},
  {"unknown_type_max", 32, F_TTYPE, "t1", 0, 4, 0xffffffffu, NULL, FLOE_E_UNSUPPORTED, "unknown type id 4294967295", false},
  {"block_size", 32, F_NE, "t1", 0, 8, 48, NULL, FLOE_E_FORMAT, "ne[0] = 48 is not a multiple of the block size 32", false},
  {"misaligned", 32, F_TOFF, "t1", 0, 8, 68, NULL, FLOE_E_FORMAT, "tensor 't1': offset 68 is not a multiple of the alignment 32", true},
  {"past_eof", 32, F_TOFF, "t2", 0, 8, 1ull << 40, NULL, FLOE_E_FORMAT, "tensor 't2': data [", true},
  {"offset_wraps", 32, F_TOFF, "t2", 0, 8, U64MAX - 31, NULL, FLOE_E_FORMAT, "lies past end of file", false},
  {"overlap_same", 32, F_TOFF, "t1", 0, 8, 0, NULL, FLOE_E_FORMAT, "overlaps tensor 't0'", true},
  {"overlap_inside", 32, F_TOFF, "t2", 0, 8, 96, NULL, FLOE_E_FORMAT, "overlaps tensor 't1'", false},
  {"alignment_0", 64, F_VAL, "general.alignment", 0, 4, 0, NULL, FLOE_E_FORMAT, "alignment 0 is not a power of two", true},
  {"alignment_3", 64, F_VAL, "general.alignment", 0, 4, 3, NULL, FLOE_E_FORMAT, "alignment 3 is not a power of two", true},
  {"alignment_i32", 64, F_KTYPE, "general.alignment", 0, 4, GGUF_TYPE_INT32, NULL, FLOE_E_FORMAT, "type i32, expected u32", false},
  {"truncated_header", 32, F_TRUNC, NULL, 0, 0, 150, NULL, FLOE_E_FORMAT, "end of file", true},
  {"truncated_data", 32, F_TRUNC, NULL, 0, 0, 0 /* set below: mid-t1 */, NULL, FLOE_E_FORMAT, "tensor 't1': data [", true},
};
#define N_CASES (sizeof g_cases / sizeof g_cases[0])

/* Applies case c to a copy of base; returns an exactly-sized malloc'ed buffer (ASan sees overreads). */
static blob apply(const bcase *c, blob base, const gguf_file *g) {
  blob b = {malloc(base.n), base.n};
  memcpy(b.p, base.p, base.n);
  if (c->f == F_TRUNC) {
    size_t n = (size_t)c->val;
    if (strcmp(c->name, "truncated_data") == 0) n = (size_t)(g->data_offset + 64 + 40); /* inside t1 */
    b.n = n;
    return b;
  }
  size_t off = locate(g, c->f, c->target, c->idx);
  if (c->s) memcpy(b.p + off, c->s, strlen(c->s));
  else if (c->width == 4) put32(b.p + off, (uint32_t)c->val);
  else put64(b.p + off, c->val);
  return b;
}

static bool one_line(const char *s) { return s[0] && !strchr(s, '\n') && !strchr(s, '\r'); }

static void expect_buf(const uint8_t *p, size_t n, int code, const char *sub, const char *what) {
  gguf_file *g = (gguf_file *)1;
  char err[512] = "";
  int rc = gguf_open_buffer(p, n, "bad.gguf", &g, err, sizeof err);
  CHECK(rc == code && g == NULL && strstr(err, sub) && strncmp(err, "bad.gguf: ", 10) == 0 && one_line(err),
        "%s: rc %d (want %d), '%s' (want '%s')", what, rc, code, err, sub);
  if (rc == 0) gguf_close(g);
}

static void test_cases(void) {
  SECTION("corrupted fields (%zu cases)", N_CASES);
  blob base32 = make_base(32), base64 = make_base(64);
  gguf_file *g32, *g64;
  char err[512];
  CHECK(gguf_open_buffer(base32.p, base32.n, "base32", &g32, err, sizeof err) == 0, "base (alignment 32) valid: %s", err);
  CHECK(gguf_open_buffer(base64.p, base64.n, "base64", &g64, err, sizeof err) == 0, "base (alignment 64) valid: %s", err);
  CHECK(g32->tensors[1].offset == 64 && g32->tensors[2].offset == 160, "base layout as the cases assume");
  const char *save_dir = getenv("FLOE_WRITE_BAD");
  for (size_t i = 0; i < N_CASES; i++) {
    const bcase *c = &g_cases[i];
    blob b = apply(c, c->align == 64 ? base64 : base32, c->align == 64 ? g64 : g32);
    expect_buf(b.p, b.n, c->code, c->sub, c->name);
    if (save_dir && c->save) {
      char path[4096];
      snprintf(path, sizeof path, "%s/%s.gguf", save_dir, c->name);
      FILE *f = fopen(path, "wb");
      CHECK(f && fwrite(b.p, 1, b.n, f) == b.n, "saved %s", path);
      if (f) fclose(f);
    }
    free(b.p);
  }
  gguf_close(g32);
  gguf_close(g64);
  free(base32.p);
  free(base64.p);
}

static void test_fixture_files(void) {
  SECTION("tests/fixtures/bad/*.gguf opened from disk");
  int n = 0;
  for (size_t i = 0; i < N_CASES; i++) {
    const bcase *c = &g_cases[i];
    if (!c->save) continue;
    char name[128];
    snprintf(name, sizeof name, "bad/%s.gguf", c->name);
    const char *path = test_fixture(name);
    gguf_file *g = (gguf_file *)1;
    char err[1024] = "";
    int rc = gguf_open(path, &g, err, sizeof err);
    CHECK(rc == c->code && g == NULL && strstr(err, c->sub) && strncmp(err, path, strlen(path)) == 0 && one_line(err),
          "%s: rc %d (want %d), '%s' (want '%s')", name, rc, c->code, err, c->sub);
    if (rc == 0) gguf_close(g);
    n++;
  }
  CHECK(n >= 10, "%d fixture files", n);
  /* an empty file */
  const char *empty = test_tmp("gguf_empty.gguf");
  FILE *f = fopen(empty, "wb");
  if (f) fclose(f);
  gguf_file *g;
  char err[512];
  int rc = gguf_open(empty, &g, err, sizeof err);
  CHECK(rc == FLOE_E_FORMAT && strstr(err, "end of file") && strstr(err, empty), "empty file: %s", err);
  unlink(empty);
  rc = gguf_open(test_tmp(""), &g, err, sizeof err);
  CHECK(rc == FLOE_E_IO && strstr(err, "not a regular file"), "a directory: %s", err);
}

static void test_truncation(uint32_t align) {
  SECTION("truncation at every byte (alignment %u)", align);
  blob base = make_base(align);
  gguf_file *g;
  char err[512];
  CHECK(gguf_open_buffer(base.p, base.n, "base", &g, err, sizeof err) == 0, "base valid");
  uint64_t data_end = g->data_offset + g->tensors[2].offset + g->tensors[2].size;
  int bad_header = 0, bad_data = 0, ok_tail = 0;
  for (size_t n = 0; n < base.n; n++) {
    uint8_t *p = malloc(n ? n : 1);
    memcpy(p, base.p, n);
    gguf_file *t = NULL;
    char e[512] = "";
    int rc = gguf_open_buffer(n ? p : NULL, n, "bad.gguf", &t, e, sizeof e);
    bool refused = rc == FLOE_E_FORMAT && t == NULL && strstr(e, "end of file") && one_line(e);
    if (n < g->data_offset) {
      bad_header += refused;
      if (!refused) CHECK(false, "header prefix of %zu bytes: rc %d '%s'", n, rc, e);
    } else if (n < data_end) {
      refused = refused && strstr(e, "ends past end of file");
      bad_data += refused;
      if (!refused) CHECK(false, "data prefix of %zu bytes: rc %d '%s'", n, rc, e);
    } else {
      /* only the last tensor's padding is missing: still a valid file */
      ok_tail += rc == 0;
      if (rc) CHECK(false, "prefix of %zu bytes (only padding cut): %s", n, e);
    }
    if (t) gguf_close(t);
    free(p);
  }
  CHECK(bad_header == (int)g->data_offset, "all %d header prefixes refused as truncated", bad_header);
  CHECK(bad_data == (int)(data_end - g->data_offset), "all %d data prefixes refused (tensor past EOF)", bad_data);
  CHECK(ok_tail == (int)(base.n - data_end), "%d prefixes cutting only the final padding accepted", ok_tail);
  gguf_close(g);
  free(base.p);
}

/* Every header byte set to 0x00, 0xff and +1: the reader either accepts or refuses with a message
 * naming the file; nothing crashes (ASan/UBSan builds check the reads). */
static void test_byte_flips(void) {
  SECTION("every header byte corrupted");
  blob base = make_base(32);
  gguf_file *g;
  char err[512];
  gguf_open_buffer(base.p, base.n, "base", &g, err, sizeof err);
  size_t hdr = (size_t)g->data_offset;
  gguf_close(g);
  int sane = 0, total = 0, refused = 0;
  uint8_t *p = malloc(base.n);
  for (size_t i = 0; i < hdr; i++) {
    const int vals[3] = {0x00, 0xff, (base.p[i] + 1) & 0xff};
    for (int k = 0; k < 3; k++) {
      memcpy(p, base.p, base.n);
      p[i] = (uint8_t)vals[k];
      gguf_file *t = NULL;
      char e[512] = "";
      int rc = gguf_open_buffer(p, base.n, "flip.gguf", &t, e, sizeof e);
      total++;
      if (rc == 0) {
        /* accepted: every tensor range must lie inside the buffer */
        bool in = t != NULL;
        for (uint64_t j = 0; in && j < t->n_tensors; j++)
          in = t->tensors[j].data >= p && t->tensors[j].data + t->tensors[j].size <= p + base.n;
        sane += in;
        gguf_close(t);
      } else {
        refused++;
        sane += t == NULL && strncmp(e, "flip.gguf: ", 11) == 0 && one_line(e) && rc < 0;
      }
    }
  }
  CHECK(sane == total, "%d of %d corrupted files handled sanely (%d refused)", sane, total, refused);
  CHECK(refused > total / 2, "most corruptions are detected (%d of %d)", refused, total);
  free(p);
  free(base.p);
}

/* Hand-built files for what the writer cannot produce. */
typedef struct bld { uint8_t b[4096]; size_t n; } bld;
static void b32(bld *x, uint32_t v) { put32(x->b + x->n, v); x->n += 4; }
static void b64(bld *x, uint64_t v) { put64(x->b + x->n, v); x->n += 8; }
static void bstr(bld *x, const char *s) { b64(x, strlen(s)); memcpy(x->b + x->n, s, strlen(s)); x->n += strlen(s); }
static void bhdr(bld *x, uint64_t nt, uint64_t nkv) { x->n = 0; memcpy(x->b, "GGUF", 4); x->n = 4; b32(x, 3); b64(x, nt); b64(x, nkv); }

static void test_handmade(void) {
  SECTION("hand-built files");
  bld x;
  char err[512];
  gguf_file *g;
  /* minimal valid file: header only */
  bhdr(&x, 0, 0);
  CHECK(gguf_open_buffer(x.b, x.n, "min", &g, err, sizeof err) == 0 && g->n_kv == 0 && g->n_tensors == 0,
        "24-byte file without KVs or tensors is valid");
  if (g) gguf_close(g);
  /* nesting: 8 levels accepted, 9 refused */
  for (int levels = 8; levels <= 9; levels++) {
    bhdr(&x, 0, 1);
    bstr(&x, "deep");
    b32(&x, GGUF_TYPE_ARRAY);
    for (int l = 0; l < levels - 1; l++) { b32(&x, GGUF_TYPE_ARRAY); b64(&x, 1); }
    b32(&x, GGUF_TYPE_UINT8);
    b64(&x, 1);
    x.b[x.n++] = 42;
    uint8_t *p = malloc(x.n);
    memcpy(p, x.b, x.n);
    if (levels == 8) {
      int rc = gguf_open_buffer(p, x.n, "deep8", &g, err, sizeof err);
      CHECK(rc == 0, "8 nested array levels accepted: %s", rc ? err : "ok");
      if (!rc) gguf_close(g);
    } else {
      expect_buf(p, x.n, FLOE_E_FORMAT, "key 'deep': arrays nested deeper than 8", "9 nested array levels");
    }
    free(p);
  }
  /* a long chain of empty nested arrays (many allocations-worth of counts, each backed by bytes) */
  bhdr(&x, 0, 1);
  bstr(&x, "wide");
  b32(&x, GGUF_TYPE_ARRAY);
  b32(&x, GGUF_TYPE_ARRAY);
  b64(&x, 300);
  for (int i = 0; i < 300; i++) { b32(&x, GGUF_TYPE_STRING); b64(&x, 0); }
  CHECK(gguf_open_buffer(x.b, x.n, "wide", &g, err, sizeof err) == 0 && g->kv[0].val.n == 300 &&
            g->kv[0].val.items[299].arr_type == GGUF_TYPE_STRING,
        "300 empty nested string arrays: %s", err);
  if (g) gguf_close(g);
  /* ... one element short */
  uint8_t *p = malloc(x.n - 12);
  memcpy(p, x.b, x.n - 12);
  expect_buf(p, x.n - 12, FLOE_E_FORMAT, "array of 300 array", "nested array count one past the file");
  free(p);
  /* more nested arrays than floe's cap (2^20), each really present in the file (12 bytes) */
  {
    uint64_t n = (1u << 20) + 1;
    bhdr(&x, 0, 1);
    bstr(&x, "many");
    b32(&x, GGUF_TYPE_ARRAY);
    b32(&x, GGUF_TYPE_ARRAY);
    b64(&x, n);
    size_t sz = x.n + 12 * n;
    uint8_t *q = malloc(sz);
    memcpy(q, x.b, x.n);
    for (uint64_t i = 0; i < n; i++) { put32(q + x.n + 12 * i, GGUF_TYPE_UINT8); put64(q + x.n + 12 * i + 4, 0); }
    expect_buf(q, sz, FLOE_E_FORMAT, "more than 1048576 nested arrays", "nested array count above the cap");
    free(q);
  }
  /* key with control characters: message stays one line */
  bhdr(&x, 0, 2);
  bstr(&x, "a\nb");
  b32(&x, GGUF_TYPE_UINT8);
  x.b[x.n++] = 1;
  bstr(&x, "a\nb");
  b32(&x, GGUF_TYPE_UINT8);
  x.b[x.n++] = 2;
  expect_buf(x.b, x.n, FLOE_E_FORMAT, "duplicate key 'a?b'", "duplicate key with a newline in it");
  /* bool values other than 0/1 read as true */
  bhdr(&x, 0, 1);
  bstr(&x, "b");
  b32(&x, GGUF_TYPE_BOOL);
  x.b[x.n++] = 7;
  bool bv = false;
  CHECK(gguf_open_buffer(x.b, x.n, "bool", &g, err, sizeof err) == 0 && gguf_get_bool(g, "b", &bv) == 0 && bv,
        "bool byte 7 reads as true");
  if (g) gguf_close(g);
  /* tensors in the data section out of info order and with a gap: accepted (only overlap is refused) */
  bhdr(&x, 2, 0);
  bstr(&x, "a");
  b32(&x, 1); b64(&x, 8); b32(&x, FLOE_TYPE_F32); b64(&x, 64);
  bstr(&x, "b");
  b32(&x, 1); b64(&x, 8); b32(&x, FLOE_TYPE_F32); b64(&x, 0);
  size_t hdr = x.n, doff = (hdr + 31) / 32 * 32;
  memset(x.b + hdr, 0, doff + 96 - hdr);
  x.n = doff + 96;
  CHECK(gguf_open_buffer(x.b, x.n, "order", &g, err, sizeof err) == 0 && g->tensors[0].data == x.b + doff + 64,
        "out-of-order tensors with a gap accepted: %s", err);
  if (g) gguf_close(g);
}

int main(void) {
  test_cases();
  test_fixture_files();
  test_truncation(32);
  test_truncation(64);
  test_byte_flips();
  test_handmade();
  return TEST_DONE();
}
