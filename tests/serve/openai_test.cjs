// openai_test.cjs URL NPM_PREFIX — the official `openai` npm client against tern serve:
// models.list, chat (non-streaming and streaming with usage), completions (both), n=2 with logprobs
// and penalties (both), an API error.
const path = require('path');
const OpenAI = require(path.resolve(process.argv[3], 'node_modules', 'openai'));
const Ctor = OpenAI.default || OpenAI.OpenAI || OpenAI;
const client = new Ctor({ baseURL: process.argv[2] + '/v1', apiKey: 'sekrit', maxRetries: 0, timeout: 60000 });
let fails = 0;
const ok = (c, m) => { if (c) console.log('ok: ' + m); else { fails++; console.log('FAIL: ' + m); } };

(async () => {
  const models = await client.models.list();
  const ids = [];
  for await (const m of models) ids.push(m.id);
  ok(ids.length === 1, 'models.list -> ' + ids.join(','));

  const chat = await client.chat.completions.create({
    model: ids[0], messages: [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello' }],
    max_tokens: 8, temperature: 0 });
  ok(chat.object === 'chat.completion' && typeof chat.choices[0].message.content === 'string' &&
     chat.usage.completion_tokens === 8 && chat.choices[0].finish_reason === 'length', 'chat non-streaming');

  const stream = await client.chat.completions.create({
    model: ids[0], messages: [{ role: 'user', content: 'hello' }], max_tokens: 8, temperature: 0,
    stream: true, stream_options: { include_usage: true } });
  let text = '', usage = null, finish = null, n = 0;
  for await (const ch of stream) {
    n++;
    if (ch.usage) usage = ch.usage;
    if (ch.choices.length) {
      text += ch.choices[0].delta.content || '';
      if (ch.choices[0].finish_reason) finish = ch.choices[0].finish_reason;
    }
  }
  ok(n >= 3 && usage && usage.completion_tokens === 8 && finish === 'length', `chat streaming (${n} chunks)`);
  ok(text === chat.choices[0].message.content, 'streamed text == non-streamed text (greedy)');

  const comp = await client.completions.create({ model: ids[0], prompt: 'once upon a time', max_tokens: 6, temperature: 0 });
  ok(comp.object === 'text_completion' && comp.usage.completion_tokens === 6, 'completions non-streaming');
  const cs = await client.completions.create({ model: ids[0], prompt: 'once upon a time', max_tokens: 6, temperature: 0, stream: true });
  let ctext = '';
  for await (const ch of cs) ctext += ch.choices[0].text || '';
  ok(ctext === comp.choices[0].text, 'completions streaming == non-streaming');

  const multi = await client.chat.completions.create({
    model: ids[0], messages: [{ role: 'user', content: 'hello' }], max_tokens: 5, temperature: 0.9, seed: 4, n: 2,
    logprobs: true, top_logprobs: 3, presence_penalty: 0.5 });
  ok(multi.choices.length === 2 && multi.choices.every((c, i) => c.index === i && c.logprobs.content.length === 5 &&
     c.logprobs.content.every((e) => e.logprob <= 0 && e.top_logprobs.length === 3)) && multi.usage.completion_tokens === 10,
     'chat n=2 with logprobs, top_logprobs and presence_penalty');
  const ms = await client.chat.completions.create({
    model: ids[0], messages: [{ role: 'user', content: 'hello' }], max_tokens: 5, temperature: 0.9, seed: 4, n: 2,
    logprobs: true, top_logprobs: 3, presence_penalty: 0.5, stream: true });
  const parts = ['', ''];
  for await (const ch of ms) for (const c of ch.choices) parts[c.index] += c.delta.content || '';
  ok(parts[0] === multi.choices[0].message.content && parts[1] === multi.choices[1].message.content,
     'streamed n=2 (seeded) == non-streamed, per choice index');
  const lc = await client.completions.create({ model: ids[0], prompt: 'once upon a time', max_tokens: 4, temperature: 0, logprobs: 2 });
  ok(lc.choices[0].logprobs.tokens.length === 4 && lc.choices[0].logprobs.text_offset.length === 4, 'completions logprobs');

  try {
    await client.chat.completions.create({ model: ids[0], messages: [], max_tokens: 4 });
    ok(false, 'empty messages should fail');
  } catch (e) {
    ok(e.status === 400 && e.error && e.error.type === 'invalid_request_error', 'API error 400 surfaces as APIError: ' + e.message);
  }
  try {
    const bad = new Ctor({ baseURL: process.argv[2] + '/v1', apiKey: 'wrong', maxRetries: 0 });
    await bad.models.list();
    ok(false, 'wrong key should fail');
  } catch (e) {
    ok(e.status === 401, 'wrong key -> 401 AuthenticationError');
  }
  console.log(fails ? `${fails} failure(s)` : 'all passed');
  process.exit(fails ? 1 : 0);
})().catch((e) => { console.log('FAIL: ' + (e.stack || e)); process.exit(1); });
