// The Responses API (official openai client) and the Anthropic Messages API (official
// @anthropic-ai/sdk) against floe serve with the scripted models of tools.mjs: tool calls (Qwen3
// JSON and Qwen3.5 XML) streamed and not, the tool result sent back, reasoning, limits, errors in
// each API's shape, auth. Also /health once the model file shrank under the server, and --direct.
import fs from 'node:fs';
import path from 'node:path';

import Anthropic from '@anthropic-ai/sdk';
import OpenAI from 'openai';

import { check, eq, expectError, postJson, section, startServer, waitHealthy } from './lib.mjs';

const SCHEMA = {
  type: 'object',
  properties: { city: { type: 'string' }, days: { type: 'integer' }, metric: { type: 'boolean' }, options: { type: 'object' }, note: { type: 'string' } },
  required: ['city'],
};
const RTOOLS = [
  { type: 'function', name: 'get_weather', description: 'Weather forecast for a city', parameters: SCHEMA, strict: false },
  { type: 'web_search' }, // a hosted tool: skipped
];
const ATOOLS = [{ name: 'get_weather', description: 'Weather forecast for a city', input_schema: SCHEMA }];
const WANT = {
  qwen3moe: { city: 'Paris', days: 3 },
  qwen35moe: { city: 'Paris', days: 3, metric: true, options: { unit: 'C', hourly: [1, 2] }, note: '42' },
};
const ASK = 'What is the weather in Paris? <|box_start|>';
const parse = (s) => { try { return JSON.parse(s); } catch { return undefined; } };

