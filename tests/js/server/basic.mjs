// floe serve with a random tiny model and the official openai client: endpoints, chat (plain and
// streamed), usage, stop strings, seeds, logprobs, completions, errors, prefix reuse (also when the
// history re-renders the last reply differently, on an attention model and on a GatedDeltaNet
// hybrid).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';

import OpenAI, { AuthenticationError, BadRequestError, NotFoundError } from 'openai';

import { check, eq, expectError, postJson, section, startServer, waitHealthy } from './lib.mjs';

const client = (s, opts = {}) => new OpenAI({ baseURL: s.url + '/v1', apiKey: 'sk-anything', maxRetries: 0, timeout: 60000, ...opts });

async function streamChat(oa, req) {
  const stream = await oa.chat.completions.create({ ...req, stream: true });
  const chunks = [];
  for await (const c of stream) chunks.push(c);
  return chunks;
}

// Turn 1, then turn 2 whose history renders the reply differently from what was sampled (as
// templates that drop the old <think> block do): the warm server reuses the prefix up to the
// divergence (hybrids: up to the checkpoint before the reply's <|im_start|>), and its reply and
// logprobs equal a fresh server's, which sees only turn 2.
async function rerenderedTurn(warm, fresh, id, slack) {
  const req = (oa, m) => oa.chat.completions.create({ model: id, messages: m, max_tokens: 10, temperature: 0, logprobs: true, top_logprobs: 3 });
  const u1 = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Tell me about the model and the data.' }];
  const r1 = await req(warm, u1);
  const turn2 = [...u1, { role: 'assistant', content: 'A reply as the template re-renders it.' }, { role: 'user', content: 'And then?' }];
  const w2 = await req(warm, turn2);
  const c = w2.usage.prompt_tokens_details.cached_tokens, n1 = r1.usage.prompt_tokens;
  check(c >= n1 - slack && c <= n1, `${id}: re-rendered reply: the prompt before it is reused (cached ${c}, first prompt ${n1})`);
  const f2 = await req(fresh, turn2);
  eq(f2.usage.prompt_tokens_details.cached_tokens, 0, `${id}: fresh server runs it cold`);
  eq([w2.choices[0].message, w2.choices[0].logprobs], [f2.choices[0].message, f2.choices[0].logprobs],
    `${id}: reply and logprobs with the partial reuse == fresh server`);
}

const joinDelta = (chunks, field) => chunks.map((c) => (c.choices[0] && c.choices[0].delta[field]) || '').join('');

