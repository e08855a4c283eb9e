// tessera serve's web page: a chat (or a raw completion) over the server's own API, streamed with
// "canvas": true so that every denoising step arrives as a "tessera.canvas" event (apps/tessera/
// canvas_event.h): the committed text, the provisional positions (a token, or null for a mask), the
// positions the step decided and the tokens it rewrote. Model output only ever reaches the page through
// textContent.
'use strict';

const $ = (id) => document.getElementById(id);
const KEY = 'tessera.apiKey';
const OPTIONS = 'tessera.options';
const FLASH_MS = 1200;  // how long an edited token stays highlighted

const state = {
  model: null,       // the id from /v1/models
  history: [],       // the chat's messages, as the API takes them
  conversation: 0,   // counts "New chat"s: an answer that ends after one does not join the new chat
  controller: null,  // the AbortController of the answer being generated
};

function el(tag, cls, text) {
  const e = document.createElement(tag);
  if (cls) e.className = cls;
  if (text !== undefined) e.textContent = text;
  return e;
}

function headers() {
  const h = { 'Content-Type': 'application/json' };
  const key = localStorage.getItem(KEY);
  if (key) h.Authorization = 'Bearer ' + key;
  return h;
}

// The server's error message from a failed response (an OpenAI-style error object), else its status.
async function errorText(res) {
  const fallback = `${res.status} ${res.statusText}`;
  try {
    const j = await res.json();
    return (j.error && j.error.message) || fallback;
  } catch {
    return fallback;
  }
}

function showError(message) {
  const box = $('error');
  box.textContent = message;
  box.hidden = !message;
  if (/API key/.test(message)) $('key').classList.add('wanted');
}

async function loadModel() {
  try {
    const res = await fetch('/v1/models', { headers: headers() });
    if (!res.ok) return showError(await errorText(res));
    const j = await res.json();
    state.model = j.data[0].id;
    $('model').textContent = state.model;
    showError('');
  } catch (e) {
    showError('cannot reach the server: ' + e.message);
  }
}

// The sampler's fields that are set, typed as the API takes them.
function samplerOptions() {
  const out = {};
  for (const f of $('sampler').elements) {
    if (!f.name || f.value === '') continue;
    out[f.name] = f.type === 'number' ? Number(f.value) : f.value;
  }
  return out;
}

function saveOptions() {
  const v = {};
  for (const f of $('sampler').elements) if (f.name) v[f.name] = f.value;
  localStorage.setItem(OPTIONS, JSON.stringify(v));
}

function restoreOptions() {
  let v = {};
  try {
    v = JSON.parse(localStorage.getItem(OPTIONS) || '{}');
  } catch {}
  for (const f of $('sampler').elements) if (f.name && typeof v[f.name] === 'string') f.value = v[f.name];
  $('key').value = localStorage.getItem(KEY) || '';
}

// The events of a server-sent event stream: {event, data} ("message" for unnamed ones).
async function* events(res) {
  const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
  let buf = '';
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += value;
    let end;
    while ((end = buf.indexOf('\n\n')) >= 0) {
      const block = buf.slice(0, end);
      buf = buf.slice(end + 2);
      let event = 'message';
      const data = [];
      for (const line of block.split('\n')) {
        if (line.startsWith('event:')) event = line.slice(6).trim();
        else if (line.startsWith('data:')) data.push(line.slice(5).replace(/^ /, ''));
      }
      if (data.length) yield { event, data: data.join('\n') };
    }
  }
}

// A token's text as a cell shows it: line breaks and tabs visible, special tokens (<|...|>) marked.
function cellText(text) {
  return text.replace(/\n/g, '\u21b5').replace(/\t/g, '\u2192');
}
function isSpecial(text) {
  return /^<\|.*\|>$|^<\/?s>$|^\[[A-Z]+\]$/.test(text);
}

