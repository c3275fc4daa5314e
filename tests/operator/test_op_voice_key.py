"""The voice-registration key reaches the server the way the API key does: one Secret key projected as one
file, read-only, readable by the pod's user and group only, at the path the server is told to read."""
from __future__ import annotations

from test_op_render import env, pod, server

SPEC = {"voices": {"pvc": {"claimName": "voices"},
                   "registration": {"enabled": True, "keySecret": {"name": "keys", "key": "register"}}}}


def test_registration_key_is_mounted_read_only_as_the_file_the_server_reads() -> None:
    vol = next(v for v in pod(SPEC)["volumes"] if v["name"] == "registration-key")
    assert vol["secret"]["secretName"] == "keys"
    assert vol["secret"]["items"] == [{"key": "register", "path": "registration-key"}]
    assert vol["secret"]["defaultMode"] == 0o440  # the pod's user and group read it; nobody else, nothing runs it
    mount = next(m for m in server(SPEC)["volumeMounts"] if m["name"] == "registration-key")
    assert mount["readOnly"] is True
    assert env(SPEC)["COSYVOICE_VOICE_REGISTRATION_KEY_FILE"] == f"{mount['mountPath']}/registration-key"
