/* CUDA runtime helpers for the CUDA backend: device discovery, memory, copies, streams, events
 * and error reporting, as plain C (no CUDA types: a stream or event is a void *, device memory a
 * plain pointer).
 *
 * Every function is safe to call on a machine with no NVIDIA driver or no device: the runtime
 * is linked statically, cuda_rt_device_count() then returns 0 and the other calls fail with
 * FLOE_E_UNSUPPORTED and a one-line message. Nothing here exits or aborts.
 *
 * Asynchronous copies and memsets are enqueued on the given stream (NULL: the legacy default
 * stream) and never synchronize; host buffers of async copies should be pinned
 * (cuda_rt_host_alloc) for the copy to be truly asynchronous. Kernel launchers elsewhere return
 * void; a step's launch errors surface at cuda_rt_check() / cuda_rt_stream_sync().
 * Ownership: what cuda_rt_*_alloc / *_create return is the caller's, freed by the matching
 * free / destroy. */
#ifndef FLOE_CUDA_RT_H
#define FLOE_CUDA_RT_H
#include <stddef.h>
#include <stdio.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Number of usable devices; 0 when there is no driver, no device, or the driver is too old. */
int cuda_rt_device_count(void);
/* Makes device dev current for the calling thread and creates its context. */
int cuda_rt_init(int dev, char *err, size_t errlen);
/* "NVIDIA H200 (sm_90, 139.8 GiB)"-style description of device dev into buf. */
int cuda_rt_device_name(int dev, char *buf, size_t n, char *err, size_t errlen);
/* Compute capability major * 10 + minor of device dev, or a negative FLOE_E_*. */
int cuda_rt_device_cc(int dev);
/* 1 when kernels are launched with programmatic dependent launch (pdl.cuh): sm_90+, and the
 * environment has no FLOE_CUDA_NO_PDL. */
int cuda_rt_pdl(void);
/* Bit 0: kernels load the model's constants (norm and conv weights), and the recurrent states where
 * cuda_gdn_shape.pre_state allows, before their griddepcontrol.wait, while the kernel before them
 * still runs. Bit 1: the one-row norms let the next kernel start only once their row is in. 1 by
 * default (FLOE_CUDA_PREW=0 / 2 / 3, read at the first launch, sets others); the same bits. */
int cuda_rt_prew(void);
void cuda_rt_set_prew(int bits);
/* L2 cache bytes of device dev (0 when unknown). */
size_t cuda_rt_l2_bytes(int dev);
/* Free and total device memory of the current device. */
int cuda_rt_mem_info(size_t *free_b, size_t *total_b, char *err, size_t errlen);

int cuda_rt_malloc(void **p, size_t n, char *err, size_t errlen);
void cuda_rt_free(void *p);                 /* NULL is fine */
int cuda_rt_host_alloc(void **p, size_t n, char *err, size_t errlen); /* pinned host memory */
void cuda_rt_host_free(void *p);
/* The device's address of pinned host memory from cuda_rt_host_alloc (a kernel may write it
 * directly; the host reads it after synchronizing with the stream); NULL where there is none. */
void *cuda_rt_host_dev_ptr(void *p);
/* Page-locks existing host memory [p, p + n) (rounded out to pages) so that copies from it are
 * truly asynchronous and run at full PCIe speed; unregister with the same p. */
int cuda_rt_host_register(void *p, size_t n, char *err, size_t errlen);
void cuda_rt_host_unregister(void *p);

/* Enqueued on stream; return 0 or FLOE_E_* when the enqueue itself fails. */
int cuda_rt_h2d_async(void *dst, const void *src, size_t n, void *stream);
int cuda_rt_d2h_async(void *dst, const void *src, size_t n, void *stream);
int cuda_rt_d2d_async(void *dst, const void *src, size_t n, void *stream);
int cuda_rt_memset_async(void *dst, int byte, size_t n, void *stream);
/* Blocking copies (tests, weight upload). */
int cuda_rt_h2d(void *dst, const void *src, size_t n, char *err, size_t errlen);
int cuda_rt_d2h(void *dst, const void *src, size_t n, char *err, size_t errlen);

int cuda_rt_stream_create(void **stream, char *err, size_t errlen); /* non-blocking stream */
void cuda_rt_stream_destroy(void *stream);
int cuda_rt_stream_sync(void *stream, char *err, size_t errlen);
int cuda_rt_device_sync(char *err, size_t errlen);

int cuda_rt_event_create(void **ev, char *err, size_t errlen);
void cuda_rt_event_destroy(void *ev);
int cuda_rt_event_record(void *ev, void *stream);
int cuda_rt_event_sync(void *ev, char *err, size_t errlen);
/* Work enqueued on stream after this waits until ev (as last recorded) has completed. */
int cuda_rt_stream_wait_event(void *stream, void *ev);
/* Milliseconds between two recorded, completed events. */
int cuda_rt_event_ms(void *start, void *stop, float *ms, char *err, size_t errlen);

/* The first pending error of the runtime (launch failures, faults), cleared; 0 when none.
 * what names the step in the message ("decode step: ..."). */
int cuda_rt_check(const char *what, char *err, size_t errlen);

/* The launch trace (pdl.cuh; a build with -DFLOE_CUDA_TRACE=ON, else start fails with a one-line
 * error and dump writes nothing): start (re)arms it, zeroed; dump writes the recorded launches in
 * order, one line each: index, global timer ns at the kernel's entry (after its wait), grid x y z,
 * block x. Without a start, dump writes nothing. built: 1 in such a build. */
int cuda_rt_trace_built(void);
#define CUDA_RT_TRACE_N 65536 /* launches the ring keeps */
int cuda_rt_trace_start(char *err, size_t errlen);
int cuda_rt_trace_dump(FILE *f, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
