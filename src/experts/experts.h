/* Routed experts streamed from disk under a memory budget (issue 4).
 *
 * Pieces (one file each):
 *  - store.c   where each expert's bytes live: for layer l and expert e, the file ranges of its
 *              parts (GGUF: gate / up / down slabs of the stacked *_exps tensors, 3 ranges; MLX:
 *              codes / scales / biases x 3, 9 ranges; a pack: one 16 KiB-aligned block). The
 *              store is derived from the resident binding: model_bind_experts points every expert
 *              matrix into the file mapping, and pointer - mapping base = file offset. Nothing of
 *              an expert is ever read through the mapping in streaming mode (no page is touched).
 *  - io.c      reads: io_uring (liburing) with a deep queue, or a pread thread pool; O_DIRECT or
 *              buffered (POSIX_FADV_RANDOM: no readahead); large reads split into chunks in flight
 *              together; two priorities (demand before prefetch, a queued prefetch can be promoted).
 *  - cache.c   the expert cache: n fixed-size slots in one arena sized from the budget, LRU or
 *              frequency-aware replacement, pinning while a layer computes, per-layer counters;
 *              and the stream object that ties store, io and cache together.
 *  - prefetch.c predictions of the next layer's experts (its router on this layer's MoE input;
 *              the previous token's experts) and their precision / recall.
 *  - pack.c    `floe pack`: experts rewritten expert-major, one 16 KiB-aligned block per expert,
 *              into DIR/experts.floepack (header + index + blocks); non-expert weights stay in the
 *              original model, which the header names (absolute path and size).
 *
 * Invariant: streaming never changes a value. An expert's matrices in a cache slot hold exactly the
 * file's bytes (the same bytes the mmap would show), and layers.c computes the same rows with the
 * same kernels whatever the order in which experts arrive, so logits are bit-identical to the
 * resident run for every I/O mode, layout, budget and prefetch setting.
 *
 * Threads: one session evaluates at a time per engine (engine.c serializes model_eval when
 * streaming). pread workers touch only io.c's queues (under its mutex); every cache state change
 * happens on the evaluating thread. */
#ifndef FLOE_EXPERTS_H
#define FLOE_EXPERTS_H
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "quant/mat.h"

typedef struct gguf_file gguf_file;
typedef struct st_model st_model;
typedef struct xpack xpack;

/* What src/experts reads of a model: its routed experts and the sources their bytes lie in. The
 * model fills one (model_xs_view) for the call that needs it, so that this module knows no model
 * code. The expert matrices are the model's own: xpack_bind repoints them into a pack. */
typedef struct xs_model {
  int64_t n_layer, n_expert, n_expert_used;
  floe_mat **gate, **up, **down; /* [n_layer]: layer l's n_expert matrices of each projection */
  const gguf_file *gguf;         /* the sources (NULL when absent) */
  const st_model *st;
  const xpack *pack;
  uint64_t owned_bytes;          /* weights the loader converted into its own buffers */
} xs_model;

#define XS_MAX_PARTS 9        /* gate/up/down x (codes, scales, biases) */
#define XS_PAGE 4096u         /* O_DIRECT alignment of offsets, lengths and buffers */
#define XPACK_ALIGN 16384u    /* pack: block alignment */
#define XPACK_FILE "experts.floepack"

/* ---- store ---- */
typedef struct xs_file {
  char *path;
  int fd;        /* buffered, POSIX_FADV_RANDOM */
  int fd_direct; /* O_DIRECT, or -1 */
  uint64_t size; /* at open; a read that finds less is an error ("file shrank") */
} xs_file;

typedef struct xs_layer {
  floe_mat tmpl[3];             /* gate, up, down: shapes and types, pointers unset */
  int n_part;                   /* 3 .. 9: one per matrix, three for an MLX matrix */
  uint8_t part_mat[XS_MAX_PARTS], part_kind[XS_MAX_PARTS]; /* part p = matrix (0 gate, 1 up, 2 down), kind (0 data, 1 scales, 2 biases) */
  int file[XS_MAX_PARTS];       /* part p of every expert lies in file[p] */
  uint64_t len[XS_MAX_PARTS];   /* bytes of part p */
  uint64_t *off;                /* [n_expert][n_part] file offset of each part's data */
  bool block;                   /* pack: the parts are one block, read at once */
  uint64_t block_len;           /* pack: block bytes (multiple of XPACK_ALIGN) */
  uint64_t part_off[XS_MAX_PARTS]; /* pack: part offsets inside the block */
  uint64_t slot_bytes;          /* cache bytes one expert of this layer needs */
  uint64_t expert_bytes;        /* sum of len[] */
} xs_layer;

typedef struct xs_store {
  int n_layer, n_expert, n_used;
  xs_layer *layer;
  xs_file file[8];
  int n_file;
  uint64_t slot_bytes;          /* max over layers */
  uint64_t resident_bytes;      /* non-expert weight bytes that stay mapped (counted in the budget) */
  const uint64_t *cksum;        /* pack: [n_layer][n_expert] block checksums (NULL otherwise) */
} xs_store;

