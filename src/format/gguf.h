/* GGUF v3 reader (mmap) and streaming writer.
 *
 * Reader: gguf_open() maps the whole file read-only and validates everything before returning:
 * magic, version (3; 2 accepted for reading), every count and string length against the file
 * size, value types, nested arrays, the alignment key (`general.alignment`, power of two), tensor
 * infos (name unique, n_dims 1..4, every ne >= 1, type known, element count a multiple of the
 * block size, byte size overflow-checked, data range inside the file, offset aligned). After a
 * successful open, every pointer in the structs points inside the mapping and is safe to read.
 * Errors are one line naming the file, the key/tensor and the problem.
 * Tensors may lie in any order and with gaps in the data section (llama.cpp writes them packed
 * in info order; so does the writer below); overlapping ranges are refused. Allocation is bounded
 * by the bytes present and by caps (1M keys, 2M tensors, 32M string-array elements, 1M nested
 * array values, nesting depth 8). Bool values/array elements are bytes, nonzero = true.
 * A gguf_file is read-only after open, so lookups from several threads are safe.
 *
 * Memory: the gguf_file owns the mapping and all parsed arrays; everything is freed by
 * gguf_close(). Strings point into the mapping and are NOT NUL-terminated: use (ptr, len).
 *
 * Writer: gguf_writer_open(path) writes to "path.tmp.<pid>" and gguf_writer_finish() renames it to
 * path only when complete, so an interrupted write never leaves a file that looks valid. Order:
 * add all KVs and tensor infos, then write tensor data in the order the infos were added
 * (streaming, any chunking), then finish. */
#ifndef FLOE_GGUF_H
#define FLOE_GGUF_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum gguf_type {
  GGUF_TYPE_UINT8 = 0, GGUF_TYPE_INT8 = 1, GGUF_TYPE_UINT16 = 2, GGUF_TYPE_INT16 = 3,
  GGUF_TYPE_UINT32 = 4, GGUF_TYPE_INT32 = 5, GGUF_TYPE_FLOAT32 = 6, GGUF_TYPE_BOOL = 7,
  GGUF_TYPE_STRING = 8, GGUF_TYPE_ARRAY = 9, GGUF_TYPE_UINT64 = 10, GGUF_TYPE_INT64 = 11,
  GGUF_TYPE_FLOAT64 = 12,
};

#define GGUF_DEFAULT_ALIGNMENT 32
#define GGUF_MAX_DIMS 4

typedef struct gguf_str { const char *ptr; uint64_t len; } gguf_str;

/* One metadata value. Scalars are widened into u/i/f/b. Arrays: arr_type is the element type;
 * for scalar element types `data` points at the n packed little-endian elements in the mapping;
 * for GGUF_TYPE_STRING elements `strs` holds n gguf_str; for nested arrays `items` holds n
 * gguf_value. */
typedef struct gguf_value {
  uint32_t type;
  union { uint64_t u; int64_t i; double f; bool b; gguf_str s; };
  uint32_t arr_type;
  uint64_t n;
  const void *data;
  gguf_str *strs;
  struct gguf_value *items;
} gguf_value;

typedef struct gguf_kv { gguf_str key; gguf_value val; } gguf_kv;

typedef struct gguf_tensor {
  gguf_str name;
  uint32_t type;              /* ggml type id (FLOE_TYPE_* in quant/quant.h) */
  uint32_t n_dims;
  int64_t ne[GGUF_MAX_DIMS];  /* ggml order: ne[0] = contiguous dim; unused dims are 1 */
  uint64_t offset;            /* relative to the data section */
  uint64_t size;              /* bytes */
  const uint8_t *data;        /* inside the mapping */
} gguf_tensor;

typedef struct gguf_file {
  char *path;
  const uint8_t *map;   /* whole file */
  uint64_t map_size;
  uint32_t version;
  uint64_t alignment;
  uint64_t data_offset; /* file offset of the data section */
  uint64_t n_kv;
  gguf_kv *kv;
  uint64_t n_tensors;
  gguf_tensor *tensors;
  void *priv;           /* reader internals (name hash, arenas) */
} gguf_file;

/* Open + validate. On failure returns a negative FLOE_E_* and *out is NULL. */
int gguf_open(const char *path, gguf_file **out, char *err, size_t errlen);
/* copy: read the file into huge-page memory instead of mapping it (floe_map_file) */
int gguf_open_ex(const char *path, bool copy, gguf_file **out, char *err, size_t errlen);
/* Same validation on a caller-owned buffer (used by the fuzzer and tests); buf must outlive g. */
int gguf_open_buffer(const void *buf, size_t size, const char *name, gguf_file **out, char *err, size_t errlen);
void gguf_close(gguf_file *g);
/* A mapped file that shrinks makes reads of its vanished pages fault (SIGBUS). Callers that read
 * the mapping long after opening (the model, per evaluated batch) call this first: FLOE_E_IO with
 * "file shrank after it was loaded" when the file is now shorter than the mapping. */
