"""Damaged voice records on the shared store: truncated, retyped, extended, from a newer server, missing a
file, or bit-flipped. Each must be read or skipped with a reason (UnreadableRecord), never raise anything
else, and never hide the store's other voices."""

from __future__ import annotations

import json
import time

import numpy as np
import pytest

from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.engine.pipeline import load_voices
from cosyvoice_server.model.manifest import validate_model_dir
from cosyvoice_server.voices.store import (MAX_RECORD_BYTES, METADATA, SCHEMA_VERSION, TENSORS, UnreadableRecord,
                                           VoiceRecord, VoiceStore, record_json)

MANIFEST = validate_model_dir(BUNDLED_MODEL, "fp32")


def record(name: str) -> VoiceRecord:
    return VoiceRecord(name=name, mode="zero_shot", transcript="Hello there.", created_at=int(time.time()),
                       model="cosyvoice2-tiny", duration_seconds=5.0, sample_rate=24000, samples=120000, format="wav",
                       prompt_speech_tokens=10, sha256="0" * 64, owner="key:0123456789abcdef")


@pytest.fixture(scope="module")
def voice():
    return load_voices(BUNDLED_MODEL, MANIFEST)["warm"]


@pytest.fixture
def store(tmp_path, voice):
    s = VoiceStore(tmp_path, MANIFEST)
    s.add(record("good"), voice)
    s.add(record("victim"), voice)
    return s


def rewrite(s: VoiceStore, change) -> None:
    path = s.voices / "victim" / METADATA
    data = json.loads(path.read_text())
    path.write_text(json.dumps(change(data)) if callable(change) else change)


def retyped(field: str, value):
    return lambda d: d | {field: value}


# (case, what is done to the victim's directory, the reason it is skipped for; None: it is still read)
DAMAGE = [
    ("truncated", lambda s: (s.voices / "victim" / METADATA).write_bytes(
        (s.voices / "victim" / METADATA).read_bytes()[:40]), "invalid_json"),
    ("empty file", lambda s: rewrite(s, ""), "invalid_json"),
    ("not utf-8", lambda s: (s.voices / "victim" / METADATA).write_bytes(b"\xff\xfe{}"), "invalid_json"),
    ("a list", lambda s: rewrite(s, "[]"), "invalid_record"),
    ("null", lambda s: rewrite(s, "null"), "invalid_record"),
    ("an unknown extra key", lambda s: rewrite(s, retyped("language", "en")), None),
    ("samples as a string", lambda s: rewrite(s, retyped("samples", "120000")), "invalid_record"),
    ("transcript as a number", lambda s: rewrite(s, retyped("transcript", 5)), "invalid_record"),
    ("created_at as a bool", lambda s: rewrite(s, retyped("created_at", True)), "invalid_record"),
    ("an unknown mode", lambda s: rewrite(s, retyped("mode", "sft")), "invalid_record"),
    ("owner as a list", lambda s: rewrite(s, retyped("owner", ["a"])), "invalid_record"),
    ("a field missing", lambda s: rewrite(s, lambda d: {k: v for k, v in d.items() if k != "sha256"}), "invalid_record"),
    ("another voice's name", lambda s: rewrite(s, retyped("name", "good")), "invalid_record"),
    ("schema_version a string", lambda s: rewrite(s, retyped("schema_version", "2")), "invalid_record"),
    ("newer, compatible schema with a new field", lambda s: rewrite(
        s, lambda d: d | {"schema_version": SCHEMA_VERSION + 1, "language": "en"}), None),
    ("newer, incompatible schema", lambda s: rewrite(
        s, lambda d: d | {"schema_version": SCHEMA_VERSION + 1, "min_reader_version": SCHEMA_VERSION + 1}),
     "newer_schema"),
    ("newer schema saying nothing of its readers", lambda s: rewrite(
        s, lambda d: {k: v for k, v in d.items() if k != "min_reader_version"} | {"schema_version": SCHEMA_VERSION + 1}),
     "newer_schema"),
    ("schema 1 (no version, no owner)", lambda s: rewrite(
        s, lambda d: {k: v for k, v in d.items() if k not in ("schema_version", "min_reader_version", "owner")}), None),
    ("over the size bound", lambda s: rewrite(s, retyped("transcript", "x" * MAX_RECORD_BYTES)), "invalid_record"),
    ("tensors missing", lambda s: (s.voices / "victim" / TENSORS).unlink(), "missing_tensors"),
    ("record missing", lambda s: (s.voices / "victim" / METADATA).unlink(), "missing_metadata"),
    ("record a directory", lambda s: ((s.voices / "victim" / METADATA).unlink(),
                                      (s.voices / "victim" / METADATA).mkdir()), "unreadable"),
]


@pytest.mark.parametrize("case, damage, reason", DAMAGE, ids=[d[0] for d in DAMAGE])
def test_a_damaged_record_is_skipped_with_its_reason_and_hides_nothing(store, case, damage, reason):
    damage(store)
    listed = [r.name for r in store.records()]
    if reason is None:  # read: what this version knows of it
        assert listed == ["good", "victim"]
        assert store.record("victim").transcript == "Hello there."
        assert sum(store.unreadable.values()) == 0
        return
    assert listed == ["good"]
    assert store.unreadable[reason] == 1 and sum(store.unreadable.values()) == 1
    with pytest.raises(UnreadableRecord) as err:
        store.record("victim")
    assert err.value.reason == reason and "victim" in str(err.value)
    assert store.usage("key:0123456789abcdef") == (2, 1)  # it still counts against the store's cap


def test_each_damaged_record_is_logged_once(store, caplog):
    rewrite(store, "{")
    for _ in range(3):
        store.records()
    assert sum("victim" in r.getMessage() for r in caplog.records) == 1
    (store.voices / "victim" / METADATA).write_text(record_json(record("victim")))  # repaired
    assert [r.name for r in store.records()] == ["good", "victim"] and store.unreadable["invalid_json"] == 0


def test_bit_flipped_and_truncated_records_are_read_or_refused(store):
    raw = (store.voices / "victim" / METADATA).read_bytes()
    rng = np.random.default_rng(27)
    for i in range(400):
        b = bytearray(raw[: rng.integers(0, len(raw) + 1)] if i % 2 else raw)
        for _ in range(rng.integers(0, 6)):
            if b:
                b[int(rng.integers(len(b)))] ^= 1 << int(rng.integers(8))
        (store.voices / "victim" / METADATA).write_bytes(bytes(b))
        try:
            rec = store.record("victim")
        except UnreadableRecord as exc:
            assert exc.reason in ("invalid_json", "invalid_record", "newer_schema")
        else:
            assert isinstance(rec, VoiceRecord) and rec.name == "victim"
        assert "good" in [r.name for r in store.records()]