/* Parts of an expert whose matrices are w[0..2] (gate, up, down): data, plus scales and biases for
 * MLX matrices, in that order. Returns their count. */
int xs_parts(const floe_mat *const w[3], uint8_t *mat, uint8_t *kind);
const void *xs_part_ptr(const floe_mat *w, int kind);
uint64_t xs_part_len(const floe_mat *w, int kind);
void xs_part_set(floe_mat *w, int kind, const void *p);
/* Derives the store from m's resident binding. direct: also open the files with O_DIRECT. */
int xs_store_open(const xs_model *m, bool direct, xs_store **out, char *err, size_t errlen);
void xs_store_close(xs_store *st);
/* The reads of expert e of layer l into a slot: n (<= XS_MAX_PARTS) ranges, aligned to XS_PAGE;
 * ptr[p] = offset inside the slot of part p's first byte. */
typedef struct xs_range { int file; uint64_t off, len, need, dst; } xs_range;
int xs_store_reads(const xs_store *st, int l, int e, xs_range *r, uint64_t *ptr);
/* 64-bit checksum of a pack block (also used by pack.c when writing). */
uint64_t xs_checksum(const void *p, size_t n);

/* ---- io ---- */
enum { XIO_AUTO = 0, XIO_URING = 1, XIO_PREAD = 2 }; /* AUTO = PREAD (measured faster, io.c) */
enum { XIO_DEMAND = 0, XIO_PREFETCH = 1 };

typedef struct xio_req {
  int fd;
  uint64_t off, len, need; /* read [off, off+len); at least `need` bytes must exist (EOF) */
  uint8_t *dst;
  void *user;
  int status;              /* after completion: 0, or -errno (-EFBIG: the file ended before `need`) */
  uint64_t got;            /* bytes read */
  /* internal */
  uint64_t next;           /* next byte (relative) to hand out */
  int inflight, prio;
  bool queued, done;
  struct xio_req *qn, *qp;
} xio_req;

typedef struct xio xio;
/* depth: chunks in flight; threads: pread workers; chunk: split size (multiple of XS_PAGE). */
int xio_open(int kind, int depth, int threads, uint64_t chunk, xio **out, char *err, size_t errlen);
void xio_close(xio *io);
int xio_kind(const xio *io);
void xio_submit(xio *io, xio_req *r, int prio);
void xio_promote(xio *io, xio_req *r);
/* Hands completed requests back (at most max); blocks until at least `min` are done (0: never
 * blocks). Returns the count, or a negative FLOE_E_* when the engine itself failed. */
int xio_poll(xio *io, int min, xio_req **out, int max);
/* Disk accounting: seconds with at least one chunk in flight since open, and when the last chunk
 * completed (now while chunks are in flight). */
void xio_times(xio *io, double *busy_s, double *last_done);
/* Tests: the nth chunk read from now (1 = the next) fails with EIO; 0 disarms. */
void xio_test_inject_eio(int64_t nth);

/* ---- stream (cache + io + store) ---- */
enum { XS_POLICY_LRU = 0, XS_POLICY_LFU = 1 };
enum { XS_PF_NEXT = 1, XS_PF_PREV = 2 }; /* prefetch kinds (bit mask) */
/* XS_PF_RESID (with XS_PF_NEXT): layer l+1's router sees the residual stream after layer l's
 * attention normed with layer l+1's ffn_norm, instead of layer l's normed MoE input. */
enum { XS_PF_RESID = 4 };

typedef struct xs_params {
  uint64_t cache_bytes;  /* slot arena */
  int io_kind;           /* XIO_* */
  bool direct;
  int policy;            /* XS_POLICY_* */
  int prefetch;          /* XS_PF_* mask */
  int depth, threads;
  uint64_t chunk;
  bool verify;           /* pack: check each block's checksum after reading it */
  bool no_prefault;      /* leave the arena to first-touch faults (default: a background thread
                          * populates it with MADV_POPULATE_WRITE, see cache.c) */
} xs_params;

typedef struct xs_layer_stats { uint64_t hits, misses; } xs_layer_stats;

typedef struct xs_stats {
  uint64_t bytes_read, reads, hits, inflight_hits, misses, evictions;
  uint64_t pf_issued, pf_used, pf_wasted;           /* prefetch reads: issued, then used / evicted unused */
  uint64_t pred_n[3], pred_hit[3], actual_n[3];     /* per kind (1 next, 2 prev; 0 = union of enabled) */
  double io_wait_s;                                 /* evaluating thread blocked on demand reads */
  /* I/O roofline terms (see cache.c, xs_lock / xs_unlock): */
  double disk_busy_s;   /* at least one read in flight */
  double serial_s;      /* per evaluation: start -> first read queued, plus last read done -> end
                         * (all of it when nothing was read): compute no read could overlap */
  double eval_s;        /* evaluations, lock to unlock */
  uint64_t n_eval;
  double prefault_s;    /* background arena population: seconds it took (0 while running / off, -1 refused) */
} xs_stats;