async function responsesTests(arch, s, id) {
  const oa = new OpenAI({ baseURL: s.url + '/v1', apiKey: 'secret', maxRetries: 0, timeout: 60000 });
  const want = WANT[arch];
  await section(`${arch}: responses: tool call, then the tool result`, async () => {
    const r = await oa.responses.create({ model: id, input: ASK, instructions: 'Be brief.', tools: RTOOLS, max_output_tokens: 200 });
    eq(r.output.map((o) => o.type), ['reasoning', 'function_call'], 'output items: reasoning, function_call');
    eq(r.status, 'completed', 'status completed');
    const fc = r.output.find((o) => o.type === 'function_call');
    check(fc && fc.name === 'get_weather' && /^call_[A-Za-z0-9]{24}$/.test(fc.call_id) && /^fc_/.test(fc.id), 'function_call: name, call_id, id', fc);
    eq(parse(fc && fc.arguments), want, 'function_call arguments (typed by the schema)');
    const rs = r.output.find((o) => o.type === 'reasoning');
    eq(rs && rs.content && rs.content[0].text, 'The user wants the weather.', 'reasoning item text');
    check(r.usage.output_tokens_details.reasoning_tokens > 0 && r.usage.input_tokens > 0, 'usage with reasoning tokens', r.usage);
    eq(r.instructions, 'Be brief.', 'instructions echoed');

    const input = [{ role: 'user', content: ASK }, ...r.output, { type: 'function_call_output', call_id: fc ? fc.call_id : 'x', output: '{"sky": "sunny"}' }];
    const r2 = await oa.responses.create({ model: id, input, instructions: 'Be brief.', tools: RTOOLS, max_output_tokens: 200 });
    eq(r2.output_text, 'It is sunny in Paris.', 'after the tool result: the answer (output_text)');
    eq(r2.output.map((o) => o.type), ['reasoning', 'message'], 'after the tool result: reasoning, message');
    check(r2.usage.input_tokens_details.cached_tokens > 50, 'the tool-call turn is reused from the cache (replayed by call_id)', r2.usage);

    const none = await oa.responses.create({ model: id, input: ASK, tools: RTOOLS, tool_choice: 'none', max_output_tokens: 200 });
    check(!none.output.some((o) => o.type === 'function_call') && none.output_text.includes('<tool_call>'), 'tool_choice none: raw text', none.output);
  });

  await section(`${arch}: responses: streaming`, async () => {
    const st = oa.responses.stream({ model: id, input: ASK, tools: RTOOLS, max_output_tokens: 200 });
    const types = [], seqs = [];
    let argDeltas = 0, args = '';
    for await (const ev of st) {
      types.push(ev.type);
      seqs.push(ev.sequence_number);
      if (ev.type === 'response.function_call_arguments.delta') { argDeltas++; args += ev.delta; }
    }
    const fin = await st.finalResponse();
    eq(types[0], 'response.created', 'first event response.created');
    eq(types[types.length - 1], 'response.completed', 'last event response.completed');
    check(seqs.every((v, i) => v === i), 'sequence numbers 0, 1, 2, ...', seqs.slice(0, 20));
    for (const t of ['response.in_progress', 'response.output_item.added', 'response.content_part.added', 'response.reasoning_text.delta',
      'response.reasoning_text.done', 'response.function_call_arguments.done', 'response.output_item.done'])
      check(types.includes(t), `event ${t}`);
    check(argDeltas > 1, 'arguments arrive in several deltas', argDeltas);
    eq(parse(args), want, 'streamed arguments');
    const fc = fin.output.find((o) => o.type === 'function_call');
    eq(parse(fc && fc.arguments), want, 'finalResponse: the SDK accumulated the same call');

    const chat = oa.responses.stream({ model: id, input: [{ role: 'developer', content: 'Be nice.' }, { role: 'user', content: 'Hi <|quad_start|>' }], max_output_tokens: 100 });
    let text = '';
    for await (const ev of chat) if (ev.type === 'response.output_text.delta') text += ev.delta;
    const f2 = await chat.finalResponse();
    const msg = f2.output.find((o) => o.type === 'message');
    eq([text, msg && msg.content[0].text], ['Hello! How can I help?', 'Hello! How can I help?'], 'stream: output_text deltas and final message');
    eq(f2.output[0].content[0].text, 'Let me think.', 'stream: reasoning item');
  });

  await section(`${arch}: responses: limits and errors`, async () => {
    const r = await oa.responses.create({ model: id, input: 'Hi <|quad_start|>', max_output_tokens: 3 });
    eq([r.status, r.incomplete_details && r.incomplete_details.reason], ['incomplete', 'max_output_tokens'], 'max_output_tokens: incomplete');
    eq(r.usage.output_tokens, 3, 'max_output_tokens: 3 tokens');
    await expectError(oa.responses.create({ model: id, input: 'Hi', previous_response_id: 'resp_123' }), OpenAI.BadRequestError, 400,
      'previous_response_id refused with 400', 'unsupported_parameter');
    await expectError(oa.responses.create({ model: id, input: [{ type: 'item_reference', id: 'x' }] }), OpenAI.BadRequestError, 400, 'item_reference refused');
    await expectError(oa.responses.create({ model: id, input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }] }),
      OpenAI.BadRequestError, 400, 'image input refused');
    await expectError(oa.responses.create({ model: 'other', input: 'Hi' }), OpenAI.NotFoundError, 404, 'unknown model: 404');
  });
}

