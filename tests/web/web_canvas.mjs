// tessera serve's web page in headless Chromium (puppeteer-core), run by web_canvas.sh against three
// servers of the bundled model: --keyed (with an API key), --open (none), --noweb (--no-web).
//  1. The routes: / is HTML, /web/app.js JavaScript, /web/x a 404, and --no-web has no page.
//  2. keyed: the page shows the server's "needs an API key" error until the key is typed; then a chat
//     message with 128 steps: a screenshot is taken while the canvas shows masks and text (checked in the
//     DOM before and after it, and as a PNG of the page's size), and the final text on the page equals the
//     answer of the same request (the body the page sent, greedy, not streamed) sent straight to the API.
//  3. open: the raw completion mode (the prompt shown as text, never as HTML), tokens rewritten by token
//     editing highlighted, the stop button, and a request the server refuses (its error message shown).
// The network is throttled while the page generates, so that the frames reach the page over a few seconds.
import assert from 'node:assert/strict';
import fs from 'node:fs';
import path from 'node:path';
import { parseArgs } from 'node:util';
import puppeteer from 'puppeteer-core';

const { values: arg } = parseArgs({
  options: {
    chromium: { type: 'string' }, out: { type: 'string' }, key: { type: 'string' },
    keyed: { type: 'string' }, open: { type: 'string' }, noweb: { type: 'string' },
  },
});
const VIEW = { width: 1200, height: 800 };
const t0 = Date.now();
const log = (m) => console.log(`[${((Date.now() - t0) / 1000).toFixed(1)} s] ${m}`);

async function checkRoutes() {
  const page = await fetch(arg.keyed + '/');
  assert.equal(page.status, 200);
  assert.equal(page.headers.get('content-type'), 'text/html; charset=utf-8');
  assert.match(await page.text(), /<script src="\/web\/app.js"/);
  const js = await fetch(arg.keyed + '/web/app.js');
  assert.equal(js.status, 200);
  assert.equal(js.headers.get('content-type'), 'text/javascript; charset=utf-8');
  const missing = await fetch(arg.keyed + '/web/x');
  assert.equal(missing.status, 404);
  assert.equal((await missing.json()).error.type, 'not_found_error');
  const none = await fetch(arg.noweb + '/');
  assert.equal(none.status, 404);
  assert.equal(none.headers.get('content-type'), 'application/json');
  log('routes: /, /web/app.js, /web/x (404), --no-web (404)');
}

// What the last assistant message shows: its state, and its live canvas's cells (installed in the page
// as window.lastAnswer by open()).
function lastAnswer() {
  const all = document.querySelectorAll('#messages .message.assistant');
  const m = all[all.length - 1];
  if (!m) return null;
  const canvas = m.querySelector('.canvas.live');
  return {
    state: m.dataset.state,
    text: m.querySelector('.text').textContent,
    masks: canvas ? canvas.querySelectorAll('.cell.mask').length : 0,
    tokens: canvas ? canvas.querySelectorAll('.cell.tok').length : 0,
    committed: canvas && canvas.querySelector('.committed') ? canvas.querySelector('.committed').textContent : '',
    boundary: canvas ? canvas.querySelectorAll('.boundary').length : 0,
    status: m.querySelector('.status') ? m.querySelector('.status').textContent : '',
    error: document.getElementById('error').hidden ? '' : document.getElementById('error').textContent,
  };
}

// A page at url with lastAnswer() and the errors it throws.
async function open(browser, url) {
  const page = await browser.newPage();
  await page.setViewport(VIEW);
  page.errors = [];
  page.on('pageerror', (e) => page.errors.push(e.message));
  await page.goto(url);
  await page.evaluate(`window.lastAnswer = ${lastAnswer}`);
  return page;
}

async function setField(page, selector, value) {
  await page.$eval(selector, (e) => { e.value = ''; });
  await page.type(selector, String(value));
}

// Sets the sampler's fields, types the message and sends it; returns the body the page posted.
async function ask(page, route, options, text) {
  for (const [name, value] of Object.entries(options)) {
    if (typeof value === 'string' && (name === 'alg' || name === 'edit_mode')) {
      await page.select(`#sampler [name=${name}]`, value);
    } else {
      await setField(page, `#sampler [name=${name}]`, value);
    }
  }
  await setField(page, '#prompt', text);
  const sent = page.waitForRequest((r) => r.url().endsWith(route) && r.method() === 'POST');
  await page.click('#send');
  return JSON.parse((await sent).postData());
}

async function waitDone(page) {
  await page.waitForFunction(() => {
    const all = document.querySelectorAll('#messages .message.assistant');
    return all.length && all[all.length - 1].dataset.state !== 'generating';
  }, { timeout: 40000 });
  return page.evaluate(lastAnswer);
}

async function throttle(page, bytesPerSecond) {
  const cdp = await page.createCDPSession();
  await cdp.send('Network.enable');
  await cdp.send('Network.emulateNetworkConditions', {
    offline: false, latency: 0, downloadThroughput: bytesPerSecond, uploadThroughput: -1,
  });
}

