#!/usr/bin/env python3
"""Renders chat templates with Python's jinja2 as Hugging Face transformers does: the oracle for
tessera's own Jinja interpreter (src/io/jinja).

  chat_oracle.py cases DIR   every DIR/*.jinja with every generated conversation; prints a JSON list of
                             {"template", "case", "context", "expected"} or {..., "error"}
  chat_oracle.py render      reads {"template": text, "context": {...}} from stdin, prints the JSON
                             {"expected": text} or {"error": message}

The environment is transformers' (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, the
loopcontrols extension, raise_exception, strftime_now, and its tojson: json.dumps with
ensure_ascii=False). The conversations cover: with and without a system turn, several turns, tools,
assistant tool calls (one and two), tool results, reasoning text, add_generation_prompt on and off,
enable_thinking on and off.
"""
import json
import os
import sys
from datetime import datetime

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment


class TemplateError(Exception):
    pass


def environment():
    def raise_exception(message):
        raise TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def render(env, text, context):
    try:
        return {"expected": env.from_string(text).render(**context)}
    except Exception as e:  # the interpreter must fail too; its message is not compared
        return {"error": "%s: %s" % (type(e).__name__, e)}


WEATHER = {"type": "function", "function": {
    "name": "get_weather",
    "description": "Current weather in a city, in \u00b0C",
    "parameters": {"type": "object",
                   "properties": {"city": {"type": "string", "description": "e.g. \"Paris\""},
                                  "unit": {"type": "string", "enum": ["c", "f"]}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "The local time",
    "parameters": {"type": "object", "properties": {"zone": {"type": "string"}}, "required": []}}}


def call(i, name, args):
    return {"id": "Call%05d" % i, "type": "function", "function": {"name": name, "arguments": args}}


def conversations():
    user = {"role": "user", "content": "What is the weather in Paris?"}
    system = {"role": "system", "content": "You are terse.\nAnswer in one line."}
    yield "user", {"messages": [user]}
    yield "system_user", {"messages": [system, user]}
    yield "multi_turn", {"messages": [system, {"role": "user", "content": "Hi!"},
                                      {"role": "assistant", "content": "Hello. How can I help?"},
                                      {"role": "user", "content": "  Spaces around  \n"}]}
    yield "no_system_multi", {"messages": [{"role": "user", "content": "1+1?"},
                                           {"role": "assistant", "content": "2"},
                                           {"role": "user", "content": "Unicode: caf\u00e9 \u2713 \u65e5\u672c"}]}
    yield "tools", {"messages": [user], "tools": [WEATHER, TIME]}
    yield "tools_system", {"messages": [system, user], "tools": [WEATHER]}
    one = call(1, "get_weather", {"city": "Paris", "unit": "c"})
    yield "tool_call_flow", {"messages": [
        user, {"role": "assistant", "content": "", "tool_calls": [one]},
        {"role": "tool", "tool_call_id": "Call00001", "name": "get_weather", "content": "{\"temp\": 21}"}],
        "tools": [WEATHER]}
    two = [call(1, "get_weather", {"city": "Paris"}), call(2, "get_time", {"zone": "CET"})]
    yield "parallel_calls", {"messages": [
        system, user, {"role": "assistant", "content": None, "tool_calls": two},
        {"role": "tool", "tool_call_id": "Call00001", "name": "get_weather", "content": "21"},
        {"role": "tool", "tool_call_id": "Call00002", "name": "get_time", "content": "12:00"},
        {"role": "assistant", "content": "21 \u00b0C at noon."},
        {"role": "user", "content": "Thanks"}], "tools": [WEATHER, TIME]}
    yield "reasoning", {"messages": [
        {"role": "user", "content": "2+2?"},
        {"role": "assistant", "content": "<think>\nadd them\n</think>\n\n4",
         "reasoning_content": "add them"},
        {"role": "user", "content": "and 3+3?"}]}


def cases(directory):
    env = environment()
    out = []
    for name in sorted(os.listdir(directory)):
        if not name.endswith(".jinja"):
            continue
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            text = f.read()
        for case, base in conversations():
            for gen in (True, False):
                for thinking in (None, True, False):
                    context = dict(base)
                    context.update({"add_generation_prompt": gen, "bos_token": "<BOS>",
                                    "eos_token": "<EOS>", "date_string": "26 Jul 2024"})
                    if thinking is not None:
                        context["enable_thinking"] = thinking
                    row = {"template": name, "case": "%s gen=%s thinking=%s" % (case, gen, thinking),
                           "context": context}
                    row.update(render(env, text, context))
                    out.append(row)
    return out


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "cases":
        json.dump(cases(sys.argv[2]), sys.stdout, ensure_ascii=False)
    elif len(sys.argv) == 2 and sys.argv[1] == "render":
        req = json.load(sys.stdin)
        json.dump(render(environment(), req["template"], req["context"]), sys.stdout, ensure_ascii=False)
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
