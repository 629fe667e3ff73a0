/* CUDA graphs for the backend: capture the work a stream is given into a graph, replay it.
 * A decode step is captured once per session and shape and replayed at every later position
 * (the kernels read the position and token from device memory). Plain C; streams and graphs are
 * opaque pointers (cudaStream_t, cudaGraphExec_t). */
#ifndef FLOE_CUDA_GRAPH_H
#define FLOE_CUDA_GRAPH_H
#include <stddef.h>
#ifdef __cplusplus
extern "C" {
#endif
/* Starts capturing the work given to stream (thread-local capture mode). 0 or FLOE_E_*. */
int cuda_graph_begin(void *stream, char *err, size_t errlen);
/* Ends the capture and instantiates it into *exec. 0 or FLOE_E_* (the capture is dropped). */
int cuda_graph_end(void *stream, void **exec, char *err, size_t errlen);
/* Replays exec on stream (asynchronous). 0 or FLOE_E_*. */
int cuda_graph_launch(void *exec, void *stream, char *err, size_t errlen);
void cuda_graph_destroy(void *exec); /* NULL is fine */
#ifdef __cplusplus
}
#endif
#endif
