// Chat-template oracle: renders each conversation of a fixture file with the model's own Jinja
// template (@huggingface/jinja) and with floe's C renderer (tests/test_chat_render.c), and asserts
// byte equality. Usage: node chat_oracle.mjs PATH/TO/test_chat_render CONVERSATIONS.json
// "developer" messages are given to Jinja as "system" (floe maps the role; Qwen templates lack it).
import fs from "fs";
import path from "path";
import { execFileSync } from "child_process";
import { Template } from "@huggingface/jinja";

const [bin, convPath] = process.argv.slice(2);
const fx = path.dirname(convPath);
const templates = {
  qwen3: fs.readFileSync(path.join(fx, "qwen3_chat_template.jinja"), "utf8"),
  qwen35: fs.readFileSync(path.join(fx, "qwen35_chat_template.jinja"), "utf8"),
  qwen36: fs.readFileSync(path.join(fx, "qwen36_chat_template.jinja"), "utf8"),
};
const convs = JSON.parse(fs.readFileSync(convPath, "utf8"));
let passed = 0, failed = 0;
const formats = new Set();
for (let i = 0; i < convs.length; i++) {
  const c = convs[i];
  formats.add(c.format);
  const messages = c.messages.map((m) => (m.role === "developer" ? { ...m, role: "system" } : m));
  const ctx = { messages, add_generation_prompt: !!c.add_generation_prompt, bos_token: "", eos_token: "<|im_end|>" };
  if (c.tools) ctx.tools = c.tools;
  if ("enable_thinking" in c) ctx.enable_thinking = c.enable_thinking;
  if ("preserve_thinking" in c) ctx.preserve_thinking = c.preserve_thinking;
  let want, got;
  try {
    want = new Template(templates[c.format]).render(ctx);
  } catch (e) {
    console.log(`FAIL ${i} ${c.name}: jinja error ${e.message}`);
    failed++;
    continue;
  }
  try {
    got = execFileSync(bin, [convPath, String(i)], { encoding: "utf8" });
  } catch (e) {
    console.log(`FAIL ${i} ${c.name}: floe renderer failed: ${e.stderr || e.message}`);
    failed++;
    continue;
  }
  if (got === want) {
    passed++;
    if (process.env.FLOE_TEST_VERBOSE) console.log(`ok   ${i} ${c.name}`);
  } else {
    failed++;
    let k = 0;
    while (k < got.length && got[k] === want[k]) k++;
    console.log(`FAIL ${i} ${c.name}: differs at char ${k}\n--- jinja:\n${JSON.stringify(want.slice(Math.max(0, k - 80), k + 120))}\n--- floe:\n${JSON.stringify(got.slice(Math.max(0, k - 80), k + 120))}`);
  }
}
// the set must cover all three templates and be at least 10 conversations
if (convs.length < 10 || formats.size < 3) { console.log("FAIL conversation set too small"); failed++; } else passed++;
console.log(`${passed} passed, ${failed} failed`);
process.exit(failed ? 1 : 0);
