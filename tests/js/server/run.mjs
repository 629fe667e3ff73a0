// floe serve test suite (driven by tests/test_server.sh): builds the test models, then runs the
// groups against real servers on 127.0.0.1. Prints each check and "N passed, N failed" last.
// Env: FLOE_BIN (floe binary), FLOE_SCRIPT_MODEL (tools/floe_script_model binary), FLOE_TMP,
// FLOE_FIXTURES; FLOE_SERVER_TESTS=basic,tools,apis,load,fuzz (default all); FLOE_SERVER_QUICK=1 for
// a smaller load / fuzz (sanitizer builds).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import { apiTests, healthTests } from './apis.mjs';
import { basicTests } from './basic.mjs';
import { allServers, check, counts, sanitizerReport, stopAll } from './lib.mjs';
import { fuzzTest, loadTest } from './stress.mjs';
import { SCRIPTS, toolTests } from './tools.mjs';

const tmp = process.env.FLOE_TMP || '/tmp';
const fixtures = process.env.FLOE_FIXTURES;
const groups = (process.env.FLOE_SERVER_TESTS || 'basic,tools,apis,load,fuzz').split(',');
const quick = process.env.FLOE_SERVER_QUICK === '1';
const bin = process.env.FLOE_BIN;
const dir = fs.mkdtempSync(path.join(tmp, 'floe-server-'));
const t0 = Date.now();
const servers = [];

async function main() {
  const random = path.join(dir, 'tiny-qwen3moe.gguf');
  execFileSync(bin, ['synth', '--preset', 'tiny-qwen3moe', '--layers', '2', '--type', 'q8_0', '-t', '2', '-o', random], { stdio: 'ignore' });
  const hybrid = path.join(dir, 'tiny-qwen35moe.gguf');
  execFileSync(bin, ['synth', '--preset', 'tiny-qwen35moe', '--type', 'q8_0', '-t', '2', '-o', hybrid], { stdio: 'ignore' });
  const models = { randomId: path.basename(random), randomFile: path.basename(random, '.gguf'), hybrid };
  const scripted = {};
  for (const arch of ['qwen3moe', 'qwen35moe']) {
    const out = path.join(dir, `script-${arch}.gguf`);
    const tmpl = path.join(fixtures, 'tokenizer', arch === 'qwen3moe' ? 'qwen3_chat_template.jinja' : 'qwen35_chat_template.jinja');
    const args = ['--arch', arch, '-o', out, '--template', tmpl];
    for (const [t, text] of SCRIPTS[arch]) args.push('--script', `${t}=${text}`);
    execFileSync(process.env.FLOE_SCRIPT_MODEL, args, { stdio: 'ignore' });
    scripted[arch] = out;
  }
  console.log(`models built in ${((Date.now() - t0) / 1000).toFixed(1)} s`);
  if (groups.includes('basic')) servers.push(await basicTests(random, models));
  if (groups.includes('tools')) for (const arch of ['qwen3moe', 'qwen35moe']) await toolTests(arch, scripted[arch], path.basename(scripted[arch]));
  if (groups.includes('apis')) {
    for (const arch of ['qwen3moe', 'qwen35moe']) await apiTests(arch, scripted[arch], path.basename(scripted[arch]));
    await healthTests(random, dir);
  }
  if (groups.includes('load')) await loadTest(random, models.randomId, quick ? { clients: 32, perClient: 5 } : {});
  if (groups.includes('fuzz')) await fuzzTest(random, quick ? { mutations: 60 } : {});
}

try {
  await main();
} catch (e) {
  check(false, 'suite aborted', String((e && e.stack) || e));
}
await stopAll();
for (const s of allServers()) {
  const rep = sanitizerReport(s.log());
  check(!rep, `no sanitizer report from the server on ${path.basename(s.model)} (port ${s.port})`, rep);
  const code = s.proc.exitCode;
  if (s.model.endsWith('.fifo')) continue; // fails to load on purpose
  check(code === 0, `server on port ${s.port} exited 0`, { code, signal: s.proc.signalCode, log: s.log().slice(-1500) });
}
fs.rmSync(dir, { recursive: true, force: true });
console.log(`total ${((Date.now() - t0) / 1000).toFixed(1)} s`);
console.log(`${counts.passed} passed, ${counts.failed} failed`);
process.exit(counts.failed ? 1 : 0);
