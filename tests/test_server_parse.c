/* The server's output parser (src/server/output_parse.c): <think> splitting and Qwen3 JSON /
 * Qwen3.5 XML tool calls, fed whole, byte by byte and cut at every position (tags spanning
 * pieces), incremental (streaming) and whole-call modes; schema typing of XML arguments;
 * malformed calls as content. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server/output_parse.h"
#include "test.h"

typedef struct res {
  sbuf content, reasoning;
  sbuf name[4], args[4];
  int n_calls;
} res;

static void s_content(void *u, const char *s, size_t n) { sb_add(&((res *)u)->content, s, n); }
static void s_reasoning(void *u, const char *s, size_t n) { sb_add(&((res *)u)->reasoning, s, n); }
static void s_start(void *u, int i, const char *id, const char *name) {
  res *r = u;
  (void)id;
  if (i == r->n_calls && i < 4) {
    sb_str(&r->name[i], name);
    r->n_calls++;
  }
}
static void s_args(void *u, int i, const char *s, size_t n) {
  res *r = u;
  if (i >= 0 && i < r->n_calls) sb_add(&r->args[i], s, n);
}

static void res_free(res *r) {
  sb_free(&r->content);
  sb_free(&r->reasoning);
  for (int i = 0; i < 4; i++) {
    sb_free(&r->name[i]);
    sb_free(&r->args[i]);
  }
}

static const char *str(const sbuf *b) { return b->p ? b->p : ""; }

/* Runs the parser over text cut at `cut` (0: whole; SIZE_MAX: byte by byte). */
static void run(const char *text, size_t cut, bool incremental, bool think_open, const cJSON *tools, res *r) {
  memset(r, 0, sizeof *r);
  outp p;
  outp_sink sink = {r, s_content, s_reasoning, s_start, s_args};
  outp_init(&p, true, incremental, think_open, tools, sink);
  size_t n = strlen(text);
  if (cut == (size_t)-1)
    for (size_t i = 0; i < n; i++) outp_feed(&p, text + i, 1);
  else if (cut && cut < n) {
    outp_feed(&p, text, cut);
    outp_feed(&p, text + cut, n - cut);
  } else outp_feed(&p, text, n);
  outp_finish(&p);
  outp_free(&p);
}

/* Same result for every way of cutting the text, in both modes. */
static void check_all(const char *label, const char *text, bool think_open, const cJSON *tools, const char *want_reason,
                      const char *want_content, int want_calls, const char *name0, const char *args0) {
  size_t n = strlen(text);
  int bad = 0;
  char first[512] = "";
  for (int inc = 0; inc < 2; inc++)
    for (size_t cut = 0; cut <= n + 1; cut++) {
      res r;
      run(text, cut == n + 1 ? (size_t)-1 : cut, inc, think_open, tools, &r);
      bool ok = !strcmp(str(&r.reasoning), want_reason) && !strcmp(str(&r.content), want_content) &&
                r.n_calls == want_calls && (!want_calls || (!strcmp(str(&r.name[0]), name0) && !strcmp(str(&r.args[0]), args0)));
      if (!ok && !bad++)
        snprintf(first, sizeof first, "inc=%d cut=%zu: reasoning [%s] content [%s] calls %d name [%s] args [%s]", inc, cut,
                 str(&r.reasoning), str(&r.content), r.n_calls, str(&r.name[0]), str(&r.args[0]));
      res_free(&r);
    }
  if (bad) printf("  %s\n", first);
  CHECK(bad == 0, "%s (%zu cuts x 2 modes)", label, n + 2);
}