int gguf_check_unchanged(const gguf_file *g, char *err, size_t errlen);

const gguf_kv *gguf_find_kv(const gguf_file *g, const char *key);
const gguf_tensor *gguf_find_tensor(const gguf_file *g, const char *name);
/* Typed getters: 0 on success, FLOE_E_NOTFOUND if absent, FLOE_E_FORMAT if the stored type cannot
 * represent the request (e.g. negative into u64, u64 > UINT32_MAX into u32). Integers of any
 * width convert when the value fits. */
int gguf_get_u32(const gguf_file *g, const char *key, uint32_t *out);
int gguf_get_u64(const gguf_file *g, const char *key, uint64_t *out);
int gguf_get_i64(const gguf_file *g, const char *key, int64_t *out);
int gguf_get_f32(const gguf_file *g, const char *key, float *out);
int gguf_get_bool(const gguf_file *g, const char *key, bool *out);
int gguf_get_str(const gguf_file *g, const char *key, gguf_str *out);
/* Array accessors: element count and type; NULL/0 when absent or not an array. */
const gguf_value *gguf_get_arr(const gguf_file *g, const char *key, uint32_t *arr_type, uint64_t *n);
/* Integer element i of a scalar-typed array value, widened (0 on success). */
int gguf_arr_i64(const gguf_value *v, uint64_t i, int64_t *out);
/* Element i of a numeric array (floats, or integers converted to double) / of a string array. */
int gguf_arr_f64(const gguf_value *v, uint64_t i, double *out);
int gguf_arr_str(const gguf_value *v, uint64_t i, gguf_str *out);
/* Name of a gguf_type ("u32", "string", ...). */
const char *gguf_type_name(uint32_t t);
/* Compare a gguf_str with a C string. */
bool gguf_str_eq(gguf_str s, const char *c);

/* ---- writer ----
 * Errors are sticky: after the first failure every call returns the same code and
 * gguf_writer_error() keeps the first message, so a caller may check only at finish. */
typedef struct gguf_writer gguf_writer;
int gguf_writer_open(const char *path, gguf_writer **out, char *err, size_t errlen);
void gguf_writer_set_alignment(gguf_writer *w, uint32_t alignment); /* default 32; writes general.alignment if != 32 */
int gguf_writer_add_u8(gguf_writer *w, const char *key, uint8_t v);
int gguf_writer_add_i32(gguf_writer *w, const char *key, int32_t v);
int gguf_writer_add_u32(gguf_writer *w, const char *key, uint32_t v);
int gguf_writer_add_u64(gguf_writer *w, const char *key, uint64_t v);
int gguf_writer_add_f32(gguf_writer *w, const char *key, float v);
int gguf_writer_add_bool(gguf_writer *w, const char *key, bool v);
int gguf_writer_add_str(gguf_writer *w, const char *key, const char *v);
/* Array of scalars of type elem_type (packed little-endian), or of NUL-terminated strings. */
int gguf_writer_add_arr(gguf_writer *w, const char *key, uint32_t elem_type, const void *data, uint64_t n);
int gguf_writer_add_arr_str(gguf_writer *w, const char *key, const char *const *strs, uint64_t n);
/* Any value, including the types without a helper (i8, u16, i16, i64, f64) and nested arrays
 * (items[] of type GGUF_TYPE_ARRAY, at most 8 deep). Scalars are taken from u/i/f/b as the reader
 * fills them, so a reader's gguf_value can be written back as is. */
int gguf_writer_add_value(gguf_writer *w, const char *key, const gguf_value *v);
/* Copies a KV read by gguf_open (e.g. tokenizer metadata into a converted file). */
int gguf_writer_add_kv(gguf_writer *w, const gguf_kv *kv);
/* Tensor info: type is a ggml type id; ne in ggml order; size is computed from type and ne. */
int gguf_writer_add_tensor(gguf_writer *w, const char *name, uint32_t type, uint32_t n_dims, const int64_t *ne);
/* Writes the header (all KVs and tensor infos) — called implicitly by the first write_data. */
int gguf_writer_write_header(gguf_writer *w);
/* Append bytes of the tensors' data, in info order; padding between tensors is inserted
 * automatically when a tensor's bytes are complete. */
int gguf_writer_write_data(gguf_writer *w, const void *data, size_t n);
/* Checks every tensor got exactly its bytes, flushes, fsyncs, renames temp -> path. Frees w. */
int gguf_writer_finish(gguf_writer *w);
/* The same, copying the error message (if any) into err before w is freed. */
int gguf_writer_finish_err(gguf_writer *w, char *err, size_t errlen);
/* Removes the temp file and frees w (on error paths). */
void gguf_writer_abort(gguf_writer *w);
/* Last error message of the writer (one line, starting with the output path). gguf_writer_error(NULL) returns the message of the
 * last gguf_writer_finish() that failed on this thread (finish frees w). */
const char *gguf_writer_error(const gguf_writer *w);
#endif
