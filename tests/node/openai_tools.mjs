// The official OpenAI Node client's tool-calling flow against `tessera serve` (issue #32): list the
// models, ask with tools (auto), answer a tool call with its result and ask again, force a named
// function, stream with tools, and read a refusal as the client's typed error. Run by openai_tools.sh,
// which starts the server on a copy of the bundled model that ships Qwen3's chat template.
//   node openai_tools.mjs BASE_URL
import OpenAI from "openai";
import assert from "node:assert/strict";

const client = new OpenAI({ baseURL: process.argv[2], apiKey: "unused", maxRetries: 0 });
const tools = [{
  type: "function",
  function: {
    name: "get_weather",
    description: "Weather in a city",
    parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
  },
}];
const models = await client.models.list();
const model = models.data[0].id;

// 1. The model is offered the tools; whatever it writes comes back in OpenAI's shape.
const first = await client.chat.completions.create({
  model, tools, tool_choice: "auto", max_tokens: 16,
  messages: [{ role: "user", content: "Weather in Paris?" }],
});
const m = first.choices[0].message;
assert.equal(m.role, "assistant");
assert.ok(typeof m.content === "string" || Array.isArray(m.tool_calls), JSON.stringify(m));
assert.ok(["stop", "length", "tool_calls"].includes(first.choices[0].finish_reason));
if (m.tool_calls) for (const c of m.tool_calls) JSON.parse(c.function.arguments);

// 2. The agent loop's second turn: the assistant's call and the tool's result go back through the template.
const second = await client.chat.completions.create({
  model, tools, max_tokens: 16,
  messages: [
    { role: "user", content: "Weather in Paris?" },
    { role: "assistant", content: null,
      tool_calls: [{ id: "call_1", type: "function", function: { name: "get_weather", arguments: '{"city":"Paris"}' } }] },
    { role: "tool", tool_call_id: "call_1", content: '{"temp": 21}' },
  ],
});
assert.equal(second.choices[0].message.role, "assistant");
assert.ok(second.usage.prompt_tokens > first.usage.prompt_tokens, "the tool turn is part of the prompt");

// 3. A named function: the server starts the call in the template's format and holds its arguments to the
// function's parameters, so even this tiny model (never taught to call tools) answers with a valid call;
// the agent runs the tool and sends the result back with the call's id.
const named = await client.chat.completions.create({
  model, tools, max_tokens: 48, tool_choice: { type: "function", function: { name: "get_weather" } },
  messages: [{ role: "user", content: "Weather in Rome?" }],
});
const n = named.choices[0];
assert.equal(n.finish_reason, "tool_calls", JSON.stringify(n));
const call = n.message.tool_calls[0];
assert.equal(call.function.name, "get_weather");
assert.equal(typeof JSON.parse(call.function.arguments).city, "string");
const answered = await client.chat.completions.create({
  model, tools, max_tokens: 16,
  messages: [{ role: "user", content: "Weather in Rome?" }, n.message,
             { role: "tool", tool_call_id: call.id, content: '{"temp": 18}' }],
});
assert.equal(answered.choices[0].message.role, "assistant");

// 4. Streamed with tools: the chunks assemble into an answer.
const stream = await client.chat.completions.create({
  model, tools, max_tokens: 16, stream: true,
  messages: [{ role: "user", content: "Weather in Oslo?" }],
});
let text = "", reason = null;
for await (const chunk of stream) {
  const c = chunk.choices[0];
  if (!c) continue;
  if (c.delta?.content) text += c.delta.content;
  if (c.finish_reason) reason = c.finish_reason;
}
assert.ok(reason !== null, "the stream ends with a finish_reason");

// 5. A refusal is the client's typed error, naming the field.
await assert.rejects(
  client.chat.completions.create({ model, tools, tool_choice: { type: "function", function: { name: "nope" } },
    messages: [{ role: "user", content: "x" }] }),
  (e) => e instanceof OpenAI.BadRequestError && /nope/.test(e.message));
console.log("openai node client: tool-calling flow ok (" + model + ")");