typedef struct xstream xstream;
int xs_open(const xs_model *m, const xs_params *p, xstream **out, char *err, size_t errlen);
void xs_close(xstream *x);
const xs_store *xs_store_of(const xstream *x);
int64_t xs_n_slots(const xstream *x);
const xs_params *xs_params_of(const xstream *x);
/* The slot arena (every slot's bytes): a device backend may page-lock it for its copies. */
void xs_arena(const xstream *x, void **base, size_t *bytes);
/* One evaluation at a time per stream (model_eval holds it from before layer 0 until its logits
 * are computed; the interval is also the unit of the serial-time accounting). */
void xs_lock(xstream *x);
void xs_unlock(xstream *x);

/* Demand: experts es[0..n) of layer l (n <= xs_n_slots) get a slot each (slot[i]), pinned until
 * xs_release. Cached ones are hits; others are read at demand priority (a queued prefetch of the
 * same expert is promoted). Returns 0 or FLOE_E_NOMEM when n slots cannot be pinned. */
int xs_acquire(xstream *x, int l, const int32_t *es, int n, int32_t *slot);
/* Prefetch: reads experts es[0..n) of layer l at prefetch priority into unpinned slots (skips
 * cached ones; never evicts a pinned or in-flight slot). kind: XS_PF_*. */
void xs_prefetch(xstream *x, int l, const int32_t *es, int n, int kind);
/* Pushes queued reads to the disk. */
void xs_kick(xstream *x);
/* Waits until at least one of slot[0..n) with ready[i] == 0 is loaded; sets ready[i] = 1 for every
 * loaded one. Returns 0, or the read's error (message in err). */
int xs_wait(xstream *x, const int32_t *slot, int n, uint8_t *ready, char *err, size_t errlen);
/* The three matrices (gate, up, down) of a loaded slot. */
const floe_mat *xs_mats(const xstream *x, int32_t slot);
void xs_release(xstream *x, const int32_t *slot, int n);

void xs_stats_get(const xstream *x, xs_stats *out);
void xs_stats_reset(xstream *x);
const xs_layer_stats *xs_layer_stats_of(const xstream *x); /* [n_layer] */

/* ---- prefetch prediction bookkeeping (prefetch.c) ---- */
/* Records the prediction of kind k for layer l (the experts expected at l) and, later, the actual
 * selection, counting precision / recall. */
void xs_predict_note(xstream *x, int l, int kind, const int32_t *es, int n);
void xs_actual_note(xstream *x, int l, const int32_t *es, int n);
/* Previous token's selection at layer l (n_used ids, or n = 0 when none yet). */
int xs_prev_sel(const xstream *x, int l, int32_t *es);

/* ---- device slots (vslots.c) ----
 * Which routed experts a device's expert pool holds: n_slots slots, least recently used replaced
 * first. The backend owns the bytes (slot s at base + s * stride); this only keeps the tables.
 * One evaluating thread at a time. */
typedef struct xv_slots xv_slots;
int xv_open(int64_t n_layer, int64_t n_expert, int64_t n_slots, xv_slots **out); /* 0 or FLOE_E_* */
void xv_close(xv_slots *v);
int64_t xv_n_slots(const xv_slots *v);
/* The slot holding expert e of layer l, or -1. A hit becomes the most recently used and is held
 * (never the victim of xv_take) until xv_release_all. */
int32_t xv_find(xv_slots *v, int64_t l, int32_t e);
/* Whether expert e of layer l has a slot, without touching its recency or holding it. */
bool xv_has(const xv_slots *v, int64_t l, int32_t e);
/* A slot for expert e of layer l (which the caller then fills): its own slot when it has one, else
 * a free slot, else the least recently used one not held; held afterwards. *old_l / *old_e: the
 * expert it held before (-1: none). -1 when every slot is held. */
int32_t xv_take(xv_slots *v, int64_t l, int32_t e, int64_t *old_l, int32_t *old_e);
/* Slot s holds nothing any more (its contents are not to be trusted: a copy into it failed); it
 * is not held, and the next take uses it first. */
void xv_forget(xv_slots *v, int32_t s);
/* Ends a step: no slot is held any more. */
void xv_release_all(xv_slots *v);
/* Tests: 0 when the tables are consistent (map and owners agree, the list holds every slot once). */
int xv_check(const xv_slots *v);

/* ---- pack ---- */
typedef struct xpack xpack;
/* DIR holds experts.floepack: validates the header and index against the file. */
int xpack_open(const char *dir, xpack **out, char *err, size_t errlen);
void xpack_close(xpack *p);
const char *xpack_source(const xpack *p);
/* Points m's routed expert matrices into the pack (checks the sizes against the model). */
int xpack_bind(const xpack *p, const xs_model *m, char *err, size_t errlen);
bool xpack_is_dir(const char *path);
/* Writes DIR/experts.floepack from the loaded model m (source = the path m was loaded from). */
int xpack_write(const xs_model *m, const char *source, const char *dir, char *err, size_t errlen);
/* The pack's mapping (for the store) and its checksum table. */
void xpack_map(const xpack *p, const uint8_t **map, uint64_t *size, const char **path, const uint64_t **cksum);
#endif