int main(void) {
  cJSON *tools = cJSON_Parse(
      "[{\"type\":\"function\",\"function\":{\"name\":\"f\",\"parameters\":{\"type\":\"object\",\"properties\":{"
      "\"s\":{\"type\":\"string\"},\"i\":{\"type\":\"integer\"},\"x\":{\"type\":\"number\"},\"b\":{\"type\":\"boolean\"},"
      "\"o\":{\"type\":\"object\"},\"a\":{\"type\":\"array\"},\"n\":{\"type\":[\"integer\",\"null\"]}}}}}]");

  SECTION("reasoning");
  {
    check_all("think block then content", "<think>\nLet me see.\n</think>\n\nHello there.", false, NULL, "Let me see.",
              "Hello there.", 0, "", "");
    check_all("prompt-opened think block", "Plan: a, b.\n</think>\n\nDone.", true, NULL, "Plan: a, b.", "Done.", 0, "", "");
    check_all("no think block", "Just text <thin and more.", false, NULL, "", "Just text <thin and more.", 0, "", "");
    check_all("<think> after content is content", "A <think>B</think> C", false, NULL, "", "A <think>B</think> C", 0, "", "");
    check_all("leading whitespace before <think>", "\n\n<think>\nr\n</think>\n\nc", false, NULL, "r", "c", 0, "", "");
    check_all("unterminated think", "<think>\nthinking forever", false, NULL, "thinking forever", "", 0, "", "");
    check_all("trailing whitespace kept without calls", "Hello \n", false, NULL, "", "Hello \n", 0, "", "");
  }

  SECTION("Qwen3 JSON tool calls");
  {
    check_all("json call", "<think>\nr\n</think>\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {\"s\": \"x}\\\"{\", \"i\": [1, {\"k\": 2}]}}\n</tool_call>",
              false, tools, "r", "", 1, "f", "{\"s\": \"x}\\\"{\", \"i\": [1, {\"k\": 2}]}");
    res r;
    run("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"i\": 1}}\n</tool_call>\n<tool_call>\n{\"name\": \"g\", \"arguments\": {}}\n</tool_call>",
        0, false, false, tools, &r);
    CHECK(r.n_calls == 2 && !strcmp(str(&r.name[1]), "g") && !strcmp(str(&r.args[1]), "{}") && r.content.n == 0,
          "two calls, whitespace between them dropped");
    res_free(&r);
    check_all("malformed json -> content", "<tool_call>\n{name: f}\n</tool_call>", false, tools, "",
              "<tool_call>\n{name: f}\n</tool_call>", 0, "", "");
    check_all("text before a call", "Checking.\n\n<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>", false, tools,
              "", "Checking.", 1, "f", "{}");
    run("<tool_call>\n{\"name\": \"f\", \"arguments\": {\"i\": 1}}", 0, false, false, tools, &r);
    CHECK(r.n_calls == 0 && strstr(str(&r.content), "<tool_call>"), "unterminated call (whole mode) -> content");
    res_free(&r);
    run("<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"i\\\": 1}\"}\n</tool_call>", 0, false, false, tools, &r);
    CHECK(r.n_calls == 1 && !strcmp(str(&r.args[0]), "{\"i\":1}"), "arguments given as a JSON string");
    res_free(&r);
  }

  SECTION("Qwen3.5 XML tool calls");
  {
    check_all("xml call, typed by schema",
              "<tool_call>\n<function=f>\n<parameter=s>\n42\n</parameter>\n<parameter=i>\n7\n</parameter>\n"
              "<parameter=x>\n2.5\n</parameter>\n<parameter=b>\nTrue\n</parameter>\n<parameter=o>\n{\"k\": [1, 2]}\n</parameter>\n"
              "<parameter=a>\n[1, \"two\"]\n</parameter>\n<parameter=n>\nnull\n</parameter>\n<parameter=z>\nfree text\nline 2\n</parameter>\n"
              "</function>\n</tool_call>",
              false, tools, "", "", 1, "f",
              "{\"s\": \"42\", \"i\": 7, \"x\": 2.5, \"b\": true, \"o\": {\"k\":[1,2]}, \"a\": [1,\"two\"], \"n\": null, \"z\": \"free text\\nline 2\"}");
    check_all("xml: unparsable typed values stay strings",
              "<tool_call>\n<function=f>\n<parameter=i>\nseven\n</parameter>\n<parameter=o>\n{bad\n</parameter>\n</function>\n</tool_call>",
              false, tools, "", "", 1, "f", "{\"i\": \"seven\", \"o\": \"{bad\"}");
    check_all("xml: no parameters", "<tool_call>\n<function=g>\n</function>\n</tool_call>", false, tools, "", "", 1, "g", "{}");
    check_all("xml: malformed function tag -> content", "<tool_call>\n<function f>\n</tool_call>", false, tools, "",
              "<tool_call>\n<function f>\n</tool_call>", 0, "", "");
    check_all("reasoning then xml call",
              "thinking\n</think>\n\n<tool_call>\n<function=f>\n<parameter=s>\nv\n</parameter>\n</function>\n</tool_call>", true, tools,
              "thinking", "", 1, "f", "{\"s\": \"v\"}");
  }
  SECTION("typing helper");
  {
    sbuf b = {0};
    outp_typed_value(tools, "f", "x", "1e400", 5, &b);
    CHECK(b.p && !strcmp(b.p, "\"1e400\""), "out-of-range number stays a string (%s)", b.p ? b.p : "");
    sb_free(&b);
    outp_typed_value(NULL, "f", "i", "3", 1, &b);
    CHECK(b.p && !strcmp(b.p, "\"3\""), "no schema: string");
    sb_free(&b);
    /* a NUL inside a value (a token can hold one; fuzz_output_parse found the overread): the
     * whole value, as a string, never typed from its part before the NUL */
    outp_typed_value(tools, "f", "i", "12\0ab", 5, &b);
    CHECK(b.p && !strcmp(b.p, "\"12\\u0000ab\""), "integer with a NUL: the whole value as a string (%s)", b.p ? b.p : "");
    sb_free(&b);
    outp_typed_value(tools, "f", "n", "null\0", 5, &b);
    CHECK(b.p && !strcmp(b.p, "\"null\\u0000\""), "null with a NUL after it: a string (%s)", b.p ? b.p : "");
    sb_free(&b);
  }
  cJSON_Delete(tools);
  return TEST_DONE();
}