// PNG: the signature, then IHDR's width and height.
function pngSize(file) {
  const b = fs.readFileSync(file);
  assert.ok(b.length > 10000, `${file}: ${b.length} bytes is too small for a page`);
  assert.deepEqual([...b.subarray(0, 8)], [0x89, 0x50, 0x4e, 0x47, 0x0d, 0x0a, 0x1a, 0x0a], 'a PNG signature');
  assert.equal(b.toString('latin1', 12, 16), 'IHDR');
  return { width: b.readUInt32BE(16), height: b.readUInt32BE(20) };
}

async function direct(base, route, body, key) {
  const headers = { 'Content-Type': 'application/json' };
  if (key) headers.Authorization = 'Bearer ' + key;
  const res = await fetch(base + route, { method: 'POST', headers, body: JSON.stringify(body) });
  return { status: res.status, json: await res.json() };
}

// The request the page sent, as a whole (not streamed) answer.
function unstreamed(body) {
  const b = { ...body };
  delete b.stream;
  delete b.canvas;
  delete b.stream_options;
  return b;
}

async function chatWithKey(browser) {
  const page = await open(browser, arg.keyed + '/');
  // Without the key: the server's own message, and the key field asked for.
  await page.waitForFunction(() => !document.getElementById('error').hidden);
  assert.match(await page.$eval('#error', (e) => e.textContent), /needs an API key/);
  await page.type('#key', arg.key);
  await page.keyboard.press('Tab');  // change: the key is stored and the models asked again
  await page.waitForFunction(() => document.getElementById('model').textContent === 'tessera-tiny');
  assert.equal(await page.$eval('#error', (e) => e.hidden), true);
  assert.equal(await page.evaluate(() => localStorage.getItem('tessera.apiKey')), arg.key);
  log('keyed: the key is asked for, then the model is shown');

  // A message the toy model answers at length (many answer at once with the end of text).
  const options = { temperature: 0, max_tokens: 128, steps: 128, seed: 1 };
  let message = null;
  for (const m of ['Once upon a time', 'Hello', 'What is the sea?', 'Tell me a story.']) {
    const r = await direct(arg.keyed, '/v1/chat/completions',
                           { ...options, messages: [{ role: 'user', content: m }] }, arg.key);
    assert.equal(r.status, 200, JSON.stringify(r.json));
    if (r.json.usage.completion_tokens >= 64) {
      message = m;
      break;
    }
  }
  assert.ok(message, 'a message the model answers with 64 tokens or more');
  await throttle(page, 200 * 1024);
  const body = await ask(page, '/v1/chat/completions', options, message);
  for (const [k, v] of Object.entries(options)) assert.equal(body[k], v, `the page sent ${k}`);
  assert.equal(body.stream, true);
  assert.equal(body.canvas, true);
  assert.deepEqual(body.messages, [{ role: 'user', content: message }]);

  // Mid-generation: a frame with both masks and text (committed text or provisional tokens).
  const both = (a) => a && a.state === 'generating' && a.masks > 0 && (a.tokens > 0 || a.committed.length > 0);
  await page.evaluate(`window.both = ${both}`);
  await page.waitForFunction(() => window.both(window.lastAnswer()), { timeout: 30000 }).catch(async (e) => {
    throw new Error(`no frame with masks and text: ${JSON.stringify(await page.evaluate(lastAnswer))}: ${e}`);
  });
  const before = await page.evaluate(lastAnswer);
  const shot = path.join(arg.out, 'web_canvas_mid.png');
  await page.screenshot({ path: shot });
  const after = await page.evaluate(lastAnswer);
  // Masks only ever get fewer and text only more (no editing here): shown before and after the
  // screenshot, both were shown in it.
  assert.ok(both(before) && both(after), `mid-generation: ${JSON.stringify({ before, after })}`);
  assert.equal(after.boundary, 1);
  assert.match(after.status, /^step \d+ of 128/);
  assert.deepEqual(pngSize(shot), VIEW);
  log(`mid-generation screenshot ${shot}: ${after.masks} masks, ${after.tokens} provisional tokens, ` +
      `${after.committed.length} committed characters (${after.status})`);

  const done = await waitDone(page);
  assert.equal(done.state, 'done', JSON.stringify(done));
  assert.ok(done.text.length > 0, 'an answer');
  const api = await direct(arg.keyed, '/v1/chat/completions', unstreamed(body), arg.key);
  assert.equal(api.status, 200, JSON.stringify(api.json));
  assert.equal(done.text, api.json.choices[0].message.content);
  // The replay: the steps recorded, the slider redraws the first one (all masks).
  const steps = await page.$eval('.message.assistant:last-child .replay summary', (e) => e.textContent);
  assert.match(steps, /the denoising, \d+ steps/);
  await page.click('.message.assistant:last-child .replay summary');
  const first = await page.evaluate(() => {
    const r = document.querySelector('.message.assistant:last-child .replay');
    const slider = r.querySelector('input');
    slider.value = 0;
    slider.dispatchEvent(new Event('input'));
    return { masks: r.querySelectorAll('.cell.mask').length, step: r.querySelector('.step').textContent };
  });
  assert.ok(first.masks > 0 && /^step 1 of/.test(first.step), JSON.stringify(first));
  // The next message carries the conversation.
  const next = await ask(page, '/v1/chat/completions', { max_tokens: 16, steps: 16 }, 'And then?');
  assert.deepEqual(next.messages, [{ role: 'user', content: message }, { role: 'assistant', content: done.text },
                                   { role: 'user', content: 'And then?' }]);
  assert.equal((await waitDone(page)).state, 'done');
  assert.deepEqual(page.errors, []);
  log(`keyed: the page's answer equals the API's (${done.text.length} characters; ${done.status})`);
  await page.close();
}

