"""Every Secret a pod would read is found, however it is named, so none escapes the access check."""
from __future__ import annotations

from cosyvoice_operator import render as r


def test_secrets_in_projected_volumes_are_found() -> None:
    pod = {"volumes": [
        {"name": "creds", "projected": {"sources": [
            {"configMap": {"name": "settings"}}, {"secret": {"name": "cloud"}}, {"secret": {}},
            {"serviceAccountToken": {"path": "token"}}]}},
        {"name": "plain", "secret": {"secretName": "key"}},
        {"name": "scratch", "emptyDir": {}}],
        "containers": [{"name": "server", "envFrom": [{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "env"}}]}]}
    assert r.secrets_used(pod) == [("volume creds", "cloud"), ("volume plain", "key"), ("envFrom of container server", "env")]
    assert r.secrets_used({}) == []
