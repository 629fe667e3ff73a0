/* Chat template renderer: unit tests (run with no arguments, by ctest) and a renderer used by
 * tests/test_chat.sh: `test_chat_render CONVERSATIONS.json INDEX` prints the rendering of one
 * conversation (see tests/fixtures/tokenizer/chat_conversations.json for the format). */
#include <cjson/cJSON.h>

#include "base/base.h"
#include "test.h"
#include "tok/chat.h"

static const char *jstr(const cJSON *o, const char *k) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
  return cJSON_IsString(v) ? v->valuestring : NULL;
}

/* Renders conversation `idx` of the file to stdout. */
static int render_one(const char *path, int idx) {
  size_t n;
  char *buf = test_read_all(path, &n);
  if (!buf) { fprintf(stderr, "cannot read %s\n", path); return 2; }
  cJSON *root = cJSON_ParseWithLength(buf, n);
  cJSON *conv = cJSON_GetArrayItem(root, idx);
  if (!conv) { fprintf(stderr, "no conversation %d\n", idx); return 2; }
  const char *fmt = jstr(conv, "format");
  chat_format f = strcmp(fmt, "qwen3") == 0 ? CHAT_QWEN3 : strcmp(fmt, "qwen35") == 0 ? CHAT_QWEN35 : CHAT_QWEN36;
  const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(conv, "messages");
  int nm = cJSON_GetArraySize(msgs);
  chat_msg *m = calloc((size_t)nm + 1, sizeof *m);
  int k = 0;
  for (const cJSON *e = msgs->child; e; e = e->next, k++) {
    m[k].role = jstr(e, "role");
    m[k].content = jstr(e, "content");
    m[k].reasoning = jstr(e, "reasoning_content");
    m[k].tool_call_id = jstr(e, "tool_call_id");
    const cJSON *tcs = cJSON_GetObjectItemCaseSensitive(e, "tool_calls");
    int nt = cJSON_GetArraySize(tcs);
    if (nt) {
      chat_tool_call *tc = calloc((size_t)nt, sizeof *tc);
      int j = 0;
      for (const cJSON *t = tcs->child; t; t = t->next, j++) {
        const cJSON *fn = cJSON_GetObjectItemCaseSensitive(t, "function");
        tc[j].id = jstr(t, "id");
        tc[j].name = jstr(fn, "name");
        const cJSON *a = cJSON_GetObjectItemCaseSensitive(fn, "arguments");
        tc[j].arguments = cJSON_IsString(a) ? a->valuestring : cJSON_PrintUnformatted(a);
      }
      m[k].tool_calls = tc;
      m[k].n_tool_calls = (size_t)nt;
    }
  }
  chat_opts o = { NULL, false, -1, false, false };
  const cJSON *tools = cJSON_GetObjectItemCaseSensitive(conv, "tools");
  if (tools) o.tools_json = cJSON_PrintUnformatted(tools);
  o.add_generation_prompt = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(conv, "add_generation_prompt"));
  const cJSON *et = cJSON_GetObjectItemCaseSensitive(conv, "enable_thinking");
  if (et) o.enable_thinking = cJSON_IsTrue(et) ? 1 : 0;
  o.preserve_thinking = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(conv, "preserve_thinking"));
  o.raw_tool_args = cJSON_IsTrue(cJSON_GetObjectItemCaseSensitive(conv, "raw_tool_args"));
  tok_buf out = {0};
  char err[256];
  int rc = chat_render(f, m, (size_t)nm, &o, &out, err, sizeof err);
  if (rc) { fprintf(stderr, "render failed: %s\n", err); return 1; }
  fwrite(out.p, 1, out.n, stdout);
  return 0; /* process exit frees the rest */
}