async function completionStopAndErrors(browser) {
  const page = await open(browser, arg.open + '/');
  await page.waitForFunction(() => document.getElementById('model').textContent === 'tessera-tiny');
  assert.equal(await page.$eval('#error', (e) => e.hidden), true, 'no key needed');
  await page.click('input[name=mode][value=completion]');

  // A raw completion whose prompt is markup: shown as text.
  const prompt = '<b>bold</b><img src=x> Once upon a time';
  const body = await ask(page, '/v1/completions', { temperature: 0, max_tokens: 32, steps: 32 }, prompt);
  assert.equal(body.prompt, prompt);
  assert.equal(body.messages, undefined);
  const done = await waitDone(page);
  assert.equal(done.state, 'done', JSON.stringify(done));
  const api = await direct(arg.open, '/v1/completions', unstreamed(body));
  assert.equal(done.text, api.json.choices[0].text);
  assert.equal(await page.$eval('.message.prompt .text', (e) => e.textContent), prompt);
  assert.equal(await page.$$eval('#messages b, #messages img', (e) => e.length), 0, 'no markup from text');
  log('open: a raw completion equals the API\'s, its prompt shown as text');

  // Token editing: the tokens a step rewrites are highlighted on the canvas (where the API's stream has
  // rewrites for that request).
  const editing = { temperature: 0, seed: 1, max_tokens: 64, steps: 64, alg: 'low_confidence', edit_mode: 'speed' };
  const stream = await fetch(arg.open + '/v1/completions', { method: 'POST', body: JSON.stringify(
      { ...editing, prompt: 'Once upon a time', stream: true, canvas: true }) });
  assert.equal(stream.status, 200);
  const rewrites = ((await stream.text()).match(/"edits":\[\{/g) || []).length;
  await throttle(page, 100 * 1024);
  const edits = await ask(page, '/v1/completions', editing, 'Once upon a time');
  for (const [k, v] of Object.entries(editing)) assert.equal(edits[k], v, `the page sent ${k}`);
  if (rewrites > 0) {
    await page.waitForFunction(() => document.querySelector('.canvas.live .cell.edited'), { polling: 10 });
    const cell = await page.$eval('.canvas.live .cell.edited', (e) => e.title);
    assert.match(cell, /^position \d+: was /);
  }
  assert.equal((await waitDone(page)).state, 'done');
  log(`open: ${rewrites} steps with rewrites; ${rewrites > 0 ? 'an edited token was highlighted' : 'none to show'}`);

  // Stop: the fetch is aborted mid-generation; the page is ready for the next message.
  await page.select('#sampler [name=edit_mode]', '');
  await page.select('#sampler [name=alg]', '');
  await throttle(page, 20 * 1024);
  await ask(page, '/v1/completions', { max_tokens: 256, steps: 256 }, 'The old man said');
  await page.waitForFunction(() => window.lastAnswer().masks > 0, { timeout: 20000 }).catch(async (e) => {
    throw new Error(`no frame with masks: ${JSON.stringify(await page.evaluate(lastAnswer))}: ${e}`);
  });
  await page.click('#stop');
  const stopped = await waitDone(page);
  assert.equal(stopped.state, 'stopped', JSON.stringify(stopped));
  assert.equal(await page.$eval('#send', (e) => e.disabled), false);
  assert.equal(await page.$eval('#stop', (e) => e.disabled), true);
  log('open: stop ends the answer');

  // A request the server refuses: its message on the page.
  const bad = await ask(page, '/v1/completions', { max_tokens: 64, seed: -1 }, 'hello');
  const failed = await waitDone(page);
  assert.equal(failed.state, 'error');
  const refused = await direct(arg.open, '/v1/completions', unstreamed(bad));
  assert.equal(refused.status, 400);
  assert.equal(failed.error, refused.json.error.message);
  assert.deepEqual(page.errors, []);
  log(`open: the server's error is shown: ${failed.error}`);
  await page.close();
}

const browser = await puppeteer.launch({
  executablePath: arg.chromium,
  headless: true,
  args: ['--no-sandbox', '--disable-gpu', '--disable-dev-shm-usage'],
});
try {
  await checkRoutes();
  await chatWithKey(browser);
  await completionStopAndErrors(browser);
} finally {
  await browser.close();
}
log('web_canvas: passed');
