/* floe CLI: one file per subcommand; each cmd_* gets argv after the subcommand name and returns
 * the process exit code (0 ok, 1 runtime error, 2 usage error). */
#ifndef FLOE_CLI_H
#define FLOE_CLI_H
int cmd_info(int argc, char **argv);
int cmd_synth(int argc, char **argv);
int cmd_convert(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_tokenize(int argc, char **argv);
int cmd_bench(int argc, char **argv);
int cmd_serve(int argc, char **argv);
int cmd_pack(int argc, char **argv);
int cmd_quantize(int argc, char **argv);
int cmd_perplexity(int argc, char **argv);
/* Streaming options of run / bench (cmd_pack.c): 0 not one, 1 a flag, 2 took the value v, -1 bad. */
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include "floe.h"
int cli_stream_option(const char *a, const char *v, floe_engine_params *p);
const char *cli_stream_help(void);
/* --device VALUE into p (0, or -1 for a bad value); the engine's device line on stderr. */
int cli_device_option(const char *v, floe_engine_params *p);
void cli_device_note(const floe_engine *e);
void cli_stream_stats(FILE *f, const floe_engine *e, const floe_session_stats *st, int64_t n_tok, double secs, bool json);
/* A whole decimal integer in [lo, hi] (no sign-only, empty, trailing or out-of-range text). */
bool cli_parse_int(const char *s, long long lo, long long hi, long long *out);
/* Prints "floe: <msg>" to stderr and returns 1. */
int cli_fail(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

/* Progress bar on stderr (progress.c): drawn only when stderr is a TTY. */
typedef struct cli_progress {
  const char *what, *unit;
  double scale, t0, last;
  uint64_t final_done;
  bool tty, drawn, final_drawn;
} cli_progress;
/* unit: what `done` counts after division by unit_scale ("MB" with 1e6, "tok" with 1). */
void cli_progress_init(cli_progress *p, const char *what, const char *unit, double unit_scale);
void cli_progress_update(cli_progress *p, uint64_t done, uint64_t total); /* total 0: unknown */
void cli_progress_done(cli_progress *p); /* ends the line if one was drawn */
/* Adapter for the library's progress callbacks: user is a cli_progress. */
void cli_progress_cb(void *user, uint64_t done, uint64_t total);
/* The bar of a model load: "load", in MB. */
void cli_progress_load_init(cli_progress *p);
/* floe_engine_open(p) with the load bar, its line ended before returning; on failure the error is
 * printed as "floe: <err>" (cli_fail) and the open's code returned. */
int cli_engine_open(const floe_engine_params *p, floe_engine **e, char *err, size_t errlen);
#endif
