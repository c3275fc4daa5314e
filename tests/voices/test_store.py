"""The shared voice store on disk and the per-replica prompt cache."""

from __future__ import annotations

import os
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.engine.pipeline import load_voices
from cosyvoice_server.model.manifest import validate_model_dir
from cosyvoice_server.voices import store as store_mod
from cosyvoice_server.voices.store import PromptCache, VoiceExists, VoiceRecord


MANIFEST = validate_model_dir(BUNDLED_MODEL, "fp32")


def VoiceStore(root: Path) -> store_mod.VoiceStore:  # noqa: N802 - the store, for the bundled model
    return store_mod.VoiceStore(root, MANIFEST)


@pytest.fixture(scope="module")
def bundled():
    return load_voices(BUNDLED_MODEL, MANIFEST)


def record(name: str, **kw) -> VoiceRecord:
    fields = dict(name=name, mode="zero_shot", transcript="Hello there.", created_at=int(time.time()),
                  model="cosyvoice2-tiny", duration_seconds=5.0, sample_rate=24000, samples=120000, format="wav",
                  prompt_speech_tokens=10, sha256="0" * 64)
    return VoiceRecord(**(fields | kw))


def tree(root: Path) -> dict[str, bytes]:
    """Every file under the store's root and its content: what 'unchanged' compares."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def same_voice(a, b) -> bool:
    return all(np.array_equal(getattr(a, f), getattr(b, f))
               for f in ("embedding", "prompt_text_tokens", "prompt_speech_tokens", "prompt_mel"))


def test_a_voice_round_trips_and_leaves_no_staging(tmp_path, bundled):
    s = VoiceStore(tmp_path)
    s.add(record("alice"), bundled["warm"])
    assert s.exists("alice") and not s.exists("bob")
    assert s.record("alice") == record("alice", created_at=s.record("alice").created_at)
    assert [r.name for r in s.records()] == ["alice"] and s.count() == 1
    loaded = s.load("alice")
    assert loaded.name == "alice" and same_voice(loaded, bundled["warm"])
    assert not os.listdir(s.staging) and not os.listdir(s.trash)


def test_a_taken_name_is_refused_and_the_voice_kept(tmp_path, bundled):
    s = VoiceStore(tmp_path)
    s.add(record("alice"), bundled["warm"])
    before = tree(tmp_path)
    with pytest.raises(VoiceExists):
        s.add(record("alice", transcript="Other."), bundled["bright"])
    assert tree(tmp_path) == before


def _add_many(root: str, tag: int) -> list[bool]:
    voices = load_voices(BUNDLED_MODEL, MANIFEST)
    s = VoiceStore(Path(root))
    won = []
    for i in range(20):
        try:
            s.add(record(f"race-{i}", transcript=f"writer {tag}"), voices["warm" if tag else "bright"])
            won.append(True)
        except VoiceExists:
            won.append(False)
    return won


def test_two_processes_registering_the_same_names_get_one_voice_each(tmp_path, bundled):
    with ProcessPoolExecutor(2) as pool:
        a, b = pool.map(_add_many, [str(tmp_path)] * 2, [0, 1])
    assert all(x != y for x, y in zip(a, b))  # every name: exactly one winner
    s = VoiceStore(tmp_path)
    for i, first_won in enumerate(a):
        rec, voice = s.record(f"race-{i}"), s.load(f"race-{i}")
        # the stored tensors and metadata come from the same writer: never a mix
        assert rec.transcript == f"writer {0 if first_won else 1}"
        assert same_voice(voice, bundled["bright" if first_won else "warm"])
    assert not os.listdir(s.staging)


def test_a_failed_write_leaves_nothing(tmp_path, bundled, monkeypatch):
    s = VoiceStore(tmp_path)
    s.add(record("kept"), bundled["warm"])
    before = tree(tmp_path)

    def half_write(path, voice):
        path.write_bytes(b"PK\x03\x04 half a zip")
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(store_mod, "save_voice", half_write)
    with pytest.raises(OSError):
        s.add(record("broken"), bundled["warm"])
    assert tree(tmp_path) == before and not s.exists("broken")


def test_delete_removes_the_voice_at_once(tmp_path, bundled):
    s = VoiceStore(tmp_path)
    s.add(record("alice"), bundled["warm"])
    assert s.delete("alice") and not s.exists("alice") and s.record("alice") is None
    assert not s.delete("alice")
    assert tree(tmp_path) == {}
    s.add(record("alice"), bundled["bright"])  # the name is free again
    assert same_voice(s.load("alice"), bundled["bright"])


@pytest.mark.parametrize("name", ["../escape", "..", ".hidden", "Alice", "a/b", "ünïcode", "a" * 64, "", "a\n"])
def test_names_outside_the_pattern_never_touch_the_filesystem(tmp_path, name):
    s = VoiceStore(tmp_path / "store")
    (tmp_path / "escape").mkdir()
    assert not s.exists(name) and s.record(name) is None and not s.delete(name)
    assert s.identity(name) is None
    with pytest.raises(ValueError):
        s.path(name)
    assert (tmp_path / "escape").is_dir()


def test_leftovers_of_a_dead_writer_are_swept_but_not_a_live_one(tmp_path):
    s = VoiceStore(tmp_path)
    stale, live = s.staging / "stale", s.staging / "live"
    for d in (stale, live):
        d.mkdir()
        (d / "voice.npz").write_bytes(b"partial")
    old = time.time() - store_mod.STALE_STAGING_S - 60
    os.utime(stale, (old, old))
    (s.trash / "deleted").mkdir()
    VoiceStore(tmp_path)  # a replica starting
    assert sorted(os.listdir(s.staging)) == ["live"] and not os.listdir(s.trash)


def test_entries_that_are_not_voices_are_not_listed(tmp_path, bundled):
    s = VoiceStore(tmp_path)
    s.add(record("alice"), bundled["warm"])
    (s.voices / "lost+found").mkdir()  # what a fresh ext4 volume holds
    (s.voices / "empty").mkdir()
    assert [r.name for r in s.records()] == ["alice"]


def test_the_cache_serves_hits_and_sees_other_replicas_changes(tmp_path, bundled):
    s = VoiceStore(tmp_path)
    lookups = []
    cache = PromptCache(s, 10 * 2**20, lookups.append)
    assert cache.lookup("alice") is None and lookups == []
    s.add(record("alice"), bundled["warm"])
    first = cache.lookup("alice")
    assert same_voice(first, bundled["warm"]) and cache.lookup("alice") is first
    assert lookups == [False, True]
    # another replica replaces it: the next lookup reads the new tensors
    other = VoiceStore(tmp_path)
    other.delete("alice")
    assert cache.lookup("alice") is None and cache.bytes == 0
    other.add(record("alice"), bundled["bright"])
    assert same_voice(cache.lookup("alice"), bundled["bright"])


def test_the_cache_is_bounded_in_bytes_least_recently_used_first(tmp_path, bundled):
    s = VoiceStore(tmp_path)
    voice = bundled["warm"]
    size = voice.nbytes
    for name in ("a", "b", "c"):
        s.add(record(name), voice)
    cache = PromptCache(s, 2 * size)
    cache.lookup("a"), cache.lookup("b"), cache.lookup("a"), cache.lookup("c")  # b is the least recently used
    assert cache.bytes == 2 * size
    hits = []
    cache.on_lookup = hits.append
    cache.lookup("a"), cache.lookup("c"), cache.lookup("b")
    assert hits == [True, True, False]
    tiny = PromptCache(s, size - 1)  # a voice over the bound is served, never held
    assert tiny.lookup("a") is not None and tiny.bytes == 0


def test_a_damaged_voice_file_is_reported_with_its_path(tmp_path, bundled):
    s = VoiceStore(tmp_path)
    s.add(record("alice"), bundled["warm"])
    (s.voices / "alice" / "voice.npz").write_bytes(b"not a zip")
    with pytest.raises(Exception, match="not a readable .npz"):
        s.load("alice")


def test_a_serving_only_replica_reads_a_store_nobody_wrote_yet(tmp_path, bundled):
    reader = store_mod.VoiceStore(tmp_path, MANIFEST, writable=False)
    assert reader.records() == [] and reader.count() == 0 and not reader.exists("alice")
    assert list(tmp_path.iterdir()) == []  # it created nothing
    VoiceStore(tmp_path).add(record("alice"), bundled["warm"])
    assert [r.name for r in reader.records()] == ["alice"] and reader.count() == 1
    with pytest.raises(FileNotFoundError):
        store_mod.VoiceStore(tmp_path / "missing", MANIFEST, writable=False)
