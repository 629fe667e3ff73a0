/* Qwen chat templates in C. Each renderer is a transcription of the model's chat_template
 * (tests/fixtures/tokenizer/qwen3_chat_template.jinja, qwen35_chat_template.jinja,
 * qwen36_chat_template.jinja); comments quote the Jinja they implement. tests/test_chat.sh checks
 * byte equality against @huggingface/jinja rendering the real templates. */
#define _GNU_SOURCE
#include "tok/chat.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/base.h"

#define APPEND(b, s, n) do { if (tok_buf_append((b), (s), (n))) return FLOE_E_NOMEM; } while (0)
#define APPS(b, s) APPEND(b, s, strlen(s))

/* ---------------------------------------------------------------------------------------------
 * a minimal JSON reader that re-serialises as Python's json.dumps(ensure_ascii=False) */
typedef struct jcur { const char *s; size_t n, i; int depth; } jcur;

static void jws(jcur *c) {
  while (c->i < c->n && (c->s[c->i] == ' ' || c->s[c->i] == '\t' || c->s[c->i] == '\n' || c->s[c->i] == '\r')) c->i++;
}

static int put_utf8(tok_buf *b, uint32_t cp) {
  char u[4];
  int n;
  if (cp < 0x80) { u[0] = (char)cp; n = 1; }
  else if (cp < 0x800) { u[0] = (char)(0xC0 | (cp >> 6)); u[1] = (char)(0x80 | (cp & 0x3F)); n = 2; }
  else if (cp < 0x10000) { u[0] = (char)(0xE0 | (cp >> 12)); u[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[2] = (char)(0x80 | (cp & 0x3F)); n = 3; }
  else { u[0] = (char)(0xF0 | (cp >> 18)); u[1] = (char)(0x80 | ((cp >> 12) & 0x3F)); u[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); u[3] = (char)(0x80 | (cp & 0x3F)); n = 4; }
  return tok_buf_append(b, u, (size_t)n);
}

static int hex4(const char *s, uint32_t *v) {
  *v = 0;
  for (int k = 0; k < 4; k++) {
    char h = s[k];
    int d = h >= '0' && h <= '9' ? h - '0' : h >= 'a' && h <= 'f' ? h - 'a' + 10 : h >= 'A' && h <= 'F' ? h - 'A' + 10 : -1;
    if (d < 0) return -1;
    *v = *v * 16 + (uint32_t)d;
  }
  return 0;
}

/* Reads a JSON string at c->i into raw UTF-8 (unescaped). 0, or -1 on malformed input. */
static int jstring(jcur *c, tok_buf *raw) {
  if (c->i >= c->n || c->s[c->i] != '"') return -1;
  c->i++;
  while (c->i < c->n) {
    unsigned char ch = (unsigned char)c->s[c->i];
    if (ch == '"') { c->i++; return raw && !raw->p ? tok_buf_append(raw, "", 0) : 0; }
    if (ch < 0x20) return -1;
    if (ch != '\\') {
      size_t st = c->i;
      while (c->i < c->n && c->s[c->i] != '"' && c->s[c->i] != '\\' && (unsigned char)c->s[c->i] >= 0x20) c->i++;
      if (raw && tok_buf_append(raw, c->s + st, c->i - st)) return FLOE_E_NOMEM;
      continue;
    }
    if (++c->i >= c->n) return -1;
    char e = c->s[c->i++];
    const char *rep = NULL;
    switch (e) {
      case '"': rep = "\""; break;
      case '\\': rep = "\\"; break;
      case '/': rep = "/"; break;
      case 'b': rep = "\b"; break;
      case 'f': rep = "\f"; break;
      case 'n': rep = "\n"; break;
      case 'r': rep = "\r"; break;
      case 't': rep = "\t"; break;
      case 'u': {
        uint32_t v, lo;
        if (c->i + 4 > c->n || hex4(c->s + c->i, &v)) return -1;
        c->i += 4;
        if (v >= 0xD800 && v <= 0xDBFF && c->i + 6 <= c->n && c->s[c->i] == '\\' && c->s[c->i + 1] == 'u' &&
            !hex4(c->s + c->i + 2, &lo) && lo >= 0xDC00 && lo <= 0xDFFF) {
          c->i += 6;
          v = 0x10000 + ((v - 0xD800) << 10) + (lo - 0xDC00);
        } else if (v >= 0xD800 && v <= 0xDFFF) {
          v = 0xFFFD; /* a lone surrogate cannot be written as UTF-8 */
        }
        if (raw && put_utf8(raw, v)) return FLOE_E_NOMEM;
        continue;
      }
      default: return -1;
    }
    if (raw && tok_buf_append(raw, rep, 1)) return FLOE_E_NOMEM;
  }
  return -1;
}

/* json.dumps of a str (ensure_ascii=False). */
static int py_dump_str(tok_buf *out, const char *s, size_t n) {
  APPEND(out, "\"", 1);
  size_t st = 0;
  for (size_t i = 0; i < n; i++) {
    unsigned char ch = (unsigned char)s[i];
    const char *rep = NULL;
    char u[8];
    if (ch == '"') rep = "\\\"";
    else if (ch == '\\') rep = "\\\\";
    else if (ch == '\n') rep = "\\n";
    else if (ch == '\r') rep = "\\r";
    else if (ch == '\t') rep = "\\t";
    else if (ch == '\b') rep = "\\b";
    else if (ch == '\f') rep = "\\f";
    else if (ch < 0x20) { snprintf(u, sizeof u, "\\u%04x", ch); rep = u; }
    if (!rep) continue;
    APPEND(out, s + st, i - st);
    APPS(out, rep);
    st = i + 1;
  }
  APPEND(out, s + st, n - st);
  APPEND(out, "\"", 1);
  return 0;
}

/* Python repr(float). */
static void py_float_repr(double v, char *buf, size_t bn, bool json) {
  if (isnan(v)) { snprintf(buf, bn, "%s", json ? "NaN" : "nan"); return; }
  if (isinf(v)) { snprintf(buf, bn, "%s%s", v < 0 ? "-" : "", json ? "Infinity" : "inf"); return; }
  if (v == 0) { snprintf(buf, bn, "%s", signbit(v) ? "-0.0" : "0.0"); return; }
  char tmp[40];
  for (int p = 1; p <= 17; p++) {
    snprintf(tmp, sizeof tmp, "%.*e", p - 1, v);
    if (strtod(tmp, NULL) == v) break;
  }
  /* tmp: [-]d[.ddd]e[+-]xx */
  char digits[24];
  int nd = 0, e;
  const char *p = tmp;
  bool neg = *p == '-';
  if (neg) p++;
  for (; *p && *p != 'e'; p++)
    if (*p != '.') digits[nd++] = *p;
  e = atoi(p + 1);
  while (nd > 1 && digits[nd - 1] == '0') nd--;
  char *o = buf;
  size_t left = bn;
#define PUT(...) do { int w_ = snprintf(o, left, __VA_ARGS__); if (w_ < 0 || (size_t)w_ >= left) return; o += w_; left -= (size_t)w_; } while (0)
  if (neg) PUT("-");
  if (e >= -4 && e < 16) {
    if (e >= 0) {
      for (int k = 0; k <= e; k++) PUT("%c", k < nd ? digits[k] : '0');
      PUT(".");
      if (nd > e + 1) for (int k = e + 1; k < nd; k++) PUT("%c", digits[k]);
      else PUT("0");
    } else {
      PUT("0.");
      for (int k = 0; k < -e - 1; k++) PUT("0");
      for (int k = 0; k < nd; k++) PUT("%c", digits[k]);
    }
  } else {
    PUT("%c", digits[0]);
    if (nd > 1) {
      PUT(".");
      for (int k = 1; k < nd; k++) PUT("%c", digits[k]);
    }
    PUT("e%c%02d", e < 0 ? '-' : '+', e < 0 ? -e : e);
  }
#undef PUT
}

/* Reads a JSON number; writes Python's rendering (json: json.dumps, else str()). */
static int jnumber(jcur *c, tok_buf *out, bool json) {
  size_t st = c->i;
  bool isfloat = false;
  if (c->i < c->n && c->s[c->i] == '-') c->i++;
  if (c->i >= c->n || c->s[c->i] < '0' || c->s[c->i] > '9') return -1;
  if (c->s[c->i] == '0') c->i++;
  else while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
  if (c->i < c->n && c->s[c->i] == '.') {
    isfloat = true;
    c->i++;
    size_t d = c->i;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
    if (c->i == d) return -1;
  }
  if (c->i < c->n && (c->s[c->i] == 'e' || c->s[c->i] == 'E')) {
    isfloat = true;
    c->i++;
    if (c->i < c->n && (c->s[c->i] == '+' || c->s[c->i] == '-')) c->i++;
    size_t d = c->i;
    while (c->i < c->n && c->s[c->i] >= '0' && c->s[c->i] <= '9') c->i++;
    if (c->i == d) return -1;
  }
  if (!out) return 0;
  size_t len = c->i - st;
  if (!isfloat) {
    if (len == 2 && c->s[st] == '-' && c->s[st + 1] == '0') return tok_buf_append(out, "0", 1);
    return tok_buf_append(out, c->s + st, len);
  }
  char tmp[400], r[64];
  if (len >= sizeof tmp) len = sizeof tmp - 1;
  memcpy(tmp, c->s + st, len);
  tmp[len] = 0;
  py_float_repr(strtod(tmp, NULL), r, sizeof r, json);
  return tok_buf_append(out, r, strlen(r));
}

static bool jlit(jcur *c, const char *lit) {
  size_t l = strlen(lit);
  if (c->i + l <= c->n && memcmp(c->s + c->i, lit, l) == 0) { c->i += l; return true; }
  return false;
}

/* Reads one value; when out is non-NULL writes json.dumps(value). 0, -1 malformed, or NOMEM. */
static int jdump(jcur *c, tok_buf *out) {
  jws(c);
  if (c->i >= c->n) return -1;
  if (++c->depth > 200) return -1;
  char ch = c->s[c->i];
  int rc = 0;
  if (ch == '{' || ch == '[') {
    bool obj = ch == '{';
    c->i++;
    if (out) APPEND(out, obj ? "{" : "[", 1);
    jws(c);
    if (c->i < c->n && c->s[c->i] == (obj ? '}' : ']')) {
      c->i++;
    } else {
      for (bool first = true;; first = false) {
        if (out && !first) APPEND(out, ", ", 2);
        if (obj) {
          jws(c);
          tok_buf k = {0};
          rc = jstring(c, out ? &k : NULL);
          if (!rc && out) rc = py_dump_str(out, k.p ? k.p : "", k.n);
          tok_buf_free(&k);
          if (rc) return rc;
          jws(c);
          if (c->i >= c->n || c->s[c->i] != ':') return -1;
          c->i++;
          if (out) APPEND(out, ": ", 2);
        }
        if ((rc = jdump(c, out))) return rc;
        jws(c);
        if (c->i < c->n && c->s[c->i] == ',') { c->i++; continue; }
        if (c->i < c->n && c->s[c->i] == (obj ? '}' : ']')) { c->i++; break; }
        return -1;
      }
    }
    if (out) APPEND(out, obj ? "}" : "]", 1);
  } else if (ch == '"') {
    tok_buf s = {0};
    rc = jstring(c, out ? &s : NULL);
    if (!rc && out) rc = py_dump_str(out, s.p ? s.p : "", s.n);
    tok_buf_free(&s);
  } else if (jlit(c, "true")) {
    if (out) APPS(out, "true");
  } else if (jlit(c, "false")) {
    if (out) APPS(out, "false");
  } else if (jlit(c, "null")) {
    if (out) APPS(out, "null");
  } else {
    rc = jnumber(c, out, true);
  }
  c->depth--;
  return rc;
}

/* The whole text must be one value. */
static int jdump_all(const char *s, size_t n, tok_buf *out) {
  jcur c = { s, n, 0, 0 };
  int rc = jdump(&c, out);
  if (rc) return rc;
  jws(&c);
  return c.i == c.n ? 0 : -1;
}

int chat_json_py_dumps(const char *json_text, size_t len, tok_buf *out, char *err, size_t errlen) {
  int rc = jdump_all(json_text, len, out);
  if (rc == FLOE_E_NOMEM) return floe_err(err, errlen, rc, "out of memory");
  if (rc) return floe_err(err, errlen, FLOE_E_INVALID, "invalid JSON");
  return 0;
}

/* Qwen3.5 parameter value: {{ v|tojson if mapping or (sequence and not string) else v|string }};
 * Qwen3.6: {{ v|string if string else v|tojson }}. */
static int param_value(jcur *c, tok_buf *out, chat_format f) {
  jws(c);
  if (c->i >= c->n) return -1;
  char ch = c->s[c->i];
  if (ch == '"') return jstring(c, out);
  if (ch == '{' || ch == '[' || f == CHAT_QWEN36) return jdump(c, out);
  if (jlit(c, "true")) return tok_buf_append(out, "True", 4);
  if (jlit(c, "false")) return tok_buf_append(out, "False", 5);
  if (jlit(c, "null")) return tok_buf_append(out, "None", 4);
  return jnumber(c, out, false);
}

/* ---------------------------------------------------------------------------------------------
 * string helpers with Python semantics */
typedef struct str { const char *p; size_t n; } str;

static str S(const char *s) { return (str){ s ? s : "", s ? strlen(s) : 0 }; }

/* Python str.isspace() for the code point starting at p (returns its byte length, 0 if not space). */
static int py_space_at(const char *p, size_t n) {
  unsigned char c = (unsigned char)p[0];
  if (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) return 1;
  if (c == 0xC2 && n >= 2 && ((unsigned char)p[1] == 0x85 || (unsigned char)p[1] == 0xA0)) return 2;
  if (n >= 3 && c == 0xE1 && (unsigned char)p[1] == 0x9A && (unsigned char)p[2] == 0x80) return 3; /* U+1680 */
  if (n >= 3 && c == 0xE2 && (unsigned char)p[1] == 0x80) {
    unsigned char d = (unsigned char)p[2];
    if (d <= 0x8A || d == 0xA8 || d == 0xA9 || d == 0xAF) return 3; /* U+2000..200A, 2028, 2029, 202F */
  }
  if (n >= 3 && c == 0xE2 && (unsigned char)p[1] == 0x81 && (unsigned char)p[2] == 0x9F) return 3; /* U+205F */
  if (n >= 3 && c == 0xE3 && (unsigned char)p[1] == 0x80 && (unsigned char)p[2] == 0x80) return 3; /* U+3000 */
  return 0;
}

/* Length of a space code point ending at p[n-1], 0 if none. */
static int py_space_before(const char *p, size_t n) {
  for (int l = 1; l <= 3 && (size_t)l <= n; l++)
    if (py_space_at(p + n - l, (size_t)l) == l) return l;
  return 0;
}

static str py_trim(str s) {
  int l;
  while (s.n && (l = py_space_at(s.p, s.n)) > 0) { s.p += l; s.n -= (size_t)l; }
  while (s.n && (l = py_space_before(s.p, s.n)) > 0) s.n -= (size_t)l;
  return s;
}

static str lstrip_nl(str s) { while (s.n && s.p[0] == '\n') { s.p++; s.n--; } return s; }
static str rstrip_nl(str s) { while (s.n && s.p[s.n - 1] == '\n') s.n--; return s; }

static const char *find_first(str s, const char *needle) { return memmem(s.p, s.n, needle, strlen(needle)); }

static const char *find_last(str s, const char *needle) {
  size_t nl = strlen(needle);
  const char *last = NULL, *p = s.p;
  while ((p = memmem(p, s.n - (size_t)(p - s.p), needle, nl))) { last = p; p++; }
  return last;
}

static bool starts(str s, const char *x) { size_t l = strlen(x); return s.n >= l && memcmp(s.p, x, l) == 0; }
static bool ends(str s, const char *x) { size_t l = strlen(x); return s.n >= l && memcmp(s.p + s.n - l, x, l) == 0; }

/* content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') and
 * content.split('</think>')[-1].lstrip('\n'). */
static void split_think(str content, str *reasoning, str *rest) {
  const char *first = find_first(content, "</think>"), *last = find_last(content, "</think>");
  str before = { content.p, (size_t)(first - content.p) };
  before = rstrip_nl(before);
  const char *open = find_last(before, "<think>");
  if (open) { size_t k = (size_t)(open - before.p) + 7; before.p += k; before.n -= k; }
  *reasoning = lstrip_nl(before);
  str after = { last + 8, content.n - (size_t)(last + 8 - content.p) };
  *rest = lstrip_nl(after);
}

static const char *role_of(const chat_msg *m) {
  return m->role && strcmp(m->role, "developer") == 0 ? "system" : (m->role ? m->role : "");
}
static bool is_role(const chat_msg *m, const char *r) { return strcmp(role_of(m), r) == 0; }

/* Iterates the elements of the tools array: out gets "\n" + tojson(tool) for each. */
static int render_tools(const char *tools_json, tok_buf *out, int *count, char *err, size_t errlen) {
  jcur c = { tools_json, strlen(tools_json), 0, 0 };
  *count = 0;
  jws(&c);
  if (c.i >= c.n || c.s[c.i] != '[') return floe_err(err, errlen, FLOE_E_INVALID, "tools must be a JSON array");
  c.i++;
  jws(&c);
  if (c.i < c.n && c.s[c.i] == ']') { c.i++; goto end; }
  for (;;) {
    if (out && tok_buf_append(out, "\n", 1)) return floe_err(err, errlen, FLOE_E_NOMEM, "out of memory");
    int rc = jdump(&c, out);
    if (rc == FLOE_E_NOMEM) return floe_err(err, errlen, rc, "out of memory");
    if (rc) return floe_err(err, errlen, FLOE_E_INVALID, "tools: invalid JSON");
    (*count)++;
    jws(&c);
    if (c.i < c.n && c.s[c.i] == ',') { c.i++; continue; }
    if (c.i < c.n && c.s[c.i] == ']') { c.i++; break; }
    return floe_err(err, errlen, FLOE_E_INVALID, "tools: invalid JSON");
  }
end:
  jws(&c);
  if (c.i != c.n) return floe_err(err, errlen, FLOE_E_INVALID, "tools: trailing characters after the array");
  return 0;
}

static int app(tok_buf *b, str s) { return tok_buf_append(b, s.p, s.n); }

/* ---------------------------------------------------------------------------------------------
 * Qwen3 (tests/fixtures/tokenizer/qwen3_chat_template.jinja) */
static int render_qwen3(const chat_msg *m, size_t n, const chat_opts *o, tok_buf *out, char *err, size_t errlen) {
  int rc, ntools = 0;
  if (o->tools_json && (rc = render_tools(o->tools_json, NULL, &ntools, err, errlen))) return rc;
  /* {%- if tools %} ... {%- else %} system {%- endif %} */
  if (ntools) {
    APPS(out, "<|im_start|>system\n");
    if (n && is_role(&m[0], "system")) { APPS(out, m[0].content ? m[0].content : ""); APPS(out, "\n\n"); }
    APPS(out, "# Tools\n\nYou may call one or more functions to assist with the user query.\n\n"
              "You are provided with function signatures within <tools></tools> XML tags:\n<tools>");
    if ((rc = render_tools(o->tools_json, out, &ntools, err, errlen))) return rc;
    APPS(out, "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
              "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
              "<args-json-object>}\n</tool_call><|im_end|>\n");
  } else if (n && is_role(&m[0], "system")) {
    APPS(out, "<|im_start|>system\n");
    APPS(out, m[0].content ? m[0].content : "");
    APPS(out, "<|im_end|>\n");
  }
  /* last_query_index: the last user message that is not only a <tool_response> */
  size_t lqi = n ? n - 1 : 0;
  for (size_t k = n; k-- > 0;) {
    str c = S(m[k].content);
    if (is_role(&m[k], "user") && !(starts(c, "<tool_response>") && ends(c, "</tool_response>"))) { lqi = k; break; }
  }
  for (size_t i = 0; i < n; i++) {
    const char *role = role_of(&m[i]);
    str content = S(m[i].content);
    if (strcmp(role, "user") == 0 || (strcmp(role, "system") == 0 && i != 0)) {
      APPS(out, "<|im_start|>");
      APPS(out, role);
      APPS(out, "\n");
      if (app(out, content)) return FLOE_E_NOMEM;
      APPS(out, "<|im_end|>\n");
    } else if (strcmp(role, "assistant") == 0) {
      str reasoning = S("");
      if (m[i].reasoning) reasoning = S(m[i].reasoning);
      else if (find_first(content, "</think>")) split_think(content, &reasoning, &content);
      /* {%- if loop.index0 > ns.last_query_index %}{%- if loop.last or reasoning_content %} */
      if (i > lqi && (i == n - 1 || reasoning.n)) {
        APPS(out, "<|im_start|>assistant\n<think>\n");
        str r = lstrip_nl(rstrip_nl(reasoning));
        if (app(out, r)) return FLOE_E_NOMEM;
        APPS(out, "\n</think>\n\n");
        if (app(out, lstrip_nl(content))) return FLOE_E_NOMEM;
      } else {
        APPS(out, "<|im_start|>assistant\n");
        if (app(out, content)) return FLOE_E_NOMEM;
      }
      for (size_t j = 0; j < m[i].n_tool_calls; j++) {
        const chat_tool_call *tc = &m[i].tool_calls[j];
        if (j > 0 || content.n) APPS(out, "\n");
        APPS(out, "<tool_call>\n{\"name\": \"");
        APPS(out, tc->name ? tc->name : "");
        APPS(out, "\", \"arguments\": ");
        const char *a = tc->arguments ? tc->arguments : "{}";
        if (o->raw_tool_args) {
          APPS(out, a);
        } else {
          rc = jdump_all(a, strlen(a), out);
          if (rc == FLOE_E_NOMEM) return floe_err(err, errlen, rc, "out of memory");
          if (rc) return floe_err(err, errlen, FLOE_E_INVALID, "tool call '%s': arguments are not valid JSON", tc->name ? tc->name : "");
        }
        APPS(out, "}\n</tool_call>");
      }
      APPS(out, "<|im_end|>\n");
    } else if (strcmp(role, "tool") == 0) {
      if (i == 0 || !is_role(&m[i - 1], "tool")) APPS(out, "<|im_start|>user");
      APPS(out, "\n<tool_response>\n");
      if (app(out, content)) return FLOE_E_NOMEM;
      APPS(out, "\n</tool_response>");
      if (i == n - 1 || !is_role(&m[i + 1], "tool")) APPS(out, "<|im_end|>\n");
    }
    /* any other role renders nothing (the template has no branch for it) */
  }
  if (o->add_generation_prompt) {
    APPS(out, "<|im_start|>assistant\n");
    if (o->enable_thinking == 0) APPS(out, "<think>\n\n</think>\n\n");
  }
  return 0;
}

/* ---------------------------------------------------------------------------------------------
 * Qwen3.5 / Qwen3.6 (qwen35_chat_template.jinja, qwen36_chat_template.jinja) */
static const char QWEN35_TOOLS_HEAD[] = "# Tools\n\nYou have access to the following functions:\n\n<tools>";
static const char QWEN35_TOOLS_TAIL[] =
    "\n</tools>\n\nIf you choose to call a function ONLY reply in the following format with NO suffix:\n\n"
    "<tool_call>\n<function=example_function_name>\n<parameter=example_parameter_1>\nvalue_1\n</parameter>\n"
    "<parameter=example_parameter_2>\nThis is the value for the second parameter\nthat can span\nmultiple lines\n"
    "</parameter>\n</function>\n</tool_call>\n\n<IMPORTANT>\nReminder:\n- Function calls MUST follow the specified "
    "format: an inner <function=...></function> block must be nested within <tool_call></tool_call> XML tags\n"
    "- Required parameters MUST be specified\n- You may provide optional reasoning for your function call in "
    "natural language BEFORE the function call, but NOT after\n- If there is no function call available, answer the "
    "question like normal with your current knowledge and do not tell the user about function calls\n</IMPORTANT>";

static int render_params(const chat_tool_call *tc, chat_format f, tok_buf *out, char *err, size_t errlen) {
  const char *a = tc->arguments ? tc->arguments : "{}";
  jcur c = { a, strlen(a), 0, 0 };
  int rc;
  jws(&c);
  if (c.i >= c.n || c.s[c.i] != '{')
    return floe_err(err, errlen, FLOE_E_INVALID, "tool call '%s': arguments must be a JSON object", tc->name ? tc->name : "");
  c.i++;
  jws(&c);
  if (c.i < c.n && c.s[c.i] == '}') { c.i++; goto end; }
  for (;;) {
    jws(&c);
    APPS(out, "<parameter=");
    if ((rc = jstring(&c, out))) goto bad;
    APPS(out, ">\n");
    jws(&c);
    if (c.i >= c.n || c.s[c.i] != ':') goto bad;
    c.i++;
    if ((rc = param_value(&c, out, f))) goto bad;
    APPS(out, "\n</parameter>\n");
    jws(&c);
    if (c.i < c.n && c.s[c.i] == ',') { c.i++; continue; }
    if (c.i < c.n && c.s[c.i] == '}') { c.i++; break; }
    goto bad;
  }
end:
  jws(&c);
  if (c.i == c.n) return 0;
bad:
  return floe_err(err, errlen, FLOE_E_INVALID, "tool call '%s': arguments are not valid JSON", tc->name ? tc->name : "");
}

static int render_qwen35(chat_format f, const chat_msg *m, size_t n, const chat_opts *o, tok_buf *out, char *err,
                         size_t errlen) {
  int rc, ntools = 0;
  if (n == 0) return floe_err(err, errlen, FLOE_E_INVALID, "No messages provided.");
  if (o->tools_json && (rc = render_tools(o->tools_json, NULL, &ntools, err, errlen))) return rc;
  if (ntools) {
    APPS(out, "<|im_start|>system\n");
    APPS(out, QWEN35_TOOLS_HEAD);
    if ((rc = render_tools(o->tools_json, out, &ntools, err, errlen))) return rc;
    APPS(out, QWEN35_TOOLS_TAIL);
    if (is_role(&m[0], "system")) {
      str c = py_trim(S(m[0].content));
      if (c.n) {
        APPS(out, "\n\n");
        if (app(out, c)) return FLOE_E_NOMEM;
      }
    }
    APPS(out, "<|im_end|>\n");
  } else if (is_role(&m[0], "system")) {
    APPS(out, "<|im_start|>system\n");
    if (app(out, py_trim(S(m[0].content)))) return FLOE_E_NOMEM;
    APPS(out, "<|im_end|>\n");
  }
  size_t lqi = n - 1;
  bool multi_step = true;
  for (size_t k = n; k-- > 0;) {
    if (!is_role(&m[k], "user")) continue;
    str c = py_trim(S(m[k].content));
    if (!(starts(c, "<tool_response>") && ends(c, "</tool_response>"))) { lqi = k; multi_step = false; break; }
  }
  if (multi_step) return floe_err(err, errlen, FLOE_E_INVALID, "No user query found in messages.");
  for (size_t i = 0; i < n; i++) {
    const char *role = role_of(&m[i]);
    str content = py_trim(S(m[i].content));
    if (strcmp(role, "system") == 0) {
      if (i != 0) return floe_err(err, errlen, FLOE_E_INVALID, "System message must be at the beginning.");
    } else if (strcmp(role, "user") == 0) {
      APPS(out, "<|im_start|>user\n");
      if (app(out, content)) return FLOE_E_NOMEM;
      APPS(out, "<|im_end|>\n");
    } else if (strcmp(role, "assistant") == 0) {
      str reasoning = S("");
      if (m[i].reasoning) reasoning = S(m[i].reasoning);
      else if (find_first(content, "</think>")) split_think(content, &reasoning, &content);
      reasoning = py_trim(reasoning);
      if ((f == CHAT_QWEN36 && o->preserve_thinking) || i > lqi) {
        APPS(out, "<|im_start|>assistant\n<think>\n");
        if (app(out, reasoning)) return FLOE_E_NOMEM;
        APPS(out, "\n</think>\n\n");
        if (app(out, content)) return FLOE_E_NOMEM;
      } else {
        APPS(out, "<|im_start|>assistant\n");
        if (app(out, content)) return FLOE_E_NOMEM;
      }
      for (size_t j = 0; j < m[i].n_tool_calls; j++) {
        const chat_tool_call *tc = &m[i].tool_calls[j];
        if (j == 0) APPS(out, py_trim(content).n ? "\n\n<tool_call>\n<function=" : "<tool_call>\n<function=");
        else APPS(out, "\n<tool_call>\n<function=");
        APPS(out, tc->name ? tc->name : "");
        APPS(out, ">\n");
        if ((rc = render_params(tc, f, out, err, errlen))) return rc;
        APPS(out, "</function>\n</tool_call>");
      }
      APPS(out, "<|im_end|>\n");
    } else if (strcmp(role, "tool") == 0) {
      /* {%- if loop.previtem and loop.previtem.role != "tool" %}: a leading tool message gets no header */
      if (i > 0 && !is_role(&m[i - 1], "tool")) APPS(out, "<|im_start|>user");
      APPS(out, "\n<tool_response>\n");
      if (app(out, content)) return FLOE_E_NOMEM;
      APPS(out, "\n</tool_response>");
      if (i == n - 1 || !is_role(&m[i + 1], "tool")) APPS(out, "<|im_end|>\n");
    } else {
      return floe_err(err, errlen, FLOE_E_INVALID, "Unexpected message role.");
    }
  }
  if (o->add_generation_prompt) {
    APPS(out, "<|im_start|>assistant\n");
    APPS(out, o->enable_thinking == 0 ? "<think>\n\n</think>\n\n" : "<think>\n");
  }
  return 0;
}

int chat_render(chat_format f, const chat_msg *msgs, size_t n, const chat_opts *o, tok_buf *out, char *err,
                size_t errlen) {
  chat_opts def = { NULL, false, -1, false, false };
  if (!o) o = &def;
  size_t start = out->n;
  int rc;
  if (f == CHAT_QWEN3) rc = render_qwen3(msgs, n, o, out, err, errlen);
  else if (f == CHAT_QWEN35 || f == CHAT_QWEN36) rc = render_qwen35(f, msgs, n, o, out, err, errlen);
  else rc = floe_err(err, errlen, FLOE_E_INVALID, "unknown chat format %d", (int)f);
  if (rc == FLOE_E_NOMEM) floe_err(err, errlen, rc, "chat template: out of memory");
  if (rc) {
    out->n = start; /* leave the buffer as it was */
    if (out->p) out->p[start] = 0;
  } else if (!out->p && tok_buf_append(out, "", 0)) {
    return floe_err(err, errlen, FLOE_E_NOMEM, "chat template: out of memory");
  }
  return rc;
}

int chat_format_detect(const char *t, chat_format *f) {
  if (!t) return FLOE_E_UNSUPPORTED;
  if (strstr(t, "<function=") && strstr(t, "<|im_start|>")) {
    *f = strstr(t, "preserve_thinking") ? CHAT_QWEN36 : CHAT_QWEN35;
    return 0;
  }
  if (strstr(t, "You may call one or more functions to assist with the user query.") && strstr(t, "<|im_start|>")) {
    *f = CHAT_QWEN3;
    return 0;
  }
  return FLOE_E_UNSUPPORTED;
}