async function messagesTests(arch, s, id) {
  const an = new Anthropic({ baseURL: s.url, apiKey: 'secret', maxRetries: 0, timeout: 60000 });
  const want = WANT[arch];
  await section(`${arch}: messages: tool use, then the tool result`, async () => {
    const m = await an.messages.create({ model: id, max_tokens: 200, system: 'Be brief.', messages: [{ role: 'user', content: ASK }], tools: ATOOLS });
    eq(m.stop_reason, 'tool_use', 'stop_reason tool_use');
    eq(m.content.map((b) => b.type), ['thinking', 'tool_use'], 'content: thinking, tool_use');
    const tu = m.content.find((b) => b.type === 'tool_use');
    eq(tu && tu.input, want, 'tool_use input (typed by the schema)');
    eq(m.content[0].thinking, 'The user wants the weather.', 'thinking block');
    check(m.usage.input_tokens > 0 && m.usage.output_tokens > 0, 'usage', m.usage);

    const msgs = [{ role: 'user', content: ASK }, { role: 'assistant', content: m.content },
      { role: 'user', content: [{ type: 'tool_result', tool_use_id: tu ? tu.id : 'x', content: [{ type: 'text', text: '{"sky": "sunny"}' }] }] }];
    const m2 = await an.messages.create({ model: id, max_tokens: 200, system: 'Be brief.', messages: msgs, tools: ATOOLS });
    eq(m2.content.filter((b) => b.type === 'text').map((b) => b.text), ['It is sunny in Paris.'], 'after the tool result: the answer');
    eq(m2.stop_reason, 'end_turn', 'stop_reason end_turn');
    check(m2.usage.cache_read_input_tokens > 50, 'the tool-use turn is reused from the cache (cache_read_input_tokens)', m2.usage);
    const ct = await an.messages.countTokens({ model: id, system: 'Be brief.', messages: msgs, tools: ATOOLS });
    eq(ct.input_tokens, m2.usage.input_tokens + m2.usage.cache_read_input_tokens, 'count_tokens = the prompt the request used');
    // an empty system prompt is no system prompt (it leaked its buffer once: the ASan run checks)
    const c0 = await an.messages.countTokens({ model: id, system: '', messages: msgs, tools: ATOOLS });
    const c1 = await an.messages.countTokens({ model: id, messages: msgs, tools: ATOOLS });
    eq(c0.input_tokens, c1.input_tokens, 'count_tokens: system "" = no system prompt');
  });

  await section(`${arch}: messages: streaming`, async () => {
    const st = an.messages.stream({ model: id, max_tokens: 200, messages: [{ role: 'user', content: ASK }], tools: ATOOLS });
    const types = [];
    let partial = 0;
    st.on('streamEvent', (ev) => types.push(ev.type));
    st.on('inputJson', () => { partial++; });
    const fin = await st.finalMessage();
    eq(types[0], 'message_start', 'first event message_start');
    eq(types[types.length - 1], 'message_stop', 'last event message_stop');
    for (const t of ['content_block_start', 'content_block_delta', 'content_block_stop', 'message_delta']) check(types.includes(t), `event ${t}`);
    check(partial > 1, 'input_json_delta in several pieces', partial);
    eq(fin.stop_reason, 'tool_use', 'stream: stop_reason tool_use');
    const tu = fin.content.find((b) => b.type === 'tool_use');
    eq(tu && tu.input, want, 'stream: the SDK assembled the tool input');
    eq(fin.content[0].type === 'thinking' && fin.content[0].thinking, 'The user wants the weather.', 'stream: thinking block');

    const hi = an.messages.stream({ model: id, max_tokens: 100, messages: [{ role: 'user', content: 'Hi <|quad_start|>' }] });
    let text = '';
    hi.on('text', (t) => { text += t; });
    const f2 = await hi.finalMessage();
    eq([text, f2.stop_reason], ['Hello! How can I help?', 'end_turn'], 'stream: text deltas, end_turn');
  });

  await section(`${arch}: messages: stop sequences, errors, auth`, async () => {
    const m = await an.messages.create({ model: id, max_tokens: 100, stop_sequences: ['How'], messages: [{ role: 'user', content: 'Hi <|quad_start|>' }] });
    eq([m.stop_reason, m.stop_sequence], ['stop_sequence', 'How'], 'stop_reason stop_sequence with the string');
    const mt = await an.messages.create({ model: id, max_tokens: 2, messages: [{ role: 'user', content: 'Hi <|quad_start|>' }] });
    eq(mt.stop_reason, 'max_tokens', 'stop_reason max_tokens');
    try {
      await an.messages.create({ model: id, max_tokens: 10, messages: [{ role: 'bot', content: 'Hi' }] });
      check(false, 'bad role refused');
    } catch (e) {
      check(e instanceof Anthropic.BadRequestError && e.error && e.error.type === 'error' && e.error.error.type === 'invalid_request_error',
        'bad role: 400 in Anthropic\'s error shape', { status: e.status, error: e.error });
    }
    const bad = new Anthropic({ baseURL: s.url, apiKey: 'wrong', maxRetries: 0 });
    try {
      await bad.messages.create({ model: id, max_tokens: 10, messages: [{ role: 'user', content: 'Hi' }] });
      check(false, 'wrong x-api-key refused');
    } catch (e) {
      check(e instanceof Anthropic.AuthenticationError && e.error && e.error.error && e.error.error.type === 'authentication_error',
        'wrong x-api-key: 401 authentication_error', { status: e.status, error: e.error });
    }
    const bearer = new Anthropic({ baseURL: s.url, apiKey: null, authToken: 'secret', maxRetries: 0 });
    const b = await bearer.messages.create({ model: id, max_tokens: 100, messages: [{ role: 'user', content: 'Hi <|quad_start|>' }] });
    eq(b.content.filter((x) => x.type === 'text').map((x) => x.text), ['Hello! How can I help?'], 'Bearer auth accepted');
    const r = await postJson(s.url + '/v1/messages', { max_tokens: 100, messages: [{ role: 'user', content: 'Hi <|quad_start|>' }] },
      { 'x-api-key': 'secret', 'anthropic-version': '2023-06-01', 'anthropic-beta': 'whatever' });
    eq([r.status, r.json && r.json.type], [200, 'message'], 'anthropic-version / anthropic-beta headers accepted');
    const raw = await postJson(s.url + '/v1/messages', { stream: true, max_tokens: 100, messages: [{ role: 'user', content: 'Hi <|quad_start|>' }] },
      { 'x-api-key': 'secret' });
    const names = [...raw.text.matchAll(/^event: (\S+)$/gm)].map((x) => x[1]);
    eq(names.slice(0, 3), ['message_start', 'ping', 'content_block_start'], 'raw stream: message_start, ping, content_block_start');
    check(/^data: \{"type":"message_stop"\}$/m.test(raw.text), 'raw stream: named events with a data line each', raw.text.slice(-200));
    const nf = await postJson(s.url + '/v1/messages/nope', {}, { 'x-api-key': 'secret' });
    eq([nf.status, nf.json && nf.json.error && nf.json.error.type], [404, 'not_found_error'], 'unknown path under /v1/messages: Anthropic shape');
  });
}

