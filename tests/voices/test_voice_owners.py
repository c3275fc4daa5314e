"""Who may do what with registered voices, over HTTP: owners (the registering key's identity), the admin key,
transcripts for the keys that manage voices only, per-owner and total quotas, voices from before owners, and a
damaged record that must not take the listing down."""

from __future__ import annotations

import json
import shutil

import httpx
import pytest

from clips import wav
from voicekit import ADMIN, ADMIN_KEY, API_KEY, KEYS, REGISTRATION_KEY, SYNTH, VOICE_ADMIN, register

from cosyvoice_server.api.auth import ANONYMOUS, VoiceCaller, key_fingerprint, voice_caller
from cosyvoice_server.config import ConfigError, Settings

OTHER_KEY = "other-registration-key"
OTHER = {"Authorization": f"Bearer {OTHER_KEY}"}  # a second service's registration key on the same store
LIMITS = {"COSYVOICE_MAX_VOICES_PER_OWNER": "2", "COSYVOICE_MAX_REGISTERED_VOICES": "3"}


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    return tmp_path_factory.mktemp("owned-voices")


def _server(server_process, tmp, store, registration_key):
    env = KEYS | LIMITS | {"COSYVOICE_VOICE_REGISTRATION_KEY": registration_key, "COSYVOICE_VOICE_ADMIN_KEY": ADMIN_KEY}
    return server_process(tmp, "--voice-store-dir", str(store), "--allow-voice-registration", env=env)


@pytest.fixture(scope="module")
def servers(server_process, tmp_path_factory, store):
    a = _server(server_process, tmp_path_factory.mktemp("a"), store, REGISTRATION_KEY)
    b = _server(server_process, tmp_path_factory.mktemp("b"), store, OTHER_KEY)
    yield a.wait_ready(), b.wait_ready()
    a.stop(), b.stop()


@pytest.fixture
def a(servers, store):
    yield servers[0]
    for d in (store / "voices").iterdir():  # each test starts from an empty store
        shutil.rmtree(d)


def error_of(r: httpx.Response, status: int, code: str) -> str:
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert set(err) == {"message", "type", "param", "code"} and err["code"] == code, err
    return err["message"]


def registered(url: str, headers: dict) -> dict[str, dict]:
    r = httpx.get(url + "/v1/audio/voices", headers=headers)
    assert r.status_code == 200, r.text
    return {v["id"]: v for v in r.json()["voices"] if v["type"] == "registered"}


def add(url: str, name: str, headers: dict = ADMIN) -> httpx.Response:
    return register(url, name, wav(2.0, 24000), transcript=f"I am {name}.", headers=headers)


def delete(url: str, name: str, headers: dict) -> httpx.Response:
    return httpx.delete(f"{url}/v1/audio/voices/{name}", headers=headers)


def test_transcripts_and_owners_are_shown_to_the_keys_that_manage_voices_only(a, store):
    assert add(a.url, "alice").status_code == 201
    owner = key_fingerprint(REGISTRATION_KEY)
    for headers in (ADMIN, VOICE_ADMIN):
        for card in (registered(a.url, headers)["alice"], httpx.get(a.url + "/v1/audio/voices/alice", headers=headers).json()):
            assert card["transcript"] == "I am alice." and card["owner"] == owner
    for card in (registered(a.url, SYNTH)["alice"], httpx.get(a.url + "/v1/audio/voices/alice", headers=SYNTH).json()):
        assert "transcript" not in card and "owner" not in card and card["mode"] == "zero_shot"
    stored = (store / "voices" / "alice" / "voice.json").read_text()
    assert json.loads(stored)["owner"] == owner and REGISTRATION_KEY not in stored  # an identity, never the key


def test_only_the_registering_key_or_the_admin_key_deletes_a_voice(servers, a):
    b = servers[1]
    assert add(a.url, "alice").status_code == 201 and add(b.url, "bob", OTHER).status_code == 201
    error_of(delete(b.url, "alice", OTHER), 403, "not_voice_owner")
    error_of(delete(a.url, "bob", ADMIN), 403, "not_voice_owner")
    error_of(delete(a.url, "alice", SYNTH), 403, "insufficient_scope")
    assert set(registered(a.url, SYNTH)) == {"alice", "bob"}
    assert delete(a.url, "alice", ADMIN).status_code == 200  # its own, through either replica
    assert delete(a.url, "bob", VOICE_ADMIN).status_code == 200  # any, with the admin key
    assert registered(b.url, SYNTH) == {}
    msg = error_of(add(a.url, "carol", VOICE_ADMIN), 403, "insufficient_scope")
    assert "admin key deletes voices but does not register" in msg


