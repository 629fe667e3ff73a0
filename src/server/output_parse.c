/* Reasoning / content / tool-call splitting of generated text (see output_parse.h). */
#define _GNU_SOURCE /* memmem */
#include "server/output_parse.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char T_THINK[] = "<think>", T_THINK_END[] = "</think>";
static const char T_CALL[] = "<tool_call>", T_CALL_END[] = "</tool_call>";

void outp_init(outp *p, bool parse_tools, bool incremental, bool think_open, const cJSON *tools, outp_sink sink) {
  memset(p, 0, sizeof *p);
  p->parse_tools = parse_tools;
  p->incremental = incremental;
  p->tools = tools;
  p->sink = sink;
  p->mode = think_open ? OUTP_REASONING : OUTP_CONTENT;
  p->think_done = think_open;
}

int outp_mode(const outp *p) { return p->mode; }

void outp_free(outp *p) {
  sb_free(&p->pend);
  sb_free(&p->hold);
  sb_free(&p->call);
}

/* Length of the longest suffix of s[0..n) that is a proper prefix of tag. */
static size_t partial_tag(const char *s, size_t n, const char *tag) {
  size_t tl = strlen(tag);
  for (size_t k = tl - 1; k > 0; k--)
    if (k <= n && !memcmp(s + n - k, tag, k)) return k;
  return 0;
}

static bool is_ws(char c) { return c == ' ' || c == '\n' || c == '\t' || c == '\r'; }

/* ---- content and reasoning with whitespace handling ---- */

static void emit_content(outp *p, const char *s, size_t n) {
  if (!p->content_seen) /* leading whitespace of the reply is dropped */
    while (n && is_ws(*s)) s++, n--;
  size_t last = n;
  while (last > 0 && is_ws(s[last - 1])) last--;
  if (last > 0) {
    if (p->hold.n) p->sink.content(p->sink.user, p->hold.p, p->hold.n);
    p->hold.n = 0;
    p->sink.content(p->sink.user, s, last);
    p->content_seen = true;
  }
  if (n > last) sb_add(&p->hold, s + last, n - last);
}

static void emit_reasoning(outp *p, const char *s, size_t n) {
  if (!p->reason_seen) {
    while (n && (*s == '\n' || *s == '\r')) s++, n--;
  }
  size_t last = n;
  while (last > 0 && (s[last - 1] == '\n' || s[last - 1] == '\r')) last--;
  if (last > 0) {
    if (p->hold.n) p->sink.reasoning(p->sink.user, p->hold.p, p->hold.n);
    p->hold.n = 0;
    p->sink.reasoning(p->sink.user, s, last);
    p->reason_seen = true;
  }
  if (n > last && p->reason_seen) sb_add(&p->hold, s + last, n - last);
}

/* ---- tool calls ---- */

static const cJSON *tool_schema(const cJSON *tools, const char *name) {
  const cJSON *t;
  cJSON_ArrayForEach(t, tools) {
    const cJSON *f = cJSON_GetObjectItemCaseSensitive(t, "function");
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(f ? f : t, "name");
    if (cJSON_IsString(nm) && !strcmp(nm->valuestring, name)) {
      const cJSON *ps = cJSON_GetObjectItemCaseSensitive(f ? f : t, "parameters");
      return cJSON_IsObject(ps) ? ps : NULL;
    }
  }
  return NULL;
}

static bool type_allows(const cJSON *type, const char *want) {
  if (cJSON_IsString(type)) return !strcmp(type->valuestring, want);
  const cJSON *t;
  cJSON_ArrayForEach(t, type) if (cJSON_IsString(t) && !strcmp(t->valuestring, want)) return true;
  return false;
}

