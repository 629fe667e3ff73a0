// Tool calls and reasoning end to end: scripted models (tools/floe_script_model.c) whose greedy
// output is a fixed text chosen by a trigger token in the prompt, served by floe serve and read by
// the openai client.
import OpenAI from 'openai';

import { check, eq, section, startServer, waitHealthy } from './lib.mjs';

// Triggers are special tokens that the chat templates never emit on their own.
const Q3_CALL = '{"name": "get_weather", "arguments": {"city": "Paris", "days": 3}}';
export const SCRIPTS = {
  qwen3moe: [
    ['<tool_response>', '<think>\\nThe tool answered.\\n</think>\\n\\nIt is sunny in Paris.'],
    ['<|box_start|>', `<think>\\nThe user wants the weather.\\n</think>\\n\\n<tool_call>\\n${Q3_CALL}\\n</tool_call>`],
    ['<|quad_start|>', '<think>\\nLet me think.\\n</think>\\n\\nHello! How can I help?'],
    ['<|vision_start|>', '<tool_call>\\n{name: get_weather}\\n</tool_call>'],
    ['<|object_ref_start|>', '<tool_call>\\n{"name": "get_weather", "arguments": {"city": "Rome"}}\\n</tool_call>\\n<tool_call>\\n{"name": "get_time", "arguments": {}}\\n</tool_call>'],
  ],
  qwen35moe: [
    ['<tool_response>', 'The tool answered.\\n</think>\\n\\nIt is sunny in Paris.'],
    ['<|box_start|>', 'The user wants the weather.\\n</think>\\n\\n<tool_call>\\n<function=get_weather>\\n<parameter=city>\\nParis\\n</parameter>\\n' +
      '<parameter=days>\\n3\\n</parameter>\\n<parameter=metric>\\ntrue\\n</parameter>\\n<parameter=options>\\n{"unit": "C", "hourly": [1, 2]}\\n</parameter>\\n' +
      '<parameter=note>\\n42\\n</parameter>\\n</function>\\n</tool_call>'],
    ['<|quad_start|>', 'Let me think.\\n</think>\\n\\nHello! How can I help?'],
    ['<|vision_start|>', 'Hmm.\\n</think>\\n\\n<tool_call>\\n<function get_weather>\\n</tool_call>'],
  ],
};

const TOOLS = [
  {
    type: 'function',
    function: {
      name: 'get_weather',
      description: 'Weather forecast for a city',
      parameters: {
        type: 'object',
        properties: {
          city: { type: 'string' }, days: { type: 'integer' }, metric: { type: 'boolean' },
          options: { type: 'object' }, note: { type: 'string' },
        },
        required: ['city'],
      },
    },
  },
  { type: 'function', function: { name: 'get_time', description: 'Current time', parameters: { type: 'object', properties: {} } } },
];

const EXPECT_ARGS = {
  qwen3moe: { city: 'Paris', days: 3 },
  qwen35moe: { city: 'Paris', days: 3, metric: true, options: { unit: 'C', hourly: [1, 2] }, note: '42' },
};

async function collect(stream) {
  const out = { content: '', reasoning: '', calls: [], finish: null, order: [] };
  for await (const c of stream) {
    const ch = c.choices[0];
    if (!ch) continue;
    const d = ch.delta || {};
    if (d.content) { out.content += d.content; out.order.push('c'); }
    if (d.reasoning_content) { out.reasoning += d.reasoning_content; out.order.push('r'); }
    for (const tc of d.tool_calls || []) {
      const slot = out.calls[tc.index] || (out.calls[tc.index] = { id: '', name: '', args: '', fragments: 0 });
      if (tc.id) slot.id = tc.id;
      if (tc.function && tc.function.name) slot.name += tc.function.name;
      if (tc.function && tc.function.arguments) { slot.args += tc.function.arguments; slot.fragments++; }
      out.order.push('t');
    }
    if (ch.finish_reason) out.finish = ch.finish_reason;
  }
  return out;
}

