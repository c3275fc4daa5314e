"""Every Secret, ConfigMap and claim a pod would read is found, however it is named, so none escapes the
access check."""
from __future__ import annotations

from cosyvoice_operator import render as r


def test_objects_in_projected_volumes_and_env_from_are_found() -> None:
    pod = {"volumes": [
        {"name": "creds", "projected": {"sources": [
            {"configMap": {"name": "settings"}}, {"secret": {"name": "cloud"}}, {"secret": {}},
            {"serviceAccountToken": {"path": "token"}}]}},
        {"name": "plain", "secret": {"secretName": "key"}},
        {"name": "conf", "configMap": {"name": "tuning"}},
        {"name": "data", "persistentVolumeClaim": {"claimName": "db"}},
        {"name": "scratch", "emptyDir": {}}],
        "containers": [{"name": "server", "envFrom": [{"configMapRef": {"name": "cm"}}, {"secretRef": {"name": "env"}}]}]}
    assert r.objects_used(pod) == [
        ("ConfigMap", "volume creds", "settings"), ("Secret", "volume creds", "cloud"), ("Secret", "volume plain", "key"),
        ("ConfigMap", "volume conf", "tuning"), ("PersistentVolumeClaim", "volume data", "db"),
        ("ConfigMap", "envFrom of container server", "cm"), ("Secret", "envFrom of container server", "env")]
    assert r.objects_used({}) == []
