// The official OpenAI Node client (the version locked in package-lock.json)
// against `servelab serve` on stories260K: completions and chat, streaming
// and not. Starts its own server on a free loopback port (--port 0) and
// stops it; exits non-zero on the first failed check.
//
//   node tests/serve/openai_client.mjs   (SERVELAB_BIN, SERVELAB_MODEL from the environment)
import { spawn } from 'node:child_process';
import assert from 'node:assert/strict';
import OpenAI from 'openai';
import { VERSION } from 'openai/version';

const bin = process.env.SERVELAB_BIN || 'bin/servelab';
const model = process.env.SERVELAB_MODEL || '../shared/models/stories260K.bin';
const log = (...args) => console.log(...args);

function startServer() {
  return new Promise((resolve, reject) => {
    const child = spawn(bin, ['serve', '--port', '0', '--model', model, '--kv-dtype', 'fp32'],
                        { stdio: ['ignore', 'pipe', 'inherit'] });
    let out = '';
    const timer = setTimeout(() => reject(new Error(`no port line from ${bin} serve within 60 s: ${out}`)), 60000);
    child.stdout.on('data', (data) => {
      out += data;
      const match = out.match(/127\.0\.0\.1:(\d+)/);
      if (match) {
        clearTimeout(timer);
        log(out.trim());
        resolve({ child, port: Number(match[1]) });
      }
    });
    child.on('exit', (code) => reject(new Error(`serve exited with ${code} before listening: ${out}`)));
  });
}

const { child, port } = await startServer();
const stopServer = () => new Promise((resolve) => {
  child.removeAllListeners('exit');
  child.on('exit', (code, signal) => resolve({ code, signal }));
  child.kill('SIGTERM');
});
const watchdog = setTimeout(() => { child.kill('SIGKILL'); console.error('FAIL: timed out'); process.exit(1); }, 120000);

const client = new OpenAI({ baseURL: `http://127.0.0.1:${port}/v1`, apiKey: 'not-needed', maxRetries: 0, timeout: 60000 });
let failed = false;
try {
  log(`openai-node ${VERSION} -> http://127.0.0.1:${port}/v1`);

  const models = await client.models.list();
  assert.equal(models.data[0].id, 'stories260K');
  log(`models.list: ${models.data.map((m) => m.id).join(', ')}`);

  // Completions, not streaming.
  const completion = await client.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 24, temperature: 0,
  });
  assert.match(completion.id, /^cmpl-/);
  assert.equal(completion.object, 'text_completion');
  assert.equal(completion.choices[0].finish_reason, 'length');
  assert.equal(completion.usage.completion_tokens, 24);
  assert.equal(completion.usage.prompt_tokens, 5);
  log(`completions.create: ${JSON.stringify(completion.choices[0].text)} (${completion.usage.completion_tokens} tokens, finish ${completion.choices[0].finish_reason})`);

  // Completions, streaming: the same text as the non-streamed one (greedy).
  log('completions.create stream:');
  const stream = await client.completions.create({
    model: 'stories260K', prompt: 'Once upon a time', max_tokens: 24, temperature: 0, stream: true,
    stream_options: { include_usage: true },
  });
  let streamed = '';
  let finish = null;
  let usage = null;
  let chunks = 0;
  for await (const chunk of stream) {
    chunks++;
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      streamed += choice.text;
      if (choice.finish_reason) finish = choice.finish_reason;
      log(`  chunk ${String(chunks).padStart(2)}: text=${JSON.stringify(choice.text)} finish_reason=${choice.finish_reason}`);
    }
    if (chunk.usage) log(`  chunk ${String(chunks).padStart(2)}: usage=${JSON.stringify(chunk.usage)}`);
  }
  assert.equal(streamed, completion.choices[0].text);
  assert.equal(finish, 'length');
  assert.equal(usage.completion_tokens, 24);
  log(`  streamed text equals the non-streamed text: ${JSON.stringify(streamed)}`);

  // Chat, not streaming.
  const chat = await client.chat.completions.create({
    model: 'stories260K', messages: [{ role: 'user', content: 'Tell me a story about a cat.' }],
    max_tokens: 32, temperature: 0,
  });
  assert.equal(chat.object, 'chat.completion');
  assert.equal(chat.choices[0].message.role, 'assistant');
  assert.ok(chat.choices[0].message.content.length > 0);
  log(`chat.completions.create: ${JSON.stringify(chat.choices[0].message.content)} (finish ${chat.choices[0].finish_reason})`);

  // Chat, streaming, with a stop string.
  log('chat.completions.create stream:');
  const chatStream = await client.chat.completions.create({
    model: 'stories260K', messages: [{ role: 'user', content: 'Tell me a story about a cat.' }],
    max_tokens: 32, temperature: 0, stream: true,
  });
  let chatText = '';
  let role = null;
  for await (const chunk of chatStream) {
    const delta = chunk.choices[0]?.delta ?? {};
    if (delta.role) role = delta.role;
    chatText += delta.content ?? '';
    log(`  delta=${JSON.stringify(delta)} finish_reason=${chunk.choices[0]?.finish_reason}`);
  }
  assert.equal(role, 'assistant');
  assert.equal(chatText, chat.choices[0].message.content);

  // Sampling with a seed is repeatable; n = 2 gives two choices.
  const sampled = await client.completions.create({
    model: 'stories260K', prompt: 'The dog', max_tokens: 16, temperature: 0.8, top_p: 0.9, seed: 3, n: 2,
  });
  const again = await client.completions.create({
    model: 'stories260K', prompt: 'The dog', max_tokens: 16, temperature: 0.8, top_p: 0.9, seed: 3, n: 2,
  });
  assert.equal(sampled.choices.length, 2);
  assert.deepEqual(sampled.choices.map((c) => c.text), again.choices.map((c) => c.text));
  log(`n=2 seed=3: ${JSON.stringify(sampled.choices.map((c) => c.text))}`);

  // Errors arrive as the client's typed errors, with the server's message.
  try {
    await client.completions.create({ model: 'stories260K', prompt: 'Hi', temperature: -1 });
    assert.fail('a negative temperature was accepted');
  } catch (error) {
    assert.ok(error instanceof OpenAI.BadRequestError, `expected BadRequestError, got ${error}`);
    assert.equal(error.status, 400);
    assert.equal(error.param, 'temperature');
    log(`negative temperature -> ${error.constructor.name}: ${error.message}`);
  }
  try {
    await client.completions.create({ model: 'gpt-4', prompt: 'Hi' });
    assert.fail('an unknown model was accepted');
  } catch (error) {
    assert.ok(error instanceof OpenAI.NotFoundError, `expected NotFoundError, got ${error}`);
    log(`unknown model -> ${error.constructor.name}: ${error.message}`);
  }
  log('PASS: the official OpenAI client, completions and chat, streaming and not');
} catch (error) {
  failed = true;
  console.error(`FAIL: ${error.stack || error}`);
} finally {
  clearTimeout(watchdog);
  const { code, signal } = await stopServer();
  if (code !== 0) {
    failed = true;
    console.error(`FAIL: serve exited with code ${code} signal ${signal}`);
  }
}
process.exit(failed ? 1 : 0);
