// Test harness for floe serve: checks and counts, starting / stopping a server on 127.0.0.1 with a
// free port (floe serve --port 0 prints the port it bound), raw HTTP over a socket.
import { spawn } from 'node:child_process';
import net from 'node:net';

export const counts = { passed: 0, failed: 0 };
export const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function show(v) {
  const s = typeof v === 'string' ? v : JSON.stringify(v);
  return s === undefined ? '' : s.length > 600 ? s.slice(0, 600) + '...' : s;
}

export function check(cond, name, detail) {
  if (cond) {
    counts.passed++;
    console.log(`  ok   ${name}`);
  } else {
    counts.failed++;
    console.log(`  FAIL ${name}${detail !== undefined ? ': ' + show(detail) : ''}`);
  }
  return !!cond;
}

export function eq(a, b, name) {
  return check(JSON.stringify(a) === JSON.stringify(b), name, { got: a, want: b });
}

export async function section(name, fn) {
  console.log(`[${name}]`);
  const t0 = Date.now();
  try {
    await fn();
  } catch (e) {
    check(false, `${name}: unexpected exception`, String((e && e.stack) || e));
  }
  console.log(`  (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}

// Expects an async call to throw an instance of cls with the given status.
export async function expectError(promise, cls, status, name, code) {
  try {
    await promise;
    check(false, name, 'no error thrown');
  } catch (e) {
    check(e instanceof cls && e.status === status && (code === undefined || e.code === code), name,
      { class: e && e.constructor && e.constructor.name, status: e && e.status, code: e && e.code, message: e && e.message });
  }
}

const servers = [];
export const allServers = () => servers;

export async function startServer(model, args = []) {
  const bin = process.env.FLOE_BIN;
  const proc = spawn(bin, ['serve', '-m', model, '--port', '0', ...args], { stdio: ['ignore', 'ignore', 'pipe'] });
  let log = '';
  proc.stderr.on('data', (d) => { log += d; });
  const exited = new Promise((res) => proc.on('exit', (code, signal) => res({ code, signal })));
  const port = await new Promise((res, rej) => {
    const to = setTimeout(() => rej(new Error('server did not start: ' + log)), 60000);
    proc.stderr.on('data', () => {
      const m = /listening on http:\/\/[^\s]+:(\d+)/.exec(log);
      if (m) { clearTimeout(to); res(+m[1]); }
    });
    exited.then((r) => { clearTimeout(to); rej(new Error(`server exited (${JSON.stringify(r)}): ${log}`)); });
  });
  const url = `http://127.0.0.1:${port}`;
  const s = {
    proc, port, url, model, exited,
    log: () => log,
    alive: () => proc.exitCode === null && proc.signalCode === null,
    async stop() {
      if (!s.alive()) return exited;
      proc.kill('SIGTERM');
      const to = setTimeout(() => proc.kill('SIGKILL'), 30000);
      const r = await exited;
      clearTimeout(to);
      return r;
    },
  };
  servers.push(s);
  return s;
}

export async function waitHealthy(s, ms = 60000) {
  const t0 = Date.now();
  while (Date.now() - t0 < ms) {
    try {
      const r = await fetch(s.url + '/health');
      if (r.status === 200) return true;
    } catch { /* not yet */ }
    await sleep(25);
  }
  return false;
}

export async function stopAll() {
  for (const s of servers) await s.stop();
}

// Server logs with sanitizer reports (ASan / UBSan / LSan) are failures.
export function sanitizerReport(log) {
  const m = /(ERROR: (Address|Leak)Sanitizer|runtime error:|SUMMARY: \w+Sanitizer)/.exec(log);
  return m ? log.slice(Math.max(0, m.index - 200), m.index + 2000) : null;
}

// Sends raw bytes; resolves with the status of the first response (0 if none) once the response
// is complete, the peer closes, or the timeout passes.
export function rawHttp(port, data, { timeoutMs = 3000, half = false } = {}) {
  return new Promise((resolve) => {
    const sock = net.connect(port, '127.0.0.1');
    let buf = Buffer.alloc(0);
    let done = false;
    const finish = (why) => {
      if (done) return;
      done = true;
      clearTimeout(to);
      sock.destroy();
      const text = buf.toString('latin1');
      const m = /^HTTP\/1\.[01] (\d{3})/.exec(text);
      resolve({ status: m ? +m[1] : 0, text, why });
    };
    const to = setTimeout(() => finish('timeout'), timeoutMs);
    sock.on('connect', () => {
      sock.write(data, () => { if (half) sock.end(); });
    });
    sock.on('data', (d) => {
      buf = Buffer.concat([buf, d]);
      const s = buf.toString('latin1');
      const he = s.indexOf('\r\n\r\n');
      if (he >= 0) {
        const m = /content-length:\s*(\d+)/i.exec(s.slice(0, he));
        if (m && buf.length - (he + 4) >= +m[1]) finish('complete');
      }
    });
    sock.on('error', () => finish('error'));
    sock.on('close', () => finish('close'));
  });
}

export async function postJson(url, body, headers = {}) {
  const r = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: typeof body === 'string' || body instanceof Uint8Array ? body : JSON.stringify(body),
  });
  const text = await r.text();
  let json = null;
  try { json = JSON.parse(text); } catch { /* not JSON */ }
  return { status: r.status, headers: r.headers, text, json };
}