export async function basicTests(model, models) {
  const s = await startServer(model, ['-c', '512', '--max-body', '64K']);
  check(await waitHealthy(s), 'server becomes healthy');
  const oa = client(s);
  const msgs = [{ role: 'system', content: 'You are terse.' }, { role: 'user', content: 'Say something about the world.' }];

  await section('endpoints', async () => {
    const h = await fetch(s.url + '/health');
    eq([h.status, await h.json()], [200, { status: 'ok' }], 'GET /health 200 {"status":"ok"}');
    const list = await oa.models.list();
    const ids = list.data.map((m) => m.id);
    check(ids.length === 1 && ids[0] === models.randomId, 'GET /v1/models lists the served id', ids);
    const tok = await postJson(s.url + '/tokenize', { content: 'Hello world', with_pieces: false });
    check(tok.status === 200 && Array.isArray(tok.json.tokens) && tok.json.tokens.length > 0, 'POST /tokenize', tok.text);
    const de = await postJson(s.url + '/detokenize', { tokens: tok.json.tokens });
    eq(de.json && de.json.content, 'Hello world', 'POST /detokenize round-trips');
    const bad = await postJson(s.url + '/detokenize', { tokens: [-1] });
    check(bad.status === 400, '/detokenize rejects an out-of-range id', bad.text);
  });

  let greedy;
  await section('chat, non-streaming and streaming', async () => {
    const r = await oa.chat.completions.create({ model: models.randomId, messages: msgs, max_tokens: 16, temperature: 0 });
    greedy = r.choices[0].message.content;
    check(r.object === 'chat.completion' && r.id.startsWith('chatcmpl-'), 'object and id', r);
    check(typeof greedy === 'string' && greedy.length > 0, 'content is a non-empty string', r.choices[0]);
    eq(r.choices[0].finish_reason, 'length', 'finish_reason length at max_tokens');
    check(r.usage.completion_tokens === 16 && r.usage.prompt_tokens > 5 &&
      r.usage.total_tokens === r.usage.prompt_tokens + r.usage.completion_tokens, 'usage counts', r.usage);
    check(r.usage.prompt_tokens_details && typeof r.usage.prompt_tokens_details.cached_tokens === 'number', 'usage.prompt_tokens_details.cached_tokens');

    const chunks = await streamChat(oa, { model: models.randomId, messages: msgs, max_tokens: 16, temperature: 0, stream_options: { include_usage: true } });
    const first = chunks[0], usage = chunks[chunks.length - 1], last = chunks[chunks.length - 2];
    check(chunks.every((c) => c.object === 'chat.completion.chunk' && c.id === first.id && c.created === first.created), 'chunks share object/id/created');
    eq(first.choices[0].delta.role, 'assistant', 'first chunk carries the role');
    eq(last.choices[0].finish_reason, 'length', 'last choice chunk carries finish_reason');
    check(chunks.slice(0, -2).every((c) => c.choices[0].finish_reason === null), 'no finish_reason before the last chunk');
    check(Array.isArray(usage.choices) && usage.choices.length === 0 && usage.usage.completion_tokens === 16, 'final usage chunk with choices: []', usage);
    eq(joinDelta(chunks, 'content'), greedy, 'streamed content == non-streamed content (greedy)');
    const noUsage = await streamChat(oa, { model: models.randomId, messages: msgs, max_tokens: 4, temperature: 0 });
    check(noUsage.every((c) => c.choices.length === 1 && !c.usage), 'no usage chunk without include_usage');
  });

  await section('stop strings', async () => {
    // a stop string taken from the middle of the greedy output: the reply must end right before it
    let at = -1, stop = '';
    for (let i = 3; i + 3 <= greedy.length && at < 0; i++) {
      const cand = greedy.slice(i, i + 3);
      if (greedy.indexOf(cand) === i && !/[\uFFFD]/.test(cand)) { at = i; stop = cand; }
    }
    check(at > 0, 'found a stop candidate in the greedy output', greedy);
    const r = await oa.chat.completions.create({ messages: msgs, max_tokens: 16, temperature: 0, stop: [stop, 'zzzzqqq'], model: models.randomId });
    eq(r.choices[0].message.content, greedy.slice(0, at), 'reply ends before the stop string');
    eq(r.choices[0].finish_reason, 'stop', 'finish_reason stop');
    const chunks = await streamChat(oa, { messages: msgs, max_tokens: 16, temperature: 0, stop, model: models.randomId });
    const text = joinDelta(chunks, 'content');
    eq(text, greedy.slice(0, at), 'streamed reply ends before the stop string (no partial leak)');
    check(!text.includes(stop[0] + stop[1]) || greedy.slice(0, at).includes(stop[0] + stop[1]), 'no partial stop string streamed');
  });

  await section('seeds', async () => {
    const req = { model: models.randomId, messages: msgs, max_tokens: 24, temperature: 1.0, top_p: 0.95 };
    const a = await oa.chat.completions.create({ ...req, seed: 42 });
    const b = await oa.chat.completions.create({ ...req, seed: 42 });
    const c = await oa.chat.completions.create({ ...req, seed: 4242 });
    eq(b.choices[0].message.content, a.choices[0].message.content, 'same seed, same text');
    check(c.choices[0].message.content !== a.choices[0].message.content, 'different seed, different text', [a.choices[0].message.content, c.choices[0].message.content]);
    const k = await oa.chat.completions.create({ ...req, seed: 1, top_k: 1, min_p: 0.05 });
    check(typeof k.choices[0].message.content === 'string', 'top_k / min_p accepted');
  });

  await section('logprobs', async () => {
    const r = await oa.chat.completions.create({ model: models.randomId, messages: msgs, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 3 });
    const lp = r.choices[0].logprobs && r.choices[0].logprobs.content;
    check(Array.isArray(lp) && lp.length === 8, 'one logprob entry per generated token', r.choices[0].logprobs);
    if (Array.isArray(lp) && lp.length) {
      check(lp.every((t) => t.logprob <= 0 && Array.isArray(t.bytes) && t.top_logprobs.length === 3), 'entries have logprob <= 0, bytes, 3 alternatives');
      check(lp.every((t) => t.top_logprobs[0].logprob >= t.top_logprobs[1].logprob && t.top_logprobs[1].logprob >= t.top_logprobs[2].logprob), 'alternatives sorted');
      check(lp.every((t) => t.token === t.top_logprobs[0].token && Math.abs(t.logprob - t.top_logprobs[0].logprob) < 1e-5), 'greedy token is the best alternative');
      const bytes = Buffer.from(lp.flatMap((t) => t.bytes));
      eq(bytes.toString('utf8'), r.choices[0].message.content, 'token bytes concatenate to the content');
    }
    const chunks = await streamChat(oa, { model: models.randomId, messages: msgs, max_tokens: 8, temperature: 0, logprobs: true, top_logprobs: 1 });
    const sl = chunks.flatMap((c) => (c.choices[0] && c.choices[0].logprobs ? c.choices[0].logprobs.content : []));
    check(sl.length === 8 && lp && sl.every((t, i) => t.token === lp[i].token), 'streamed logprobs match', sl.length);
    await expectError(oa.chat.completions.create({ model: models.randomId, messages: msgs, max_tokens: 2, top_logprobs: 50, logprobs: true }), BadRequestError, 400, 'top_logprobs > 20 -> 400');
  });

  await section('completions', async () => {
    const r = await oa.completions.create({ model: models.randomId, prompt: 'The world is', max_tokens: 6, temperature: 0, logprobs: 2 });
    check(r.object === 'text_completion' && typeof r.choices[0].text === 'string', 'text_completion', r);
    const lp = r.choices[0].logprobs;
    check(lp && lp.tokens.length === 6 && lp.token_logprobs.length === 6 && lp.top_logprobs.length === 6 && lp.text_offset[0] === 0, 'legacy logprobs shape', lp);
    const st = await oa.completions.create({ model: models.randomId, prompt: 'The world is', max_tokens: 6, temperature: 0, stream: true });
    let text = '';
    for await (const c of st) text += c.choices[0] ? c.choices[0].text : '';
    eq(text, r.choices[0].text, 'streamed completion == non-streamed');
    const ids = await oa.completions.create({ model: models.randomId, prompt: [1, 2, 3], max_tokens: 2, temperature: 0 });
    eq(ids.usage.prompt_tokens, 3, 'prompt as token ids');
  });

  await section('errors', async () => {
    const bad = await postJson(s.url + '/v1/chat/completions', '{"messages": [');
    check(bad.status === 400 && bad.json && bad.json.error && bad.json.error.type === 'invalid_request_error' && 'code' in bad.json.error && bad.json.error.message,
      'malformed JSON -> 400 with {error:{message,type,code}}', bad.text);
    await expectError(oa.chat.completions.create({ model: models.randomId, messages: 'hello' }), BadRequestError, 400, 'messages not an array -> 400');
    await expectError(oa.chat.completions.create({ model: models.randomId, messages: msgs, temperature: 'hot' }), BadRequestError, 400, 'temperature of the wrong type -> 400');
    await expectError(oa.chat.completions.create({ model: models.randomId, messages: [{ role: 'wizard', content: 'x' }] }), BadRequestError, 400, 'unknown role -> 400');
    await expectError(oa.chat.completions.create({ model: 'gpt-17', messages: msgs }), NotFoundError, 404, 'unknown model -> 404', 'model_not_found');
    const byFile = await oa.chat.completions.create({ model: models.randomFile, messages: msgs, max_tokens: 1 });
    check(byFile.choices.length === 1, 'the model file name is accepted as model id');
    await expectError(oa.chat.completions.create({ model: models.randomId, messages: msgs, n: 2 }), BadRequestError, 400, 'n = 2 -> 400');
    const long = 'word '.repeat(2000);
    await expectError(oa.chat.completions.create({ model: models.randomId, messages: [{ role: 'user', content: long }] }), BadRequestError, 400,
      'prompt longer than the context -> 400 context_length_exceeded', 'context_length_exceeded');
    const big = await postJson(s.url + '/v1/chat/completions', JSON.stringify({ messages: [{ role: 'user', content: 'x'.repeat(100000) }] }));
    check(big.status === 413 && big.json && big.json.error, 'body over --max-body -> 413', big.status);
    const r = await oa.chat.completions.create({ model: models.randomId, messages: msgs, max_tokens: 2 });
    check(r.choices.length === 1, 'still serving after the bad requests');
  });

  await section('prefix cache', async () => {
    const u1 = [{ role: 'user', content: 'Tell me about the model and the data.' }];
    const req = (m) => oa.chat.completions.create({ model: models.randomId, messages: m, max_tokens: 12, temperature: 0 });
    const r1 = await req(u1);
    const turn2 = [...u1, { role: 'assistant', content: r1.choices[0].message.content }, { role: 'user', content: 'And then?' }];
    const warm = await req(turn2);
    check(warm.usage.prompt_tokens_details.cached_tokens > r1.usage.prompt_tokens - 2,
      'the extended conversation reuses the cached prefix', [warm.usage, r1.usage.prompt_tokens]);
    await req([{ role: 'user', content: 'Something else entirely.' }]); // evicts the session
    const cold = await req(turn2);
    check(cold.usage.prompt_tokens_details.cached_tokens < 8, 'after eviction the same request runs cold (but for the shared template opening)', cold.usage);
    eq(cold.choices[0].message.content, warm.choices[0].message.content, 'warm (prefix reuse) == cold output');
    eq(cold.usage.prompt_tokens, warm.usage.prompt_tokens, 'same prompt tokens warm and cold');
    const again = await req(turn2);
    eq(again.choices[0].message.content, warm.choices[0].message.content, 'same request twice, same output');
    // a fresh server that sees the same two requests produces the same second reply
    const s2 = await startServer(model, ['-c', '512']);
    await waitHealthy(s2);
    const oa2 = client(s2);
    const f1 = await oa2.chat.completions.create({ model: models.randomId, messages: u1, max_tokens: 12, temperature: 0 });
    eq(f1.choices[0].message.content, r1.choices[0].message.content, 'fresh server: same first reply');
    const f2 = await oa2.chat.completions.create({ model: models.randomId, messages: turn2, max_tokens: 12, temperature: 0 });
    eq(f2.choices[0].message.content, warm.choices[0].message.content, 'fresh server: same second reply');
    // the fresh server is warm after this; a third one is the cold reference
    const s3 = await startServer(model, ['-c', '512']);
    await waitHealthy(s3);
    await rerenderedTurn(oa, client(s3), models.randomId, 1);
    eq(await s3.stop(), { code: 0, signal: null }, 'third server exits 0 on SIGTERM');
    // a GatedDeltaNet hybrid (qwen35moe): its recurrent state resumes from a checkpoint
    const h1 = await startServer(models.hybrid, ['-c', '512']), h2 = await startServer(models.hybrid, ['-c', '512']);
    await waitHealthy(h1);
    await waitHealthy(h2);
    await rerenderedTurn(client(h1), client(h2), path.basename(models.hybrid), 16);
    eq([await h1.stop(), await h2.stop()], [{ code: 0, signal: null }, { code: 0, signal: null }], 'hybrid servers exit 0');
    const code = await s2.stop();
    eq(code, { code: 0, signal: null }, 'second server exits 0 on SIGTERM');
  });

  await section('client disconnect', async () => {
    const big = await startServer(model, ['-c', '16384']); // long enough generations to abandon (4096 tokens of the tiny model could finish before a loaded CI machine noticed the disconnect)
    await waitHealthy(big);
    const oa = client(big);
    // a prompt whose greedy reply is long (no end of generation within 200 tokens)
    let long = null;
    for (const q of ['Say something about the world.', 'Tell me a long story.', 'List many numbers.', 'Write code.', 'Go on and on.']) {
      const probe = await oa.chat.completions.create({ model: models.randomId, messages: [{ role: 'user', content: q }], max_tokens: 200, temperature: 0 });
      if (probe.choices[0].finish_reason === 'length') { long = [{ role: 'user', content: q }]; break; }
    }
    check(long !== null, 'found a prompt with a long greedy reply');
    const longReq = { model: models.randomId, messages: long || msgs, max_tokens: 100000, temperature: 0 };
    const before = await (await fetch(big.url + '/metrics')).text();
    const cancelledBefore = +(/floe_requests_cancelled_total (\d+)/.exec(before) || [0, 0])[1];
    const ac = new AbortController();
    const t0 = Date.now();
    try {
      const st = await oa.chat.completions.create({ ...longReq, stream: true }, { signal: ac.signal });
      let n = 0;
      for await (const c of st) { if (++n === 3) ac.abort(); void c; }
    } catch { /* aborted */ }
    // the generation stops at once: a new request is answered quickly
    const r = await oa.chat.completions.create({ model: models.randomId, messages: msgs, max_tokens: 2 });
    check(r.choices.length === 1 && Date.now() - t0 < 20000, 'server free again right after the client went away', Date.now() - t0);
    const after = await (await fetch(big.url + '/metrics')).text();
    const cancelledAfter = +(/floe_requests_cancelled_total (\d+)/.exec(after) || [0, 0])[1];
    eq(cancelledAfter, cancelledBefore + 1, 'the abandoned generation was cancelled');
    // a non-streaming request whose client goes away is cancelled too
    const ac2 = new AbortController();
    // abort once the server has received it: queued or running, it is then cancelled either way.
    // (A fixed delay raced the request's arrival; waiting for floe_requests_processing >= 1 did
    // too: the previous request's job still counts as running for a moment after its reply, and
    // on a loaded machine the abort then came before this request had arrived.)
    const chatReqs = (t) => +(/floe_requests_total\{endpoint="chat_completions"\} (\d+)/.exec(t) || [0, 0])[1];
    const chatBefore = chatReqs(after);
    const p = oa.chat.completions.create(longReq, { signal: ac2.signal }).catch(() => null);
    for (let i = 0; i < 2500; i++) {
      const g = await (await fetch(big.url + '/metrics')).text();
      if (chatReqs(g) >= chatBefore + 1) break;
      await new Promise((res) => setTimeout(res, 2));
    }
    ac2.abort();
    await p;
    const r2 = await oa.chat.completions.create({ model: models.randomId, messages: msgs, max_tokens: 2 });
    check(r2.choices.length === 1, 'non-streaming: server free again after the abort');
    const m3 = await (await fetch(big.url + '/metrics')).text();
    check(+(/floe_requests_cancelled_total (\d+)/.exec(m3) || [0, 0])[1] >= cancelledAfter + 1, 'non-streaming abort cancelled');
    eq(await big.stop(), { code: 0, signal: null }, 'server exits 0 on SIGTERM');
  });

  await section('metrics and api key', async () => {
    const m = await (await fetch(s.url + '/metrics')).text();
    for (const k of ['floe_requests_total{endpoint="chat_completions"}', 'floe_generated_tokens_total', 'floe_prompt_tokens_total',
      'floe_decode_tokens_per_second', 'floe_queue_depth', 'floe_expert_cache_hit_ratio'])
      check(m.includes(k + ' ') || m.includes(k + '{'), `/metrics has ${k}`);
    // with a memory budget the engine streams experts from disk: /metrics reports its cache
    const ms = await startServer(model, ['-c', '256', '--mem-budget', '32M']);
    await waitHealthy(ms);
    await client(ms).chat.completions.create({ model: models.randomId, messages: msgs, max_tokens: 8 });
    const mm = await (await fetch(ms.url + '/metrics')).text();
    const num = (k) => +((new RegExp(`^${k} ([0-9.e+-]+)$`, 'm').exec(mm) || [0, NaN])[1]);
    const hits = num('floe_expert_cache_hits_total'), misses = num('floe_expert_cache_misses_total'), ratio = num('floe_expert_cache_hit_ratio');
    check(misses > 0 && hits >= 0 && Math.abs(ratio - hits / (hits + misses)) < 1e-5 && num('floe_expert_bytes_read_total') > 0,
      '--mem-budget: expert cache hits / misses / ratio / bytes in /metrics', { hits, misses, ratio });
    eq(await ms.stop(), { code: 0, signal: null }, 'streaming server exits 0');
    const ks = await startServer(model, ['--api-key', 'sekret']);
    await waitHealthy(ks);
    await expectError(client(ks, { apiKey: 'wrong' }).chat.completions.create({ model: models.randomId, messages: msgs, max_tokens: 1 }),
      AuthenticationError, 401, 'wrong API key -> 401');
    const ok = await client(ks, { apiKey: 'sekret' }).chat.completions.create({ model: models.randomId, messages: msgs, max_tokens: 1 });
    check(ok.choices.length === 1, 'right API key accepted');
    const h = await fetch(ks.url + '/health');
    eq(h.status, 200, '/health needs no key');
    eq(await ks.stop(), { code: 0, signal: null }, 'api-key server exits 0');
  });
  await section('loading', async () => {
    // the model path is a FIFO: loading blocks until we write to it, so the server is bound but not ready
    const fifo = path.join(path.dirname(model), 'loading.fifo');
    execFileSync('mkfifo', [fifo]);
    const ls = await startServer(fifo);
    const h = await fetch(ls.url + '/health');
    const hj = await h.json();
    check(h.status === 503 && hj.error && /loading/i.test(hj.error.message), '/health 503 while the model loads', [h.status, hj]);
    const r = await fetch(ls.url + '/v1/chat/completions', { method: 'POST', body: JSON.stringify({ messages: msgs }) });
    check(r.status === 503 && r.headers.get('retry-after'), 'chat 503 with Retry-After while loading', r.status);
    const m = await fetch(ls.url + '/v1/models');
    eq(m.status, 200, '/v1/models answers while loading');
    try {
      const fd = fs.openSync(fifo, fs.constants.O_WRONLY | fs.constants.O_NONBLOCK); // never blocks
      try { fs.writeSync(fd, 'not a model'); } catch { /* the loader may have given up already (EPIPE) */ }
      fs.closeSync(fd);
    } catch { /* idem */ }
    const ex = await ls.exited;
    check(ex.code === 1 && /cannot load/.test(ls.log()), 'a model that fails to load: message and exit 1', [ex, ls.log()]);
    fs.rmSync(fifo);
  });
  return s;
}