export async function apiTests(arch, model, id) {
  const s = await startServer(model, ['-c', '4096', '--api-key', 'secret']);
  check(await waitHealthy(s), `${arch}: server healthy`);
  await responsesTests(arch, s, id);
  await messagesTests(arch, s, id);
  eq(await s.stop(), { code: 0, signal: null }, `${arch}: server exits 0 on SIGTERM`);
}

// /health reports an engine whose model file shrank (every request would fail) as unusable; and
// floe serve takes --direct like run and bench.
export async function healthTests(model, dir) {
  await section('health after the model file shrank; --direct', async () => {
    const copy = path.join(dir, 'shrinks.gguf');
    fs.copyFileSync(model, copy);
    const s = await startServer(copy, ['--mmap', '--direct']);
    check(await waitHealthy(s), 'server with --direct healthy');
    const ok = await postJson(s.url + '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    eq(ok.status, 200, 'a request succeeds before');
    fs.truncateSync(copy, 4096);
    const h = await fetch(s.url + '/health');
    const body = await h.json().catch(() => null);
    check(h.status === 503 && body && body.error.code === 'model_unusable' && /shrank/.test(body.error.message),
      '/health: 503 model_unusable with the reason', { status: h.status, body });
    const after = await postJson(s.url + '/v1/chat/completions', { messages: [{ role: 'user', content: 'hi' }], max_tokens: 2 });
    check(after.status >= 500 && /shrank/.test(after.text), 'requests fail with the same reason', after.text);
    eq(await s.stop(), { code: 0, signal: null }, 'server exits 0');
  });
}