void outp_typed_value(const cJSON *tools, const char *name, const char *param, const char *v, size_t n, sbuf *out) {
  const cJSON *ps = tools ? tool_schema(tools, name) : NULL;
  const cJSON *props = ps ? cJSON_GetObjectItemCaseSensitive(ps, "properties") : NULL;
  const cJSON *pr = props ? cJSON_GetObjectItemCaseSensitive(props, param) : NULL;
  const cJSON *type = pr ? cJSON_GetObjectItemCaseSensitive(pr, "type") : NULL;
  /* a NUL is a byte like any other in the model's text (a token can hold one): the value is
   * typed only without one (the C-string parsers below would stop at it), and written whole */
  char *s = malloc(n + 1);
  if (!s) {
    out->oom = true;
    return;
  }
  memcpy(s, v, n);
  s[n] = 0;
  if (type && !memchr(v, 0, n)) {
    char *end;
    if (type_allows(type, "null") && !strcmp(s, "null")) {
      sb_str(out, "null");
      goto done;
    }
    if (type_allows(type, "integer") && n) {
      errno = 0;
      long long x = strtoll(s, &end, 10);
      if (!*end && !errno) {
        sb_printf(out, "%lld", x);
        goto done;
      }
    }
    if (type_allows(type, "number") && n) {
      errno = 0;
      double x = strtod(s, &end);
      if (!*end && !errno && isfinite(x) && !isspace((unsigned char)s[0])) {
        cJSON *num = cJSON_CreateNumber(x);
        char *txt = num ? cJSON_PrintUnformatted(num) : NULL;
        if (txt) sb_str(out, txt);
        else out->oom = true;
        free(txt);
        cJSON_Delete(num);
        goto done;
      }
    }
    if (type_allows(type, "boolean")) {
      if (!strcasecmp(s, "true") || !strcasecmp(s, "false")) {
        sb_str(out, tolower((unsigned char)s[0]) == 't' ? "true" : "false");
        goto done;
      }
    }
    if (type_allows(type, "object") || type_allows(type, "array")) {
      cJSON *j = cJSON_ParseWithLength(s, n);
      if (j && ((cJSON_IsObject(j) && type_allows(type, "object")) || (cJSON_IsArray(j) && type_allows(type, "array")))) {
        char *txt = cJSON_PrintUnformatted(j);
        if (txt) sb_str(out, txt);
        else out->oom = true;
        free(txt);
        cJSON_Delete(j);
        goto done;
      }
      cJSON_Delete(j);
    }
  }
  sb_json_str(out, v, n);
done:
  free(s);
}

static void call_start(outp *p, const char *name) {
  srv_rand_id(p->id, sizeof p->id, "call_", 24);
  p->sink.tool_start(p->sink.user, p->n_calls, p->id, name);
  p->started = true;
}

static void call_args(outp *p, const char *s, size_t n) {
  if (n) p->sink.tool_args(p->sink.user, p->n_calls, s, n);
}

/* XML form: "<function=NAME>" then parameters. Returns false when the text is not of that form.
 * Parses from p->scan; complete=true means the whole call is present. On success with complete,
 * every parameter has been emitted and the arguments closed. */
static bool xml_step(outp *p, bool complete) {
  const char *b = p->call.p ? p->call.p : "";
  size_t n = p->call.n, i = p->scan;
  while (i < n && is_ws(b[i])) i++;
  if (!p->started) {
    static const char F[] = "<function=";
    size_t fl = sizeof F - 1;
    if (n - i < fl) return !complete && !memcmp(b + i, F, n - i);
    if (memcmp(b + i, F, fl)) return false;
    const char *gt = memchr(b + i + fl, '>', n - i - fl);
    if (!gt) return !complete && !memchr(b + i + fl, '\n', n - i - fl);
    size_t nl = (size_t)(gt - (b + i + fl));
    if (nl == 0 || nl > 200 || memchr(b + i + fl, '\n', nl) || memchr(b + i + fl, '<', nl)) return false;
    memcpy(p->fname, b + i + fl, nl);
    p->fname[nl] = 0;
    call_start(p, p->fname);
    i = (size_t)(gt - b) + 1;
    p->scan = i;
  }
  for (;;) {
    while (i < n && is_ws(b[i])) i++;
    p->scan = i;
    if (p->args_closed) return true;
    static const char P[] = "<parameter=", FE[] = "</function>", PE[] = "</parameter>";
    if (n - i >= sizeof FE - 1 && !memcmp(b + i, FE, sizeof FE - 1)) {
      call_args(p, p->args_open ? "}" : "{}", p->args_open ? 1 : 2);
      p->args_open = true;
      p->args_closed = true;
      p->scan = i + sizeof FE - 1;
      return true;
    }
    if (n - i < sizeof P - 1 || memcmp(b + i, P, sizeof P - 1)) {
      /* incomplete tag or junk */
      bool maybe = (n - i < sizeof P - 1 && !memcmp(b + i, P, n - i)) ||
                   (n - i < sizeof FE - 1 && !memcmp(b + i, FE, n - i));
      if (complete && i == n) { /* no </function>: accept the parameters so far */
        call_args(p, p->args_open ? "}" : "{}", p->args_open ? 1 : 2);
        p->args_open = p->args_closed = true;
        return true;
      }
      return !complete && maybe;
    }
    const char *gt = memchr(b + i + sizeof P - 1, '>', n - i - (sizeof P - 1));
    if (!gt) return !complete;
    const char *vs = gt + 1;
    const char *ve = memmem(vs, (size_t)(b + n - vs), PE, sizeof PE - 1);
    if (!ve) return !complete;
    size_t pl = (size_t)(gt - (b + i + sizeof P - 1));
    if (pl == 0 || pl > 200) return false;
    char pname[208];
    memcpy(pname, b + i + sizeof P - 1, pl);
    pname[pl] = 0;
    /* the value: one leading and one trailing newline belong to the format */
    const char *v0 = vs, *v1 = ve;
    if (v0 < v1 && *v0 == '\n') v0++;
    if (v1 > v0 && v1[-1] == '\n') v1--;
    sbuf frag = {0};
    sb_str(&frag, p->args_open ? ", " : "{");
    sb_json_str(&frag, pname, pl);
    sb_str(&frag, ": ");
    outp_typed_value(p->tools, p->fname, pname, v0, (size_t)(v1 - v0), &frag);
    call_args(p, frag.p, frag.n);
    sb_free(&frag);
    p->args_open = true;
    p->n_params++;
    i = (size_t)(ve - b) + sizeof PE - 1;
  }
}

