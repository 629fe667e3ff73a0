/* CUDA graph capture and replay (cuda_graph.h). */
#include <cuda_runtime.h>
#include <stdio.h>

extern "C" {
#include "base/base.h"
}
#include "kernels/cuda/cuda_graph.h"

static int fail(cudaError_t e, const char *what, char *err, size_t errlen) {
  cudaGetLastError(); /* clear a sticky launch error */
  return floe_err(err, errlen, FLOE_E_IO, "cuda: %s: %s", what, cudaGetErrorString(e));
}

extern "C" int cuda_graph_begin(void *stream, char *err, size_t errlen) {
  cudaError_t e = cudaStreamBeginCapture((cudaStream_t)stream, cudaStreamCaptureModeThreadLocal);
  return e == cudaSuccess ? 0 : fail(e, "begin capture", err, errlen);
}

extern "C" int cuda_graph_end(void *stream, void **exec, char *err, size_t errlen) {
  *exec = NULL;
  cudaGraph_t g = NULL;
  cudaError_t e = cudaStreamEndCapture((cudaStream_t)stream, &g);
  if (e != cudaSuccess) return fail(e, "end capture", err, errlen);
  cudaGraphExec_t x = NULL;
  e = cudaGraphInstantiate(&x, g, 0);
  cudaGraphDestroy(g);
  if (e != cudaSuccess) return fail(e, "instantiate graph", err, errlen);
  *exec = (void *)x;
  return 0;
}

extern "C" int cuda_graph_launch(void *exec, void *stream, char *err, size_t errlen) {
  cudaError_t e = cudaGraphLaunch((cudaGraphExec_t)exec, (cudaStream_t)stream);
  return e == cudaSuccess ? 0 : fail(e, "graph launch", err, errlen);
}

extern "C" void cuda_graph_destroy(void *exec) {
  if (exec) cudaGraphExecDestroy((cudaGraphExec_t)exec);
}
