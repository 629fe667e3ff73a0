/* A small safetensors writer, for test fixtures and tools (the MLX fixture generator).
 *
 * Tensors are added with their data (copied) and written by st_writer_finish() in the order they
 * were added: u64 header length, the JSON header padded with spaces to a multiple of 8 (as the
 * reference writer does, so data offsets stay 8-aligned), then the data, contiguous. The file is
 * written to "<path>.tmp.<pid>" and renamed when complete; on any failure nothing is left behind.
 * Names must be unique and free of '"' and '\\' and control characters (checked).
 *
 * Memory: the writer owns copies of every tensor; st_writer_finish()/st_writer_abort() free it.
 * Meant for small files: everything is held in memory until finish. */
#ifndef FLOE_ST_WRITER_H
#define FLOE_ST_WRITER_H
#include <stddef.h>
#include <stdint.h>

typedef struct st_writer st_writer;

int st_writer_open(const char *path, st_writer **out, char *err, size_t errlen);
/* "__metadata__" entry (string -> string), e.g. ("format", "mlx"). */
int st_writer_set_meta(st_writer *w, const char *key, const char *value, char *err, size_t errlen);
/* dtype: enum st_dtype (format/safetensors.h); shape in safetensors order (last dim contiguous);
 * data holds product(shape) * st_dtype_size(dtype) bytes. */
int st_writer_add(st_writer *w, const char *name, int dtype, int n_dims, const int64_t *shape, const void *data,
                  char *err, size_t errlen);
/* Writes the file and frees w (also on failure). */
int st_writer_finish(st_writer *w, char *err, size_t errlen);
void st_writer_abort(st_writer *w);
#endif
