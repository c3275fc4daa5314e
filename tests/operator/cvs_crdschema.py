"""Admission of a custom resource the way the API server does it, without an API server.

1. structural defaulting (``default`` of absent fields, recursively),
2. the openAPIV3Schema as JSON Schema, strict about unknown fields (``kubectl --validate=strict``),
3. every ``x-kubernetes-validations`` CEL rule, evaluated with cel-python at its node with ``self`` bound.

Also ``structural_problems``: the structural-schema invariants the API server enforces on the CRD itself.
"""
from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import celpy
import jsonschema
import yaml

Obj = dict[str, Any]
_CEL_ENV = celpy.Environment()
_PROGRAMS: dict[str, Any] = {}


def load_crd(path: Path) -> Obj:
    return yaml.safe_load(path.read_text())


def openapi_schema(crd: Obj, version: str = "v1alpha1") -> Obj:
    for v in crd["spec"]["versions"]:
        if v["name"] == version:
            return v["schema"]["openAPIV3Schema"]
    raise KeyError(version)


def apply_defaults(schema: Obj, value: Any) -> Any:
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key not in value and "default" in sub:
                value[key] = copy.deepcopy(sub["default"])
        for key, sub in props.items():
            if key in value:
                value[key] = apply_defaults(sub, value[key])
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key in list(value):
                if key not in props:
                    value[key] = apply_defaults(extra, value[key])
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        return [apply_defaults(schema["items"], item) for item in value]
    return value


def to_jsonschema(schema: Obj) -> Obj:
    out: Obj = {}
    for key, val in schema.items():
        if key in ("description", "default", "x-kubernetes-validations", "x-kubernetes-list-type",
                   "x-kubernetes-list-map-keys", "x-kubernetes-int-or-string", "x-kubernetes-preserve-unknown-fields",
                   "format", "nullable", "exclusiveMinimum", "exclusiveMaximum"):
            continue
        if key == "properties":
            out[key] = {k: to_jsonschema(v) for k, v in val.items()}
        elif key in ("items", "additionalProperties") and isinstance(val, dict):
            out[key] = to_jsonschema(val)
        elif key in ("anyOf", "allOf", "oneOf"):
            out[key] = [to_jsonschema(v) for v in val]
        else:
            out[key] = val
    # OpenAPI 3.0 booleans → JSON Schema 2020 numbers.
    if schema.get("exclusiveMinimum") is True:
        out["exclusiveMinimum"] = out.pop("minimum")
    if schema.get("exclusiveMaximum") is True:
        out["exclusiveMaximum"] = out.pop("maximum")
    # Unknown fields are errors (kubectl --validate=strict), except where unknown fields are preserved.
    if schema.get("type") == "object" and "properties" in schema and not schema.get(
            "x-kubernetes-preserve-unknown-fields") and "additionalProperties" not in schema:
        out["additionalProperties"] = False
    if schema.get("x-kubernetes-preserve-unknown-fields") and "type" not in schema:
        out.pop("type", None)
    return out


def _program(rule: str) -> Any:
    if rule not in _PROGRAMS:
        _PROGRAMS[rule] = _CEL_ENV.program(_CEL_ENV.compile(rule))
    return _PROGRAMS[rule]


def cel_errors(schema: Obj, value: Any, path: str = "") -> list[str]:
    errors: list[str] = []
    for rule in schema.get("x-kubernetes-validations") or []:
        try:
            result = _program(rule["rule"]).evaluate({"self": celpy.json_to_cel(value)})
        except celpy.CELEvalError as exc:
            errors.append(f"{path or '<root>'}: rule {rule['rule']!r} failed to evaluate: {exc}")
            continue
        if isinstance(result, celpy.CELEvalError) or not bool(result):
            errors.append(f"{path or '<root>'}: {rule.get('message', rule['rule'])}")
    if isinstance(value, dict):
        props = schema.get("properties") or {}
        for key, sub in props.items():
            if key in value:
                errors += cel_errors(sub, value[key], f"{path}.{key}" if path else key)
        extra = schema.get("additionalProperties")
        if isinstance(extra, dict):
            for key, item in value.items():
                if key not in props:
                    errors += cel_errors(extra, item, f"{path}.{key}")
    elif isinstance(value, list) and isinstance(schema.get("items"), dict):
        for i, item in enumerate(value):
            errors += cel_errors(schema["items"], item, f"{path}[{i}]")
    return errors


def admit(crd: Obj, cr: Obj) -> tuple[Obj, list[str]]:
    """The object as stored after defaulting, and every error the API server would report."""
    schema = openapi_schema(crd, cr["apiVersion"].split("/")[-1])
    obj = apply_defaults(schema, copy.deepcopy(cr))
    validator = jsonschema.Draft202012Validator(to_jsonschema(schema))
    errors = [f"{'.'.join(str(p) for p in e.absolute_path) or '<root>'}: {e.message}"
              for e in validator.iter_errors(obj)]
    if not errors:
        errors = cel_errors(schema, obj)
    return obj, errors


def structural_problems(schema: Obj, path: str = "") -> list[str]:
    """Violations of the structural-schema rules (every node typed, no types inside anyOf but int-or-string)."""
    problems: list[str] = []
    int_or_string = schema.get("x-kubernetes-int-or-string") is True
    if "type" not in schema and not int_or_string and not schema.get("x-kubernetes-preserve-unknown-fields"):
        problems.append(f"{path or '<root>'}: no type")
    if int_or_string and schema.get("anyOf") != [{"type": "integer"}, {"type": "string"}]:
        problems.append(f"{path}: int-or-string must be exactly anyOf [integer, string]")
    for branch in schema.get("anyOf") or []:
        if not int_or_string and "type" in branch:
            problems.append(f"{path}: type inside anyOf")
    if schema.get("type") == "array" and "items" not in schema:
        problems.append(f"{path}: array without items")
    for rule in schema.get("x-kubernetes-validations") or []:
        if "message" not in rule:
            problems.append(f"{path}: CEL rule without a message")
        try:
            _program(rule["rule"])
        except Exception as exc:
            problems.append(f"{path}: rule {rule['rule']!r} does not compile: {exc}")
    for key, sub in (schema.get("properties") or {}).items():
        problems += structural_problems(sub, f"{path}.{key}" if path else key)
    if isinstance(schema.get("items"), dict):
        problems += structural_problems(schema["items"], f"{path}[]")
    if isinstance(schema.get("additionalProperties"), dict):
        problems += structural_problems(schema["additionalProperties"], f"{path}{{}}")
    return problems