const parse = (s) => { try { return JSON.parse(s); } catch { return undefined; } };

export async function toolTests(arch, model, id) {
  const s = await startServer(model, ['-c', '2048']);
  check(await waitHealthy(s), `${arch}: server healthy`);
  const oa = new OpenAI({ baseURL: s.url + '/v1', apiKey: 'x', maxRetries: 0, timeout: 60000 });
  const user = { role: 'user', content: 'What is the weather in Paris? <|box_start|>' };
  const want = EXPECT_ARGS[arch];

  await section(`${arch}: tool call`, async () => {
    const r = await oa.chat.completions.create({ model: id, messages: [user], tools: TOOLS, max_tokens: 200 });
    const m = r.choices[0].message;
    eq(r.choices[0].finish_reason, 'tool_calls', 'finish_reason tool_calls');
    check(m.content === null, 'content is null', m);
    check(Array.isArray(m.tool_calls) && m.tool_calls.length === 1, 'one tool call', m);
    const tc = m.tool_calls && m.tool_calls[0];
    if (tc) {
      check(tc.type === 'function' && /^call_[A-Za-z0-9]{24}$/.test(tc.id), 'type function, call_ id', tc);
      eq(tc.function.name, 'get_weather', 'function name');
      eq(parse(tc.function.arguments), want, 'arguments (typed by the schema)');
    }
    eq(m.reasoning_content, 'The user wants the weather.', 'reasoning_content');
    check(r.usage.completion_tokens_details.reasoning_tokens > 0, 'reasoning_tokens counted', r.usage);

    const st = await collect(await oa.chat.completions.create({ model: id, messages: [user], tools: TOOLS, max_tokens: 200, stream: true }));
    eq(st.finish, 'tool_calls', 'stream: finish_reason tool_calls');
    check(st.calls.length === 1 && st.calls[0].name === 'get_weather' && /^call_/.test(st.calls[0].id), 'stream: one call with id and name', st.calls);
    eq(parse(st.calls[0] && st.calls[0].args), want, 'stream: arguments');
    check(st.calls[0] && st.calls[0].fragments > 1, 'stream: arguments arrive in several fragments', st.calls[0]);
    eq(st.reasoning, 'The user wants the weather.', 'stream: reasoning_content');
    eq(st.content, '', 'stream: no content');

    // the client sends the tool result back
    const hist = [user, { role: 'assistant', content: m.content, reasoning_content: m.reasoning_content, tool_calls: m.tool_calls },
      { role: 'tool', tool_call_id: tc ? tc.id : 'x', content: '{"sky": "sunny", "temp": 25}' }];
    const r2 = await oa.chat.completions.create({ model: id, messages: hist, tools: TOOLS, max_tokens: 200 });
    eq(r2.choices[0].message.content, 'It is sunny in Paris.', 'after the tool result: the answer');
    eq(r2.choices[0].message.reasoning_content, 'The tool answered.', 'after the tool result: reasoning');
    eq(r2.choices[0].finish_reason, 'stop', 'after the tool result: finish stop');
    check(r2.usage.prompt_tokens_details.cached_tokens > 50, 'the tool-call turn is reused from the cache (sampled text replayed by call id)', r2.usage);
    const none = await oa.chat.completions.create({ model: id, messages: [user], tools: TOOLS, tool_choice: 'none', max_tokens: 200 });
    check(!none.choices[0].message.tool_calls && none.choices[0].message.content.includes('<tool_call>'), 'tool_choice none: raw text, no parsing', none.choices[0].message);
  });

  await section(`${arch}: reasoning`, async () => {
    const msgs = [{ role: 'system', content: 'Be nice.' }, { role: 'user', content: 'Hi <|quad_start|>' }];
    const r = await oa.chat.completions.create({ model: id, messages: msgs, max_tokens: 100 });
    eq([r.choices[0].message.reasoning_content, r.choices[0].message.content], ['Let me think.', 'Hello! How can I help?'], '<think> block -> reasoning_content');
    const st = await collect(await oa.chat.completions.create({ model: id, messages: msgs, max_tokens: 100, stream: true }));
    eq([st.reasoning, st.content], ['Let me think.', 'Hello! How can I help?'], 'stream: reasoning split at the tags');
    const firstC = st.order.indexOf('c'), lastR = st.order.lastIndexOf('r');
    check(firstC > lastR && lastR >= 0, 'stream: all reasoning before the content', st.order.join(''));
    const dev = await oa.chat.completions.create({ model: id, messages: [{ role: 'developer', content: 'Be nice.' }, msgs[1]], max_tokens: 100 });
    eq(dev.choices[0].message.content, 'Hello! How can I help?', 'developer role accepted (as system)');
  });

  await section(`${arch}: prefix cache when the template drops the old <think> block`, async () => {
    const u = [{ role: 'system', content: 'Be nice.' }, { role: 'user', content: 'Hello there <|quad_start|>' }];
    const r1 = await oa.chat.completions.create({ model: id, messages: u, max_tokens: 100 });
    const m = r1.choices[0].message;
    const hist = [...u, { role: 'assistant', content: m.content, reasoning_content: m.reasoning_content }, { role: 'user', content: 'Again <|quad_start|>' }];
    const r2 = await oa.chat.completions.create({ model: id, messages: hist, max_tokens: 100 });
    const c = r2.usage.prompt_tokens_details.cached_tokens, n1 = r1.usage.prompt_tokens;
    // attention: up to the divergence; hybrid: the checkpoint before "<|im_start|>assistant\n<think>\n"
    check(c >= n1 - 16 && c <= n1 && (arch !== 'qwen3moe' || c >= n1 - 1), `the previous prompt is reused up to the re-rendered reply (cached ${c}, first prompt ${n1})`);
    eq([r2.choices[0].message.reasoning_content, r2.choices[0].message.content], ['Let me think.', 'Hello! How can I help?'], 'same scripted reply');
  });

  await section(`${arch}: malformed and parallel calls`, async () => {
    const bad = { role: 'user', content: 'Break it <|vision_start|>' };
    const r = await oa.chat.completions.create({ model: id, messages: [bad], tools: TOOLS, max_tokens: 100 });
    const m = r.choices[0].message;
    check(!m.tool_calls && typeof m.content === 'string' && m.content.includes('<tool_call>') && m.content.includes('get_weather'),
      'a malformed call comes back as content', m);
    eq(r.choices[0].finish_reason, 'stop', 'malformed: finish_reason stop');
    const st = await collect(await oa.chat.completions.create({ model: id, messages: [bad], tools: TOOLS, max_tokens: 100, stream: true }));
    check(st.calls.length === 0 && st.content === m.content, 'stream: malformed call as content', st);
    if (arch === 'qwen3moe') {
      const two = { role: 'user', content: 'Two things <|object_ref_start|>' };
      const p = await oa.chat.completions.create({ model: id, messages: [two], tools: TOOLS, max_tokens: 100 });
      const calls = p.choices[0].message.tool_calls || [];
      eq(calls.map((c) => [c.function.name, parse(c.function.arguments)]), [['get_weather', { city: 'Rome' }], ['get_time', {}]], 'two parallel calls');
      check(calls.length === 2 && calls[0].id !== calls[1].id, 'distinct call ids');
      const ps = await collect(await oa.chat.completions.create({ model: id, messages: [two], tools: TOOLS, max_tokens: 100, stream: true }));
      eq(ps.calls.map((c) => [c.name, parse(c.args)]), [['get_weather', { city: 'Rome' }], ['get_time', {}]], 'stream: two calls by index');
      eq(p.choices[0].message.content, null, 'parallel calls: no content (whitespace between calls dropped)');
    }
  });
  const code = await s.stop();
  eq(code, { code: 0, signal: null }, `${arch}: server exits 0 on SIGTERM`);
}