static void expect(chat_format f, const chat_msg *m, size_t n, const chat_opts *o, const char *want, const char *what) {
  tok_buf b = {0};
  char err[256] = "";
  int rc = chat_render(f, m, n, o, &b, err, sizeof err);
  CHECK(rc == 0 && b.p && strcmp(b.p, want) == 0, "%s\n--- got (%s):\n%s\n--- want:\n%s", what, rc ? err : "ok", b.p ? b.p : "", want);
  tok_buf_free(&b);
}

static void expect_err(chat_format f, const chat_msg *m, size_t n, const chat_opts *o, const char *msg, const char *what) {
  tok_buf b = {0};
  char err[256] = "";
  int rc = chat_render(f, m, n, o, &b, err, sizeof err);
  CHECK(rc == FLOE_E_INVALID && strstr(err, msg), "%s: %s", what, err);
  tok_buf_free(&b);
}

static void dumps(const char *in, const char *want) {
  tok_buf b = {0};
  char err[128];
  int rc = chat_json_py_dumps(in, strlen(in), &b, err, sizeof err);
  CHECK(rc == 0 && b.p && strcmp(b.p, want) == 0, "json.dumps(%s) = %s (want %s)", in, b.p ? b.p : err, want);
  tok_buf_free(&b);
}

int main(int argc, char **argv) {
  if (argc == 3) return render_one(argv[1], atoi(argv[2]));

  SECTION("Python json.dumps semantics");
  dumps("{\"a\":1,\"b\":[true,false,null],\"c\":\"x\\ny\\u00e9\\ud83e\\udd99\\u0001\\\"\"}",
        "{\"a\": 1, \"b\": [true, false, null], \"c\": \"x\\ny\xc3\xa9\xf0\x9f\xa6\x99\\u0001\\\"\"}");
  dumps("[2.0, 1.5, 1e16, 1.5e-5, 0.0001, 123456789012345678.0, -0, -0.0, 1E2, 0.1]",
        "[2.0, 1.5, 1e+16, 1.5e-05, 0.0001, 1.2345678901234568e+17, 0, -0.0, 100.0, 0.1]");
  dumps("  {}  ", "{}");
  dumps("\"a/b\"", "\"a/b\"");
  {
    tok_buf b = {0};
    char err[128];
    CHECK(chat_json_py_dumps("{\"a\":}", 6, &b, err, sizeof err) == FLOE_E_INVALID, "invalid JSON rejected");
    CHECK(chat_json_py_dumps("[1] x", 5, &b, err, sizeof err) == FLOE_E_INVALID, "trailing garbage rejected");
    tok_buf_free(&b);
  }

  SECTION("Qwen3.5 vs Qwen3.6 parameter values (Python str() vs tojson)");
  {
    chat_tool_call tc = { "c1", "f", "{\"b\":true,\"n\":null,\"x\":2.0,\"i\":3,\"s\":\"t x\",\"o\":{\"k\":[1,2]}}" };
    chat_msg m[] = { { "user", "go", NULL, NULL, 0, NULL }, { "assistant", "", NULL, &tc, 1, NULL } };
    chat_opts o = { NULL, false, -1, false, false };
    expect(CHAT_QWEN35, m, 2, &o,
           "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=f>\n"
           "<parameter=b>\nTrue\n</parameter>\n<parameter=n>\nNone\n</parameter>\n<parameter=x>\n2.0\n</parameter>\n"
           "<parameter=i>\n3\n</parameter>\n<parameter=s>\nt x\n</parameter>\n<parameter=o>\n{\"k\": [1, 2]}\n</parameter>\n"
           "</function>\n</tool_call><|im_end|>\n",
           "qwen35: bool/None/float via str()");
    expect(CHAT_QWEN36, m, 2, &o,
           "<|im_start|>user\ngo<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n<tool_call>\n<function=f>\n"
           "<parameter=b>\ntrue\n</parameter>\n<parameter=n>\nnull\n</parameter>\n<parameter=x>\n2.0\n</parameter>\n"
           "<parameter=i>\n3\n</parameter>\n<parameter=s>\nt x\n</parameter>\n<parameter=o>\n{\"k\": [1, 2]}\n</parameter>\n"
           "</function>\n</tool_call><|im_end|>\n",
           "qwen36: non-strings via tojson");
  }

  SECTION("template errors and edge cases");
  {
    chat_opts o = { NULL, true, -1, false, false };
    chat_msg only_sys[] = { { "system", "s", NULL, NULL, 0, NULL } };
    expect_err(CHAT_QWEN35, only_sys, 1, &o, "No user query found in messages.", "qwen35 without a user message");
    chat_msg late_sys[] = { { "user", "u", NULL, NULL, 0, NULL }, { "system", "s", NULL, NULL, 0, NULL } };
    expect_err(CHAT_QWEN35, late_sys, 2, &o, "System message must be at the beginning.", "qwen35 late system");
    expect(CHAT_QWEN3, late_sys, 2, &o, "<|im_start|>user\nu<|im_end|>\n<|im_start|>system\ns<|im_end|>\n<|im_start|>assistant\n",
           "qwen3 renders a late system message");
    chat_msg odd[] = { { "user", "u", NULL, NULL, 0, NULL }, { "critic", "c", NULL, NULL, 0, NULL } };
    expect_err(CHAT_QWEN36, odd, 2, &o, "Unexpected message role.", "qwen36 unknown role");
    expect_err(CHAT_QWEN35, odd, 0, &o, "No messages provided.", "qwen35 no messages");
    chat_tool_call bad = { NULL, "f", "[1,2]" };
    chat_msg badm[] = { { "user", "u", NULL, NULL, 0, NULL }, { "assistant", "", NULL, &bad, 1, NULL } };
    expect_err(CHAT_QWEN35, badm, 2, &o, "must be a JSON object", "qwen35 non-object arguments");
    chat_tool_call bad2 = { NULL, "f", "{oops" };
    badm[1].tool_calls = &bad2;
    expect_err(CHAT_QWEN3, badm, 2, &o, "not valid JSON", "qwen3 invalid JSON arguments");
    chat_opts ob = { "{\"a\":1}", true, -1, false, false };
    expect_err(CHAT_QWEN3, late_sys, 1, &ob, "tools must be a JSON array", "tools not an array");
    /* Python str.strip(): U+0085 and U+001F are whitespace, U+FEFF is not */
    chat_msg ws[] = { { "user", "\xc2\x85\x1f hi \xe3\x80\x80", NULL, NULL, 0, NULL } };
    chat_opts og = { NULL, false, -1, false, false };
    expect(CHAT_QWEN35, ws, 1, &og, "<|im_start|>user\nhi<|im_end|>\n", "qwen35 trim uses Python whitespace");
    chat_msg bom[] = { { "user", "\xef\xbb\xbfhi", NULL, NULL, 0, NULL } };
    expect(CHAT_QWEN35, bom, 1, &og, "<|im_start|>user\n\xef\xbb\xbfhi<|im_end|>\n", "qwen35 trim keeps U+FEFF");
  }

  SECTION("format detection from template text");
  {
    const char *files[] = { "tokenizer/qwen3_chat_template.jinja", "tokenizer/qwen35_chat_template.jinja", "tokenizer/qwen36_chat_template.jinja" };
    chat_format want[] = { CHAT_QWEN3, CHAT_QWEN35, CHAT_QWEN36 };
    for (int i = 0; i < 3; i++) {
      size_t n;
      char *t = test_read_all(test_fixture(files[i]), &n);
      chat_format f = (chat_format)-1;
      CHECK(t && chat_format_detect(t, &f) == 0 && f == want[i], "detect %s", files[i]);
      free(t);
    }
    chat_format f;
    CHECK(chat_format_detect("{{ messages }}", &f) == FLOE_E_UNSUPPORTED, "unknown template rejected");
  }
  return TEST_DONE();
}