/* JSON string at b[i..n): returns the index after the closing quote, 0 if incomplete, -1 if bad. */
static long json_string_end(const char *b, size_t n, size_t i) {
  if (i >= n) return 0;
  if (b[i] != '"') return -1;
  for (size_t k = i + 1; k < n; k++) {
    if (b[k] == '\\') k++;
    else if (b[k] == '"') return (long)k + 1;
  }
  return 0;
}

/* At b[*io..n): whitespace, the string "key", whitespace, ':' and whitespace. 1: all there (*io
 * moved past them); 0: the text ends first (wait for more); -1: something else is there. */
static int json_key(const char *b, size_t n, size_t *io, const char *key) {
  size_t i = *io;
  const size_t kl = strlen(key);
  while (i < n && is_ws(b[i])) i++;
  const long e = json_string_end(b, n, i);
  if (e == 0) return 0;
  if (e < 0 || (size_t)e - i != kl + 2 || memcmp(b + i + 1, key, kl)) return -1;
  i = (size_t)e;
  while (i < n && is_ws(b[i])) i++;
  if (i == n) return 0;
  if (b[i] != ':') return -1;
  i++;
  while (i < n && is_ws(b[i])) i++;
  *io = i;
  return 1;
}

/* JSON form, incremental: header when "name" is known, then the raw arguments bytes. Returns
 * false when the text cannot be parsed this way (the final parse then decides). */
static bool json_step(outp *p) {
  const char *b = p->call.p ? p->call.p : "";
  size_t n = p->call.n, i = p->scan;
#define WS() while (i < n && is_ws(b[i])) i++
  if (!p->started) {
    WS();
    if (i == n) return true;
    if (b[i] != '{') return false;
    i++;
    const int k = json_key(b, n, &i, "name");
    if (k <= 0) return k == 0;
    long e = json_string_end(b, n, i);
    if (e == 0) return true;
    if (e < 0) return false;
    cJSON *nm = cJSON_ParseWithLength(b + i, (size_t)e - i);
    if (!cJSON_IsString(nm) || !nm->valuestring[0]) {
      cJSON_Delete(nm);
      return false;
    }
    call_start(p, nm->valuestring);
    cJSON_Delete(nm);
    p->scan = i = (size_t)e;
  }
  if (!p->args_at) {
    WS();
    if (i == n) return true;
    if (b[i] != ',') return false;
    i++;
    const int k = json_key(b, n, &i, "arguments");
    if (k <= 0) return k == 0;
    if (i == n) return true;
    if (b[i] != '{') return false;
    p->args_at = i;
    p->scan = i;
  }
  /* stream the object's bytes until its closing brace */
  size_t from = p->scan;
  for (i = p->scan; i < n && !p->args_closed; i++) {
    char c = b[i];
    if (p->in_str) {
      if (p->esc) p->esc = false;
      else if (c == '\\') p->esc = true;
      else if (c == '"') p->in_str = false;
    } else if (c == '"') p->in_str = true;
    else if (c == '{' || c == '[') p->depth++;
    else if (c == '}' || c == ']') {
      if (--p->depth == 0) p->args_closed = true;
    }
  }
  call_args(p, b + from, i - from);
  p->args_open = true;
  p->scan = i;
  return true;
#undef WS
}

