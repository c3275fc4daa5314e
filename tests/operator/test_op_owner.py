"""Children are owned by the CosyVoiceService they came from: name, namespace and uid from its body."""
from __future__ import annotations

from cosyvoice_operator import render as r
from cosyvoice_operator.spec import parse_spec


def test_owner_from_a_cr_body_and_from_a_file() -> None:
    owner = r.Owner.from_body({"metadata": {"name": "tts", "namespace": "speech", "uid": "u-1"}})
    assert owner == r.Owner("tts", "speech", "u-1")
    dep = r.render(owner, parse_spec({})).get("Deployment")
    assert dep is not None and dep["metadata"]["namespace"] == "speech"
    assert dep["metadata"]["ownerReferences"][0]["uid"] == "u-1"
    # `render` of a manifest file: no uid yet, the namespace kubectl would use
    assert r.Owner.from_body({"metadata": {"name": "tts"}}, default_namespace="team-a") == r.Owner("tts", "team-a")
    assert r.Owner.from_body({"metadata": {"name": "tts", "namespace": ""}}) == r.Owner("tts", "default")
