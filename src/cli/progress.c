/* Progress bars for the CLI: one line on stderr redrawn in place, only when stderr is a terminal
 * (a log or a pipe gets nothing), at most 8 times a second, with the rate and the ETA when the
 * total is known. Nothing is drawn during the first half second, so quick steps (loading a small
 * model) leave no bar behind. The library reports progress through callbacks; only the CLI draws.
 * cli_engine_open is the engine open of the subcommands that load a model in the foreground. */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "base/base.h"
#include "cli/cli.h"

#define CLI_PROGRESS_DELAY_S 0.5

void cli_progress_init(cli_progress *p, const char *what, const char *unit, double unit_scale) {
  memset(p, 0, sizeof *p);
  p->what = what;
  p->unit = unit;
  p->scale = unit_scale > 0 ? unit_scale : 1;
  p->tty = isatty(2) == 1;
  p->t0 = floe_time_s();
}

static void fmt_secs(char *b, size_t n, double s) {
  if (s < 0 || s > 1e7) snprintf(b, n, "?");
  else if (s < 60) snprintf(b, n, "%.0fs", s);
  else if (s < 3600) snprintf(b, n, "%dm%02ds", (int)(s / 60), (int)s % 60);
  else snprintf(b, n, "%dh%02dm", (int)(s / 3600), (int)(s / 60) % 60);
}

void cli_progress_update(cli_progress *p, uint64_t done, uint64_t total) {
  if (!p->tty) return;
  const double now = floe_time_s();
  const bool final = total && done >= total;
  if (now - p->t0 < CLI_PROGRESS_DELAY_S) return;
  if (final && p->final_drawn && done == p->final_done) return; /* the same end reported twice */
  if (!final && now - p->last < 0.125) return;
  p->final_drawn = final;
  p->final_done = done;
  p->last = now;
  const double el = now - p->t0, d = (double)done / p->scale, t = (double)total / p->scale;
  const double rate = el > 0 ? d / el : 0;
  char eta[32] = "", bar[32];
  int fill = total ? (int)(24.0 * (double)done / (double)total) : 0;
  if (fill > 24) fill = 24;
  for (int i = 0; i < 24; i++) bar[i] = i < fill ? '#' : (total ? '.' : ' ');
  bar[24] = 0;
  if (total && rate > 0 && !final) {
    char s[16];
    fmt_secs(s, sizeof s, (t - d) / rate);
    snprintf(eta, sizeof eta, "  ETA %s", s);
  } else if (final) {
    char s[16];
    fmt_secs(s, sizeof s, el);
    snprintf(eta, sizeof eta, "  in %s", s);
  }
  if (total)
    fprintf(stderr, "\r\033[K%s [%s] %3.0f%%  %.1f/%.1f %s  %.1f %s/s%s", p->what, bar, 100.0 * (double)done / (double)total,
            d, t, p->unit, rate, p->unit, eta);
  else
    fprintf(stderr, "\r\033[K%s  %.1f %s  %.1f %s/s", p->what, d, p->unit, rate, p->unit);
  p->drawn = true;
  fflush(stderr);
}

void cli_progress_done(cli_progress *p) {
  if (p->tty && p->drawn) {
    fputc('\n', stderr);
    fflush(stderr);
  }
  p->drawn = false;
}

void cli_progress_cb(void *user, uint64_t done, uint64_t total) { cli_progress_update(user, done, total); }

void cli_progress_load_init(cli_progress *p) { cli_progress_init(p, "load", "MB", 1e6); }

/* The bar lives in this frame only: the engine calls progress during floe_engine_open and never
 * after, so the caller's params are left as they were (no callback pointing at a dead frame). */
int cli_engine_open(const floe_engine_params *p, floe_engine **e, char *err, size_t errlen) {
  cli_progress pr;
  cli_progress_load_init(&pr);
  floe_engine_params q = *p;
  q.progress = cli_progress_cb;
  q.progress_user = &pr;
  const int rc = floe_engine_open(&q, e, err, errlen);
  cli_progress_done(&pr);
  if (rc) cli_fail("%s", err);
  return rc;
}
