"""CosyVoiceService manifests as a user writes them (a YAML stream, ``kind: List`` included), validated
the way the operator validates them: for ``render`` and for ``simulate --service``."""
from __future__ import annotations

import difflib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import yaml

from .constants import API_VERSION, KIND
from .spec import CosyVoiceServiceSpec, InvalidSpec, check_name, parse_spec

TOP_LEVEL = ("apiVersion", "kind", "metadata", "spec", "status")


@dataclass(frozen=True)
class Service:
    name: str
    namespace: str | None
    raw: dict[str, Any]  # the manifest's spec as written
    spec: CosyVoiceServiceSpec


def documents(text: str) -> Iterator[dict[str, Any]]:
    for doc in yaml.safe_load_all(text):
        if isinstance(doc, dict) and doc.get("kind") == "List":
            yield from (d for d in doc.get("items") or [] if isinstance(d, dict))
        elif isinstance(doc, dict):
            yield doc


def check_top_level(doc: dict[str, Any]) -> None:
    """A misspelt ``spec`` would otherwise render the defaults without a word."""
    for key in doc:
        if key not in TOP_LEVEL:
            close = difflib.get_close_matches(str(key), TOP_LEVEL, n=1, cutoff=0.6)
            raise InvalidSpec(f"{key}: unknown field" + (f"; did you mean {close[0]!r}?" if close else ""))


def services(text: str) -> list[Service]:
    """Every CosyVoiceService in the stream (other documents are skipped), each validated.

    Raises InvalidSpec naming the offending resource, or saying there is none."""
    found = []
    for doc in documents(text):
        if doc.get("kind") != KIND or str(doc.get("apiVersion", "")).split("/")[0] != API_VERSION.split("/")[0]:
            continue
        meta = doc.get("metadata") or {}
        name = meta.get("name", "?")
        try:
            check_top_level(doc)
            check_name(name)
            spec = parse_spec(doc.get("spec"))
        except InvalidSpec as exc:
            raise InvalidSpec(f"{KIND} {name}: {exc}") from None
        found.append(Service(name, meta.get("namespace"), doc.get("spec") or {}, spec))
    if not found:
        raise InvalidSpec(f"no {KIND} ({API_VERSION}) found in the input")
    return found