// Draws one canvas event into box: the committed text plain, the boundary, then a cell per provisional
// position (a shaded block for a mask, the token dimmed otherwise). flashes: position -> time edited.
function drawCanvas(box, frame, flashes, now) {
  const changed = new Set(frame.changed);
  const cells = [el('span', 'committed', frame.committed), el('span', 'boundary')];
  cells[1].title = `${frame.committed_tokens} committed tokens | provisional`;
  let masks = 0;
  for (const p of frame.provisional) {
    let cell;
    if (p.token === null) {
      cell = el('span', 'cell mask');
      masks++;
    } else if (isSpecial(p.text)) {
      cell = el('span', 'cell tok special', '\u25c6');
    } else {
      cell = el('span', 'cell tok', cellText(p.text));
    }
    if (changed.has(p.position)) cell.classList.add('new');
    const edited = flashes.get(p.position);
    if (edited && now - edited.at < FLASH_MS) {
      cell.classList.add('edited');
      cell.title = `position ${p.position}: was ${JSON.stringify(edited.old)}`;
    } else {
      cell.title = `position ${p.position}` + (p.token === null ? ': mask' : `: ${JSON.stringify(p.text)}`);
    }
    cells.push(cell);
  }
  box.replaceChildren(...cells);
  return masks;
}

function addMessage(role, text) {
  const m = el('div', 'message ' + role);
  m.append(el('div', 'role', role === 'user' ? 'you' : role === 'prompt' ? 'prompt' : state.model || 'model'));
  m.append(el('div', 'text', text));
  $('messages').append(m);
  m.scrollIntoView({ block: 'end' });
  return m;
}

// After an answer: a slider over its recorded steps redraws the canvas of any of them.
function addReplay(msg, frames) {
  if (!frames.length) return;
  const details = el('details', 'replay');
  details.append(el('summary', null, `the denoising, ${frames.length} steps`));
  const slider = el('input');
  Object.assign(slider, { type: 'range', min: 0, max: frames.length - 1, value: frames.length - 1 });
  slider.setAttribute('aria-label', 'step');
  const label = el('span', 'step');
  const box = el('div', 'canvas');
  const show = () => {
    const f = frames[Number(slider.value)];
    const flashes = new Map(f.edits.map((e) => [e.position, { at: 0, old: e.old_text }]));
    drawCanvas(box, f, flashes, 0);
    label.textContent = `step ${f.step + 1} of ${frames.length}`;
  };
  slider.addEventListener('input', show);
  details.addEventListener('toggle', show, { once: true });
  details.append(slider, label, box);
  msg.append(details);
}

function setBusy(busy) {
  $('send').disabled = busy;
  $('stop').disabled = !busy;
  document.body.classList.toggle('busy', busy);
}

