#!/usr/bin/env python3
"""Validates generated texts against JSON Schemas with Python's jsonschema (the oracle of structured
output): reads a JSON list of {"schema": {...} or null (any JSON object), "text": "..."} from stdin and
prints a JSON list of {"ok": bool, "error": message}."""
import json
import sys

import jsonschema


def check(schema, text):
    try:
        value = json.loads(text)
    except ValueError as e:
        return {"ok": False, "error": "not JSON: %s" % e}
    if schema is None:
        return {"ok": isinstance(value, dict), "error": "" if isinstance(value, dict) else "not an object"}
    try:
        jsonschema.Draft202012Validator(schema).validate(value)
    except jsonschema.ValidationError as e:
        return {"ok": False, "error": e.message}
    return {"ok": True, "error": ""}


json.dump([check(c["schema"], c["text"]) for c in json.load(sys.stdin)], sys.stdout)
