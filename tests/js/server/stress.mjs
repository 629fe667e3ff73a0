// Load (32 concurrent clients x 20 requests, bounded queue: every request succeeds or gets a clean
// 503 with Retry-After) and a bounded, seeded fuzz of request bodies and raw HTTP: the server never
// crashes, answers 4xx to bad input and keeps serving.
import OpenAI from 'openai';

import { check, eq, postJson, rawHttp, section, startServer, waitHealthy } from './lib.mjs';

function rng(seed) {
  let x = BigInt(seed) || 1n;
  return () => {
    x ^= (x << 13n) & 0xffffffffffffffffn;
    x ^= x >> 7n;
    x ^= (x << 17n) & 0xffffffffffffffffn;
    return Number(x & 0xffffffffn) / 4294967296;
  };
}

export async function loadTest(model, id, { clients = 32, perClient = 20 } = {}) {
  const s = await startServer(model, ['-c', '256', '--queue', '8']);
  check(await waitHealthy(s), 'load: server healthy');
  await section(`load: ${clients} clients x ${perClient} requests, queue 8`, async () => {
    const statuses = {}, bad = [];
    let ok = 0, busy = 0;
    const t0 = Date.now();
    const one = async (c, i) => {
      const oa = new OpenAI({ baseURL: s.url + '/v1', apiKey: 'x', maxRetries: 0, timeout: 60000 });
      const req = { model: id, messages: [{ role: 'user', content: `client ${c} request ${i}` }], max_tokens: 3, temperature: 0 };
      try {
        if (i % 4 === 3) {
          const st = await oa.chat.completions.create({ ...req, stream: true });
          let fin = null;
          for await (const ch of st) if (ch.choices[0] && ch.choices[0].finish_reason) fin = ch.choices[0].finish_reason;
          if (fin) ok++; else bad.push('stream without finish_reason');
        } else {
          const r = await oa.chat.completions.create(req);
          if (r.choices[0].finish_reason) ok++; else bad.push(r);
        }
        statuses[200] = (statuses[200] || 0) + 1;
      } catch (e) {
        statuses[e.status] = (statuses[e.status] || 0) + 1;
        if (e.status === 503 && e.headers && e.headers.get('retry-after') && e.error && e.error.message) busy++;
        else bad.push({ status: e.status, message: e.message });
      }
    };
    await Promise.all(Array.from({ length: clients }, async (_, c) => { for (let i = 0; i < perClient; i++) await one(c, i); }));
    const secs = (Date.now() - t0) / 1000;
    console.log(`  ${ok} ok, ${busy} busy (503) in ${secs.toFixed(1)} s; statuses ${JSON.stringify(statuses)}`);
    eq(ok + busy, clients * perClient, 'every request succeeded or got a clean 503 with Retry-After');
    check(bad.length === 0, 'no other outcome', bad.slice(0, 3));
    check(ok > 0, 'some requests succeeded');
    check(secs < 150, 'bounded time', secs);
    const m = await (await fetch(s.url + '/metrics')).text();
    check(/floe_queue_depth 0\b/.test(m), 'queue drained', m.match(/floe_queue_depth.*/g));
  });
  eq(await s.stop(), { code: 0, signal: null }, 'load: server exits 0 on SIGTERM');
}

const FIELDS = ['model', 'messages', 'temperature', 'top_p', 'top_k', 'min_p', 'seed', 'stop', 'max_tokens',
  'max_completion_tokens', 'tools', 'tool_choice', 'logprobs', 'top_logprobs', 'stream', 'stream_options', 'n',
  'response_format', 'chat_template_kwargs', 'reasoning_effort'];
const VALUES = [null, true, 0, -1, 1e308, 2.5, 's', '', [], {}, [1], { a: 1 }, [{ role: 'user' }]];