async function send() {
  const text = $('prompt').value;
  if (state.controller || !text.trim()) return;
  showError('');
  const chat = document.querySelector('input[name=mode]:checked').value === 'chat';
  const conversation = state.conversation;
  const body = { ...samplerOptions(), stream: true, canvas: true, stream_options: { include_usage: true } };
  if (state.model) body.model = state.model;
  if (chat) {
    state.history.push({ role: 'user', content: text });
    body.messages = state.history.slice();
  } else {
    body.prompt = text;
  }
  addMessage(chat ? 'user' : 'prompt', text);
  $('prompt').value = '';
  const msg = addMessage('assistant', '');
  msg.dataset.state = 'generating';
  const status = el('div', 'status', 'waiting for the server');
  const box = el('div', 'canvas live');
  box.setAttribute('aria-hidden', 'true');  // a picture of the steps; the answer's text is what is read
  msg.append(status, box);

  const frames = [];
  const flashes = new Map();
  let answer = '', reasoning = '', finish = null, usage = null, drawn = null;
  const t0 = performance.now();
  // Coalesced drawing: at most one canvas per animation frame, the latest one.
  const draw = () => {
    drawn = null;
    const f = frames[frames.length - 1];
    const masks = drawCanvas(box, f, flashes, performance.now());
    const seconds = ((performance.now() - t0) / 1000).toFixed(1);
    status.textContent = `step ${f.step + 1}${body.steps ? ' of ' + body.steps : ''} \u00b7 ` +
        `${f.committed_tokens} committed \u00b7 ${masks} masks \u00b7 ${seconds} s`;
  };
  state.controller = new AbortController();
  setBusy(true);
  try {
    const res = await fetch(chat ? '/v1/chat/completions' : '/v1/completions',
                            { method: 'POST', headers: headers(), body: JSON.stringify(body),
                              signal: state.controller.signal });
    if (!res.ok) throw new Error(await errorText(res));
    for await (const ev of events(res)) {
      if (ev.event === 'tessera.canvas') {
        const f = JSON.parse(ev.data);
        if (f.index !== 0) continue;
        frames.push(f);
        for (const e of f.edits) flashes.set(e.position, { at: performance.now(), old: e.old_text });
        drawn = drawn || requestAnimationFrame(draw);
        continue;
      }
      if (ev.data === '[DONE]') break;
      const j = JSON.parse(ev.data);
      if (j.error) throw new Error(j.error.message);
      if (j.usage) usage = j.usage;
      const c = j.choices && j.choices[0];
      if (!c) continue;
      if (chat) {
        answer += (c.delta && c.delta.content) || '';
        reasoning += (c.delta && c.delta.reasoning_content) || '';
      } else {
        answer += c.text || '';
      }
      if (c.finish_reason) finish = c.finish_reason;
    }
    if (finish === null) throw new Error('the stream ended before the answer did');
    msg.dataset.state = 'done';
    const seconds = ((performance.now() - t0) / 1000).toFixed(2);
    status.textContent = `${usage ? usage.completion_tokens + ' tokens, ' : ''}${frames.length} steps, ` +
        `${seconds} s \u00b7 ${finish}`;
  } catch (e) {
    const stopped = e.name === 'AbortError';
    msg.dataset.state = stopped ? 'stopped' : 'error';
    // What was committed when it ended is the answer's text so far.
    if (!answer && frames.length) answer = frames[frames.length - 1].committed;
    status.textContent = stopped ? 'stopped' : 'failed';
    if (!stopped) showError(e.message);
  } finally {
    if (drawn) cancelAnimationFrame(drawn);
    state.controller = null;
    setBusy(false);
  }
  box.remove();
  msg.querySelector('.text').textContent = answer;
  if (reasoning) {
    const r = el('details', 'reasoning');
    r.append(el('summary', null, 'reasoning'), el('div', 'text', reasoning));
    msg.querySelector('.text').before(r);
  }
  addReplay(msg, frames);
  if (chat && conversation === state.conversation) {
    if (answer) state.history.push({ role: 'assistant', content: answer });
    else state.history.pop();  // no answer: the question is not part of the conversation
  }
}

function init() {
  restoreOptions();
  $('composer').addEventListener('submit', (e) => {
    e.preventDefault();
    send();
  });
  $('prompt').addEventListener('keydown', (e) => {
    if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
      e.preventDefault();
      send();
    }
  });
  $('stop').addEventListener('click', () => state.controller && state.controller.abort());
  $('clear').addEventListener('click', () => {
    if (state.controller) state.controller.abort();
    state.history = [];
    state.conversation++;
    $('messages').replaceChildren();
    showError('');
  });
  $('sampler').addEventListener('input', saveOptions);
  $('sampler').addEventListener('submit', (e) => e.preventDefault());
  $('key').addEventListener('change', () => {
    const k = $('key').value.trim();
    if (k) localStorage.setItem(KEY, k);
    else localStorage.removeItem(KEY);
    $('key').classList.remove('wanted');
    loadModel();
  });
  loadModel();
}

init();
