/* floe public API.
 *
 * The CLI and the server use only this header: they never see tensors. Two opaque handles (added
 * as the engine grows): floe_engine = a loaded model, floe_session = one mutable context.
 * Fallible calls return 0 or a negative FLOE_E_* code and write a one-line message into err. */
#ifndef FLOE_H
#define FLOE_H
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FLOE_VERSION "0.1.0"

enum {
  FLOE_OK = 0,
  FLOE_E_IO = -1,       /* open/read/write/mmap failed */
  FLOE_E_FORMAT = -2,   /* malformed file: bad magic, truncated, out-of-range offset, ... */
  FLOE_E_UNSUPPORTED = -3, /* valid but not supported: unknown tensor type, architecture */
  FLOE_E_INVALID = -4,  /* bad argument or value */
  FLOE_E_NOMEM = -5,    /* allocation failed or memory budget too small */
  FLOE_E_NOTFOUND = -6, /* missing key or tensor */
  FLOE_E_OVERFLOW = -7, /* size arithmetic overflow, absurd dimensions */
};

/* Human-readable name of an error code ("format error", ...). */
const char *floe_strerror(int code);

#ifdef __cplusplus
}
#endif
#endif
