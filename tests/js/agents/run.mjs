// Real agent CLIs against floe serve (driven by tests/test_server_agents.sh): Codex (`codex exec`,
// Responses API), Claude Code (`claude -p`, Messages API) and Qwen Code (`qwen -p`, chat
// completions), each run non-interactively on a scripted model (tools/floe_script_model.c) that
// asks for one tool call reading a file the test wrote, then answers. Each CLI must run the tool
// (the file's secret reaches the server in the tool result, seen through a logging proxy) and
// print the scripted answer. Only 127.0.0.1 is used; telemetry and update checks are off.
// Env: FLOE_BIN, FLOE_SCRIPT_MODEL, FLOE_TMP, FLOE_FIXTURES; FLOE_AGENTS=codex,claude,qwen.
import { execFileSync, spawn } from 'node:child_process';
import crypto from 'node:crypto';
import fs from 'node:fs';
import http from 'node:http';
import path from 'node:path';

const counts = { passed: 0, failed: 0 };
function check(cond, name, detail) {
  if (cond) counts.passed++; else counts.failed++;
  const d = detail === undefined ? '' : ': ' + String(typeof detail === 'string' ? detail : JSON.stringify(detail)).slice(-1500);
  console.log(`  ${cond ? 'ok  ' : 'FAIL'} ${name}${cond ? '' : d}`);
  return !!cond;
}

const here = path.dirname(new URL(import.meta.url).pathname);
const bin = process.env.FLOE_BIN;
const tmp = process.env.FLOE_TMP || '/tmp';
const agents = (process.env.FLOE_AGENTS || 'codex,claude,qwen').split(',');
const dir = fs.mkdtempSync(path.join(tmp, 'floe-agents-'));
const work = path.join(dir, 'work');
fs.mkdirSync(work);
const secret = 'floe-secret-' + crypto.randomBytes(6).toString('hex');
const note = path.join(work, 'note.txt');
fs.writeFileSync(note, `The secret is ${secret}.\n`);
const ANSWER = 'Done: the note says the secret.';
const t0 = Date.now();

// One trigger token per CLI (the prompt carries it); after a tool result the answer script wins.
const call = (name, args) => `<think>\\nRead the file first.\\n</think>\\n\\n<tool_call>\\n${JSON.stringify({ name, arguments: args })}\\n</tool_call>`;
const SCRIPTS = [
  ['<tool_response>', `<think>\\nThe file was read.\\n</think>\\n\\n${ANSWER}`],
  ['<|box_start|>', call('exec_command', { cmd: 'cat note.txt' })],
  ['<|quad_start|>', call('Read', { file_path: note })],
  ['<|vision_start|>', call('read_file', { file_path: note })],
];
const model = path.join(dir, 'agent.gguf');
const margs = ['--arch', 'qwen3moe', '-o', model, '--template', path.join(process.env.FLOE_FIXTURES, 'tokenizer', 'qwen3_chat_template.jinja')];
for (const [t, text] of SCRIPTS) margs.push('--script', `${t}=${text}`);
execFileSync(process.env.FLOE_SCRIPT_MODEL, margs, { stdio: 'ignore' });
const id = path.basename(model);

function run(cmd, args, opts) {
  return new Promise((resolve) => {
    const p = spawn(cmd, args, { ...opts, stdio: ['ignore', 'pipe', 'pipe'] });
    let out = '', err = '';
    p.stdout.on('data', (d) => { out += d; });
    p.stderr.on('data', (d) => { err += d; });
    const to = setTimeout(() => p.kill('SIGKILL'), opts.timeoutMs || 150000);
    p.on('exit', (code, signal) => { clearTimeout(to); resolve({ code, signal, out, err }); });
  });
}

// floe serve on a free port, and a logging proxy in front of it (the CLIs talk to the proxy).
const srv = spawn(bin, ['serve', '-m', model, '--port', '0', '-c', '65536', '-v'], { stdio: ['ignore', 'ignore', 'pipe'] });
let log = '';
srv.stderr.on('data', (d) => { log += d; });
const port = await new Promise((res, rej) => {
  const to = setTimeout(() => rej(new Error('server did not start: ' + log)), 60000);
  srv.stderr.on('data', () => { const m = /listening on http:\/\/[^\s]+:(\d+)/.exec(log); if (m) { clearTimeout(to); res(+m[1]); } });
});
for (let i = 0; i < 600 && (await fetch(`http://127.0.0.1:${port}/health`).then((r) => r.status).catch(() => 0)) !== 200; i++)
  await new Promise((r) => setTimeout(r, 50));