def test_a_voice_from_before_owners_is_deleted_by_the_admin_key_only(a, store):
    assert add(a.url, "elder").status_code == 201
    path = store / "voices" / "elder" / "voice.json"
    old = {k: v for k, v in json.loads(path.read_text()).items()
           if k not in ("owner", "schema_version", "min_reader_version")}  # what the first version wrote
    path.write_text(json.dumps(old))
    assert registered(a.url, ADMIN)["elder"]["owner"] is None
    msg = error_of(delete(a.url, "elder", ADMIN), 403, "not_voice_owner")
    assert "before voices had owners" in msg
    assert delete(a.url, "elder", VOICE_ADMIN).status_code == 200


def test_quotas_per_owner_and_for_the_store(servers, a, store):
    b = servers[1]
    assert add(a.url, "a1").status_code == 201 and add(a.url, "a2").status_code == 201
    msg = error_of(add(a.url, "a3"), 409, "voice_quota_exceeded")
    assert "(2)" in msg
    assert add(b.url, "b1", OTHER).status_code == 201  # another owner still has room: 3 voices in all
    error_of(add(b.url, "b2", OTHER), 409, "voice_store_full")
    assert set(registered(a.url, SYNTH)) == {"a1", "a2", "b1"} and not (store / "voices" / "a3").exists()
    assert delete(a.url, "a1", ADMIN).status_code == 200
    assert add(b.url, "b2", OTHER).status_code == 201  # room again
    metrics = a.metrics()
    assert 'cosyvoice_voice_registrations_total{result="voice_quota_exceeded"} 1.0' in metrics


def test_a_damaged_record_leaves_the_listing_up_and_is_named(a, store):
    assert add(a.url, "good").status_code == 201 and add(a.url, "damaged").status_code == 201
    path = store / "voices" / "damaged" / "voice.json"
    path.write_bytes(path.read_bytes()[:50])  # truncated, as by a full disk or a crash of another writer
    assert set(registered(a.url, SYNTH)) == {"good"}
    msg = error_of(httpx.get(a.url + "/v1/audio/voices/damaged", headers=SYNTH), 500, "voice_unreadable")
    assert "record cannot be read" in msg and "Traceback" not in msg
    assert 'cosyvoice_voice_store_unreadable_records{reason="invalid_json"} 1.0' in a.metrics()
    assert "voice damaged" in a.log()
    error_of(delete(a.url, "damaged", ADMIN), 403, "not_voice_owner")  # its owner cannot be told
    assert delete(a.url, "damaged", VOICE_ADMIN).status_code == 200
    assert set(registered(a.url, SYNTH)) == {"good"}
    assert 'cosyvoice_voice_store_unreadable_records{reason="invalid_json"} 0.0' in a.metrics()


# (case, token presented, keys in force (api, registration, admin), registration on, expected caller or None: 401)
REG_OWNER = key_fingerprint("r")
CALLERS = [
    ("no keys, registration on: everyone manages", None, (None, None, None), True,
     VoiceCaller(register=True, admin=True, owner=ANONYMOUS)),
    ("no keys, registration off: everyone only reads", None, (None, None, None), False, VoiceCaller()),
    ("open registration beside an admin key", None, (None, None, "x"), True, VoiceCaller(register=True, owner=ANONYMOUS)),
    ("registration key", "r", ("a", "r", "x"), True, VoiceCaller(register=True, owner=REG_OWNER)),
    ("admin key", "x", ("a", "r", "x"), True, VoiceCaller(admin=True)),
    ("API key", "a", ("a", "r", "x"), True, VoiceCaller()),
    ("wrong key", "w", ("a", "r", "x"), True, None),
    ("no key where one is required", None, ("a", "r", "x"), True, None),
    ("no API key, registration keyed: anyone reads", "w", (None, "r", None), True, VoiceCaller()),
]


@pytest.mark.parametrize("case, token, keys, registration_open, expected", CALLERS, ids=[c[0] for c in CALLERS])
def test_who_a_caller_is(case, token, keys, registration_open, expected):
    tokens = [] if token is None else [token]
    assert voice_caller(tokens, *keys, registration_open=registration_open, owner_name=None) == expected


def test_a_named_owner_survives_a_key_rotation_and_the_admin_key_must_be_its_own():
    for key in ("r1", "r2"):
        assert voice_caller([key], None, key, None, registration_open=True, owner_name="consent-app").owner == "consent-app"
    assert key_fingerprint("r1") != key_fingerprint("r2")
    for clash in ({"api_key": "k"}, {"voice_registration_key": "k"}):
        with pytest.raises(ConfigError, match="admin key equals"):
            Settings(**clash, voice_admin_key="k").resolved_admin_key()
    with pytest.raises(ConfigError, match="blank"):
        Settings(voice_admin_key=" ").resolved_admin_key()
    assert API_KEY not in key_fingerprint(API_KEY)