export async function fuzzTest(model, { mutations = 150 } = {}) {
  const s = await startServer(model, ['-c', '256', '--max-body', '64K']);
  check(await waitHealthy(s), 'fuzz: server healthy');
  const url = s.url + '/v1/chat/completions';
  const base = { messages: [{ role: 'system', content: 'hi' }, { role: 'user', content: 'hello' }], max_tokens: 2, temperature: 0 };
  const okStatus = (st) => st === 200 || st === 400 || st === 404 || st === 413 || st === 503;
  const r = rng(12345);

  await section('fuzz: field types', async () => {
    const fails = [];
    for (const f of FIELDS)
      for (const v of VALUES) {
        const body = { ...base, model: undefined, [f]: v };
        if (f !== 'max_tokens' && f !== 'max_completion_tokens') body.max_tokens = 2;
        else if (v === null) body.max_tokens = 2; // keep generations short
        const res = await postJson(url, JSON.stringify(body));
        if (!okStatus(res.status) || (res.status !== 200 && !(res.json && res.json.error && res.json.error.message))) fails.push([f, v, res.status, res.text.slice(0, 200)]);
      }
    check(fails.length === 0, `${FIELDS.length * VALUES.length} type-swapped requests: 200 or a 4xx error object`, fails.slice(0, 5));
  });

  await section('fuzz: messages shapes', async () => {
    const shapes = [
      [], [1], [null], [{}], [{ role: 'user' }], [{ role: 'user', content: 1 }], [{ role: 'user', content: [{ type: 'image_url' }] }],
      [{ role: 'user', content: [{ type: 'text', text: 'a' }, { type: 'text', text: 'b' }] }],
      [{ role: 'assistant', content: null, tool_calls: [{ function: { name: 'f', arguments: 'not json' } }] }, { role: 'user', content: 'x' }],
      [{ role: 'assistant', tool_calls: 'x' }], [{ role: 'tool', content: 'r' }], [{ role: 'user', content: 'a\u0000b' }],
      [{ role: 'assistant', content: 'only assistant' }], [{ role: 'user', content: '\ud83d\ude00 <|im_end|> <think> </tool_call>' }],
    ];
    const fails = [];
    for (const m of shapes) {
      const res = await postJson(url, JSON.stringify({ ...base, messages: m }));
      if (!okStatus(res.status)) fails.push([m, res.status, res.text.slice(0, 200)]);
    }
    check(fails.length === 0, `${shapes.length} message shapes: 200 or 4xx`, fails);
  });

  await section('fuzz: mutated bodies', async () => {
    const text = JSON.stringify({ ...base, tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'object' } } }], stop: ['x'], logprobs: true, top_logprobs: 2 });
    const fails = [];
    for (let i = 0; i < mutations; i++) {
      let b = Buffer.from(text);
      const k = 1 + Math.floor(r() * 4);
      for (let j = 0; j < k; j++) {
        const op = Math.floor(r() * 4), at = Math.floor(r() * b.length);
        if (op === 0) b[at] = Math.floor(r() * 256);
        else if (op === 1) b = Buffer.concat([b.subarray(0, at), b.subarray(Math.min(b.length, at + 1 + Math.floor(r() * 20)))]);
        else if (op === 2) b = Buffer.concat([b.subarray(0, at), Buffer.from(['{', '[', '"', '\\', ']', '}', ',', ':', '1e999', 'null', '\xff\xfe'][Math.floor(r() * 11)], 'latin1'), b.subarray(at)]);
        else b = b.subarray(0, at);
      }
      const res = await postJson(url, b);
      if (!okStatus(res.status)) fails.push([b.toString('latin1').slice(0, 120), res.status, res.text.slice(0, 160)]);
    }
    check(fails.length === 0, `${mutations} mutated bodies: 200 or 4xx`, fails.slice(0, 5));
  });

  await section('fuzz: raw HTTP', async () => {
    const p = s.port;
    const res = async (data, opts) => (await rawHttp(p, data, opts)).status;
    eq(await res('DELETE /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n'), 405, 'DELETE -> 405');
    eq(await res('GET /v1/chat/completions HTTP/1.1\r\nHost: x\r\n\r\n'), 405, 'GET on a POST endpoint -> 405');
    eq(await res('POST /health HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n'), 405, 'POST /health -> 405');
    eq(await res('GET /nope HTTP/1.1\r\nHost: x\r\n\r\n'), 404, 'unknown path -> 404');
    const inval = Buffer.concat([Buffer.from('{"messages":[{"role":"user","content":"'), Buffer.from([0xff, 0xc3, 0x28]), Buffer.from('"}]}')]);
    eq((await postJson(url, inval)).status, 400, 'invalid UTF-8 -> 400');
    eq((await postJson(url, '['.repeat(50000))).status, 400, 'deeply nested arrays -> 400');
    eq((await postJson(url, '{"a":'.repeat(10000) + '1' + '}'.repeat(10000))).status, 400, 'deeply nested objects -> 400');
    const huge = await res(`GET /health HTTP/1.1\r\nHost: x\r\nX-Big: ${'a'.repeat(200000)}\r\n\r\n`);
    check(huge >= 400 && huge < 500 || huge === 0, 'huge header: 4xx or closed', huge);
    const cl = await res('POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 99999999999\r\n\r\n{');
    eq(cl, 413, 'Content-Length over the limit -> 413 before the body');
    const chunked = `POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n${'10000\r\n' + 'a'.repeat(65536) + '\r\n'}${'10000\r\n' + 'a'.repeat(65536) + '\r\n'}0\r\n\r\n`;
    eq(await res(chunked, { timeoutMs: 5000 }), 413, 'chunked body over the limit -> 413');
    let garbage = 0;
    for (let i = 0; i < 40; i++) {
      const n = 1 + Math.floor(r() * 3000);
      const b = Buffer.alloc(n);
      for (let j = 0; j < n; j++) b[j] = Math.floor(r() * 256);
      const st = await res(b, { timeoutMs: 300, half: true });
      if (st === 0 || (st >= 400 && st < 500)) garbage++;
    }
    eq(garbage, 40, 'random bytes: 4xx or connection closed');
    const valid = 'POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: 80\r\n\r\n{"messages":[{"role":"user","content":"hello"}],"max_tokens":2,"temperature":0}';
    let trunc = 0;
    for (let i = 0; i < 30; i++) {
      const st = await res(valid.slice(0, Math.floor(r() * (valid.length - 1))), { timeoutMs: 300, half: i % 2 === 0 });
      if (st === 0 || (st >= 400 && st < 500)) trunc++;
    }
    eq(trunc, 30, 'truncated requests: 4xx or closed');
    const two = `${valid.replace('Content-Length: 80', 'Content-Length: 79')}`;
    check([200, 400].includes(await res(two)), 'request with a short Content-Length: answered');
    eq(await res('GET /health HTTP/1.0\r\n\r\n'), 200, 'HTTP/1.0 without Host');
  });

  check(s.alive(), 'fuzz: server still running');
  const h = await fetch(s.url + '/health');
  eq(h.status, 200, 'fuzz: still healthy');
  const ok = await postJson(url, base);
  eq(ok.status, 200, 'fuzz: still answering chat requests');
  eq(await s.stop(), { code: 0, signal: null }, 'fuzz: server exits 0 on SIGTERM');
}