const seen = [];
const proxy = http.createServer((req, res) => {
  const chunks = [];
  req.on('data', (d) => chunks.push(d));
  req.on('end', () => {
    const body = Buffer.concat(chunks);
    seen.push({ url: req.url, body: body.toString() });
    const up = http.request({ host: '127.0.0.1', port, path: req.url, method: req.method, headers: req.headers }, (ur) => {
      res.writeHead(ur.statusCode, ur.headers);
      ur.pipe(res);
    });
    up.on('error', () => res.destroy());
    up.end(body);
  });
});
await new Promise((r) => proxy.listen(0, '127.0.0.1', r));
const base = `http://127.0.0.1:${proxy.address().port}`;
const binDir = path.join(here, 'node_modules', '.bin');

const CLIS = {
  // Codex: a custom provider with the Responses wire API; no sandbox (the test runs as any user).
  codex: (home) => {
    fs.writeFileSync(path.join(home, 'config.toml'), [
      `model = "${id}"`, 'model_provider = "floe"', 'check_for_update_on_startup = false', '',
      '[model_providers.floe]', 'name = "floe"', `base_url = "${base}/v1"`, 'wire_api = "responses"',
      'request_max_retries = 0', 'stream_max_retries = 0', '', '[analytics]', 'enabled = false', ''].join('\n'));
    return { cmd: 'codex', args: ['exec', '--skip-git-repo-check', '-s', 'danger-full-access', 'Read note.txt and tell me the secret. <|box_start|>'],
      env: { CODEX_HOME: home, OPENAI_API_KEY: 'x' }, path: '/v1/responses' };
  },
  // Claude Code: the Messages API at ANTHROPIC_BASE_URL; every model it picks is the served one.
  claude: (home) => ({
    cmd: 'claude', args: ['-p', 'Read note.txt and tell me the secret. <|quad_start|>', '--allowedTools', 'Read'],
    env: { ANTHROPIC_BASE_URL: base, ANTHROPIC_API_KEY: 'x', ANTHROPIC_MODEL: id, ANTHROPIC_SMALL_FAST_MODEL: id,
      ANTHROPIC_DEFAULT_HAIKU_MODEL: id, ANTHROPIC_DEFAULT_SONNET_MODEL: id, ANTHROPIC_DEFAULT_OPUS_MODEL: id,
      DISABLE_TELEMETRY: '1', DISABLE_AUTOUPDATER: '1', DISABLE_ERROR_REPORTING: '1', CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC: '1' },
    path: '/v1/messages',
  }),
  // Qwen Code: chat completions (OPENAI_* variables); one core tool keeps the prompt small.
  qwen: (home) => {
    fs.mkdirSync(path.join(home, '.qwen'), { recursive: true });
    fs.writeFileSync(path.join(home, '.qwen', 'settings.json'), JSON.stringify({
      telemetry: { enabled: false }, privacy: { usageStatisticsEnabled: false },
      general: { disableAutoUpdate: true, disableUpdateNag: true }, tools: { core: ['read_file'] } }));
    return { cmd: 'qwen', args: ['-p', 'Read note.txt and tell me the secret. <|vision_start|>', '--yolo'],
      env: { OPENAI_BASE_URL: `${base}/v1`, OPENAI_API_KEY: 'x', OPENAI_MODEL: id, QWEN_CODE_SUPPRESS_YOLO_WARNING: '1' },
      path: '/v1/chat/completions' };
  },
};

for (const name of agents) {
  console.log(`[${name}]`);
  const t = Date.now();
  const home = fs.mkdtempSync(path.join(dir, `home-${name}-`));
  const c = CLIS[name](home);
  const exe = path.join(binDir, c.cmd);
  if (!check(fs.existsSync(exe), `${c.cmd} installed`, exe)) continue;
  const from = seen.length;
  const env = { PATH: process.env.PATH, HOME: home, TMPDIR: home, NO_COLOR: '1', CI: '1', ...c.env };
  const r = await run(exe, c.args, { cwd: work, env });
  const mine = seen.slice(from).filter((x) => x.url.split('?')[0] === c.path);
  check(r.code === 0, `${name}: exits 0`, { code: r.code, signal: r.signal, out: r.out.slice(-800), err: r.err.slice(-1500) });
  check(mine.length >= 2, `${name}: talks to ${c.path} (${mine.length} requests)`, seen.slice(from).map((x) => x.url));
  check(mine.some((x) => x.body.includes(secret)), `${name}: ran the tool (the file's secret came back in a tool result)`);
  check(r.out.includes(ANSWER), `${name}: printed the scripted answer`, r.out.slice(-800) + r.err.slice(-800));
  console.log(`  (${((Date.now() - t) / 1000).toFixed(1)} s)`);
}

proxy.close();
srv.kill('SIGTERM');
const exit = await new Promise((r) => srv.on('exit', (code, signal) => r({ code, signal })));
check(exit.code === 0, 'server exits 0 on SIGTERM', { exit, log: log.slice(-1500) });
fs.rmSync(dir, { recursive: true, force: true });
console.log(`total ${((Date.now() - t0) / 1000).toFixed(1)} s`);
console.log(`${counts.passed} passed, ${counts.failed} failed`);
process.exit(counts.failed ? 1 : 0);