typedef struct xml_coll { sbuf args; char name[208]; } xml_coll;
static void coll_start(void *u, int index, const char *id, const char *name) {
  (void)index, (void)id;
  xml_coll *c = u;
  snprintf(c->name, sizeof c->name, "%s", name);
}
static void coll_args(void *u, int index, const char *s, size_t n) {
  (void)index;
  sb_add(&((xml_coll *)u)->args, s, n);
}

/* Whole-call parse (Qwen3 JSON or Qwen3.5 XML). Returns name and arguments JSON (malloc'ed) or
 * false. */
static bool parse_whole(const cJSON *tools, const char *b, size_t n, char **name, char **args) {
  *name = *args = NULL;
  size_t i = 0;
  while (i < n && is_ws(b[i])) i++;
  if (i < n && b[i] == '{') {
    cJSON *j = cJSON_ParseWithLength(b + i, n - i);
    const cJSON *nm = cJSON_GetObjectItemCaseSensitive(j, "name");
    const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "arguments");
    if (!a) a = cJSON_GetObjectItemCaseSensitive(j, "parameters");
    bool ok = cJSON_IsString(nm) && nm->valuestring[0] && (!a || cJSON_IsObject(a) || cJSON_IsString(a));
    if (ok && cJSON_IsString(a)) { /* arguments given as a JSON string: must hold an object */
      cJSON *inner = cJSON_Parse(a->valuestring);
      ok = cJSON_IsObject(inner);
      if (ok) *args = cJSON_PrintUnformatted(inner);
      cJSON_Delete(inner);
    } else if (ok && a) {
      /* keep the sampled bytes of the object (what streaming sends), else cJSON's printing */
      outp q;
      xml_coll c = {0};
      outp_sink sk = {&c, NULL, NULL, coll_start, coll_args};
      outp_init(&q, true, true, false, NULL, sk);
      sb_add(&q.call, b, n);
      q.form = 2;
      if (json_step(&q) && q.args_closed && !c.args.oom && c.args.n) *args = strndup(c.args.p, c.args.n);
      else *args = cJSON_PrintUnformatted(a);
      sb_free(&c.args);
      outp_free(&q);
    } else if (ok) {
      *args = strdup("{}");
    }
    if (ok) *name = strdup(nm->valuestring);
    cJSON_Delete(j);
    if (ok && *name && *args) return true;
    free(*name);
    free(*args);
    *name = *args = NULL;
    return false;
  }
  /* XML: run the incremental parser on a private copy with a collecting sink */
  outp q;
  xml_coll c = {0};
  outp_sink sk = {&c, NULL, NULL, coll_start, coll_args};
  outp_init(&q, true, true, false, tools, sk);
  sb_add(&q.call, b, n);
  q.form = 1;
  bool ok = xml_step(&q, true) && q.args_closed && !c.args.oom && c.name[0];
  /* nothing but whitespace may follow </function> */
  for (size_t k = q.scan; ok && k < n; k++) ok = is_ws(b[k]);
  if (ok) {
    *name = strdup(c.name);
    *args = strndup(c.args.p ? c.args.p : "{}", c.args.n);
  }
  sb_free(&c.args);
  outp_free(&q);
  if (ok && *name && *args) return true;
  free(*name);
  free(*args);
  *name = *args = NULL;
  return false;
}

/* Incremental parse of the open call (streaming). */
static void call_progress(outp *p) {
  if (!p->incremental || p->form == 3) return;
  if (p->form == 0) {
    size_t i = 0;
    while (i < p->call.n && is_ws(p->call.p[i])) i++;
    if (i == p->call.n) return;
    p->form = p->call.p[i] == '{' ? 2 : p->call.p[i] == '<' ? 1 : 3;
  }
  bool ok = p->form == 1 ? xml_step(p, false) : p->form == 2 ? json_step(p) : false;
  if (!ok) p->form = 3;
}

static void call_reset(outp *p) {
  p->call.n = 0;
  p->form = 0;
  p->started = p->args_open = p->args_closed = false;
  p->n_params = 0;
  p->scan = p->args_at = 0;
  p->depth = 0;
  p->in_str = p->esc = false;
}

