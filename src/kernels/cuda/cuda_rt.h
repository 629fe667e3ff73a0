/* Minimal CUDA runtime wrapper (plain C, no CUDA types): device discovery that never crashes on a
 * machine without a driver, memory, copies, streams, events. The ops helper's branch carries only
 * what its tests and benchmark need; the kernels helper owns the full version of this file.
 * Streams and events are void * (cudaStream_t / cudaEvent_t); device pointers are plain pointers.
 * Every call returns 0 or a negative FLOE_E_* with a one-line message in err (where it takes one). */
#ifndef FLOE_CUDA_RT_H
#define FLOE_CUDA_RT_H
#include <stddef.h>
#include <stdint.h>
#ifdef __cplusplus
extern "C" {
#endif
/* Number of usable CUDA devices; 0 without a driver or a device (never fails). */
int cuda_rt_device_count(void);
/* Selects device dev; name (may be NULL) gets its name. */
int cuda_rt_init(int dev, char *name, size_t name_len, char *err, size_t errlen);
void *cuda_rt_malloc(size_t bytes);   /* NULL on failure */
void cuda_rt_free(void *p);
int cuda_rt_memcpy_htod(void *dst, const void *src, size_t bytes);
int cuda_rt_memcpy_dtoh(void *dst, const void *src, size_t bytes);
int cuda_rt_memset(void *dst, int byte, size_t bytes);
/* Waits for the device; reports the first asynchronous error (kernel faults, bad launches). */
int cuda_rt_sync(char *err, size_t errlen);
void *cuda_rt_event_new(void);
void cuda_rt_event_free(void *ev);
void cuda_rt_event_record(void *ev, void *stream);
float cuda_rt_event_ms(void *start, void *end); /* after both completed; < 0 on error */
#ifdef __cplusplus
}
#endif
#endif
