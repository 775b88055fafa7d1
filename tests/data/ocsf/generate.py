#!/usr/bin/env python3
"""Generate JSON Schemas (draft 2020-12) for two OCSF event classes from the OCSF schema's own
definition files, so that tests can validate the proxy's `audit.format: ocsf` records.

Source: https://github.com/ocsf/ocsf-schema at tag 1.8.0 (the definition files:
dictionary.json, categories.json, events/, objects/, profiles/).

    python3 tests/data/ocsf/generate.py /path/to/ocsf-schema-checkout 1.8.0

writes network_activity.schema.json (class 4001) and dns_activity.schema.json (class 4003)
next to this script. Every attribute of the class, of its parents and of the profiles they
include is allowed (profiles are optional); attributes marked "required" are required; ids
with enumerations take only their enumerated values; objects are closed
(additionalProperties: false), so a misspelled or invented field fails validation.
"""
import json
import subprocess
import sys
from pathlib import Path

REPO, TAG = sys.argv[1], sys.argv[2]
OUT = Path(__file__).resolve().parent


def show(path):
    return json.loads(subprocess.check_output(["git", "-C", REPO, "show", f"{TAG}:{path}"]))


def files(prefix):
    out = subprocess.check_output(["git", "-C", REPO, "ls-tree", "-r", "--name-only", TAG, prefix])
    return [p for p in out.decode().split("\n") if p.endswith(".json")]


DICT = show("dictionary.json")
ATTRS = DICT["attributes"]
TYPES = DICT["types"]["attributes"]
CATEGORIES = show("categories.json")["attributes"]
EVENTS = {}
for p in files("events"):
    d = show(p)
    EVENTS[d["name"]] = d
OBJECTS = {}
for p in files("objects"):
    d = show(p)
    OBJECTS[d["name"]] = d

PRIMITIVE = {
    "string_t": "string",
    "integer_t": "integer",
    "long_t": "integer",
    "float_t": "number",
    "boolean_t": "boolean",
}


def merged_attributes(defn, table):
    """A definition's attributes: its parent's, its includes', then its own on top."""
    attrs = {}
    parent = defn.get("extends")
    if parent:
        attrs.update(merged_attributes(table[parent], table))
    for inc in defn.get("attributes", {}).get("$include", []):
        for k, v in show(inc).get("attributes", {}).items():
            if k != "$include":
                # A profile's attributes are required only where the profile is applied:
                # here they are allowed, never required.
                if inc.startswith("profiles/") and v.get("requirement") == "required":
                    v = {**v, "requirement": "optional"}
                attrs[k] = {**attrs.get(k, {}), **v}
    for k, v in defn.get("attributes", {}).items():
        if k != "$include":
            attrs[k] = {**attrs.get(k, {}), **v}
    return attrs


def constraints(defn, table):
    c = {}
    parent = defn.get("extends")
    if parent:
        c.update(constraints(table[parent], table))
    c.update(defn.get("constraints", {}))
    return c


DEFS = {}


def base_type(t):
    while t in TYPES and t not in PRIMITIVE and "type" in TYPES[t]:
        t = TYPES[t]["type"]
    return t


def attr_schema(name, spec):
    t = spec.get("type") or ATTRS.get(name, {}).get("type")
    if t in OBJECTS:
        define_object(t)
        s = {"$ref": f"#/$defs/{t}"}
    elif t == "object_t":
        s = {"type": "object"}
    elif t == "json_t":
        s = {}
    else:
        b = base_type(t)
        s = {"type": PRIMITIVE.get(b, "string")}
        enum = spec.get("enum")
        if enum and s["type"] == "integer":
            s["enum"] = sorted(int(k) for k in enum)
        regex = TYPES.get(t, {}).get("regex")
        if regex and s["type"] == "string":
            s["pattern"] = regex
    if spec.get("is_array") or ATTRS.get(name, {}).get("is_array"):
        s = {"type": "array", "items": s}
    return s


def closed(attrs, cons):
    props = {}
    required = []
    for k, v in attrs.items():
        spec = {**ATTRS.get(k, {}), **v}
        props[k] = attr_schema(k, spec)
        if spec.get("requirement") == "required":
            required.append(k)
    s = {"type": "object", "properties": props, "additionalProperties": False}
    if required:
        s["required"] = sorted(required)
    if cons.get("at_least_one"):
        s["anyOf"] = [{"required": [k]} for k in cons["at_least_one"]]
    if cons.get("just_one"):
        s["oneOf"] = [{"required": [k]} for k in cons["just_one"]]
    return s


def define_object(name):
    if name in DEFS:
        return
    DEFS[name] = {}
    o = OBJECTS[name]
    attrs = merged_attributes(o, OBJECTS)
    # OCSF's generic `object` (used by `unmapped`) has no attributes: any keys go.
    DEFS[name] = closed(attrs, constraints(o, OBJECTS)) if attrs else {"type": "object"}


def event_schema(name, category):
    e = EVENTS[name]
    attrs = merged_attributes(e, EVENTS)
    class_uid = CATEGORIES[category]["uid"] * 1000 + e["uid"]
    s = closed(attrs, constraints(e, EVENTS))
    activities = sorted(set(int(k) for k in {**ATTRS["activity_id"].get("enum", {}), **attrs["activity_id"].get("enum", {})}))
    s["properties"]["activity_id"]["enum"] = activities
    s["properties"]["class_uid"] = {"const": class_uid}
    s["properties"]["category_uid"] = {"const": CATEGORIES[category]["uid"]}
    s["properties"]["type_uid"] = {"enum": [class_uid * 100 + a for a in activities]}
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": f"Generated by tests/data/ocsf/generate.py from https://github.com/ocsf/ocsf-schema tag {TAG} ({name}, class_uid {class_uid}).",
        "title": f"OCSF {TAG} {e['caption']} ({class_uid})",
        **s,
        "$defs": DEFS,
    }


for event, category in [("network_activity", "network"), ("dns_activity", "network")]:
    DEFS = {}
    schema = event_schema(event, category)
    (OUT / f"{event}.schema.json").write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    print(f"wrote {event}.schema.json ({len(DEFS)} objects)")