/* The call's text is complete (terminated: its </tool_call> was seen). */
static void call_end(outp *p, bool terminated) {
  char *name = NULL, *args = NULL;
  const char *b = p->call.p ? p->call.p : "";
  bool ok = terminated && parse_whole(p->tools, b, p->call.n, &name, &args);
  if (p->incremental && p->started) {
    if (p->form == 1 && !p->args_closed && !xml_step(p, true)) p->form = 3;
    if (!p->args_open) call_args(p, ok ? args : "{}", strlen(ok ? args : "{}"));
    else if (p->form == 1 && !p->args_closed) call_args(p, "}", 1);
    p->n_calls++;
  } else if (ok) {
    call_start(p, name);
    call_args(p, args, strlen(args));
    p->n_calls++;
  } else {
    p->hold.n = 0;
    sbuf raw = {0};
    sb_str(&raw, T_CALL);
    sb_add(&raw, b, p->call.n);
    if (terminated) sb_str(&raw, T_CALL_END);
    if (!raw.oom) emit_content(p, raw.p, raw.n);
    sb_free(&raw);
  }
  free(name);
  free(args);
  call_reset(p);
}

static void pend_consume(outp *p, size_t k) {
  memmove(p->pend.p, p->pend.p + k, p->pend.n - k);
  p->pend.n -= k;
}

void outp_feed(outp *p, const char *s, size_t n) {
  if (n) sb_add(&p->pend, s, n);
  while (p->pend.n) {
    const char *b = p->pend.p;
    size_t m = p->pend.n;
    if (p->mode == OUTP_CONTENT) {
      bool want_think = !p->think_done && !p->content_seen && p->n_calls == 0;
      const char *th = want_think ? memmem(b, m, T_THINK, sizeof T_THINK - 1) : NULL;
      const char *tc = p->parse_tools ? memmem(b, m, T_CALL, sizeof T_CALL - 1) : NULL;
      /* "<think>" counts only when nothing but whitespace precedes it */
      if (th) {
        for (const char *q = b; q < th && th; q++)
          if (!is_ws(*q)) th = NULL;
      }
      if (th && (!tc || th < tc)) {
        p->hold.n = 0;
        pend_consume(p, (size_t)(th - b) + sizeof T_THINK - 1);
        p->mode = OUTP_REASONING;
        p->think_done = true;
        continue;
      }
      if (tc) {
        emit_content(p, b, (size_t)(tc - b));
        p->hold.n = 0;
        pend_consume(p, (size_t)(tc - b) + sizeof T_CALL - 1);
        p->mode = OUTP_TOOL;
        continue;
      }
      size_t keep = 0, k;
      if (want_think && (k = partial_tag(b, m, T_THINK)) > keep) keep = k;
      if (p->parse_tools && (k = partial_tag(b, m, T_CALL)) > keep) keep = k;
      emit_content(p, b, m - keep);
      pend_consume(p, m - keep);
      break;
    } else if (p->mode == OUTP_REASONING) {
      const char *te = memmem(b, m, T_THINK_END, sizeof T_THINK_END - 1);
      if (te) {
        emit_reasoning(p, b, (size_t)(te - b));
        p->hold.n = 0;
        pend_consume(p, (size_t)(te - b) + sizeof T_THINK_END - 1);
        p->mode = OUTP_CONTENT;
        continue;
      }
      size_t keep = partial_tag(b, m, T_THINK_END);
      emit_reasoning(p, b, m - keep);
      pend_consume(p, m - keep);
      break;
    } else {
      const char *ce = memmem(b, m, T_CALL_END, sizeof T_CALL_END - 1);
      if (ce) {
        sb_add(&p->call, b, (size_t)(ce - b));
        call_progress(p);
        pend_consume(p, (size_t)(ce - b) + sizeof T_CALL_END - 1);
        call_end(p, true);
        p->mode = OUTP_CONTENT;
        continue;
      }
      size_t keep = partial_tag(b, m, T_CALL_END);
      sb_add(&p->call, b, m - keep);
      pend_consume(p, m - keep);
      call_progress(p);
      break;
    }
  }
}

void outp_finish(outp *p) {
  /* a partial tag left in pend is plain text */
  if (p->mode == OUTP_TOOL) {
    sb_add(&p->call, p->pend.p, p->pend.n);
    p->pend.n = 0;
    call_end(p, false);
    p->mode = OUTP_CONTENT;
  }
  if (p->pend.n) {
    size_t n = p->pend.n;
    p->pend.n = 0;
    if (p->mode == OUTP_REASONING) emit_reasoning(p, p->pend.p, n);
    else emit_content(p, p->pend.p, n);
  }
  /* held trailing whitespace: kept for a plain reply, dropped after tool calls */
  if (p->mode == OUTP_CONTENT && p->hold.n && p->content_seen && p->n_calls == 0)
    p->sink.content(p->sink.user, p->hold.p, p->hold.n);
  p->hold.n = 0;
}
