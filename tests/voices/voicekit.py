"""Helpers of the voice tests: keys, registering a clip over HTTP, the store's contents."""

from __future__ import annotations

from pathlib import Path

import httpx

API_KEY, REGISTRATION_KEY, ADMIN_KEY = "synthesis-key", "registration-key", "voice-admin-key"
SYNTH = {"Authorization": f"Bearer {API_KEY}"}
ADMIN = {"Authorization": f"Bearer {REGISTRATION_KEY}"}  # the registration key: it manages the voices it registers
VOICE_ADMIN = {"Authorization": f"Bearer {ADMIN_KEY}"}  # the admin key: it deletes any registered voice


KEYS = {"COSYVOICE_API_KEY": API_KEY, "COSYVOICE_VOICE_REGISTRATION_KEY": REGISTRATION_KEY}


def registering_server(server_process, tmp: Path, store: Path, *extra: str):
    return server_process(tmp, "--voice-store-dir", str(store), "--allow-voice-registration", *extra, env=KEYS)


def register(url: str, name: str | None, audio: bytes | None, filename: str = "clip.wav",
             transcript: str | None = None, headers: dict | None = None, content_type: str | None = None,
             timeout: float = 60) -> httpx.Response:
    data = {k: v for k, v in (("name", name), ("transcript", transcript)) if v is not None}
    files = {"audio": (filename, audio, content_type) if content_type else (filename, audio)} if audio is not None else None
    if files is None:  # a form without a file part is still multipart
        files = {"other": ("x.txt", b"x")}
    return httpx.post(url + "/v1/audio/voices", data=data, files=files, headers=ADMIN if headers is None else headers,
                      timeout=timeout)


def tree(root: Path) -> dict[str, bytes]:
    """Every file under a store and its bytes: what 'the store is unchanged' compares."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _stat(pid: int | str) -> list[str]:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()  # fields 3.. of proc(5)


def _children(pid: int) -> list[int]:
    kids = []
    for p in Path("/proc").iterdir():
        try:
            if p.name.isdigit() and int(_stat(p.name)[1]) == pid:
                kids.append(int(p.name))
        except FileNotFoundError:  # a process that ended meanwhile
            pass
    return kids


def policies(pid: int) -> set[tuple[int, int]]:
    """(scheduling policy, nice) of every thread of a process (proc(5) fields 41 and 19)."""
    out = set()
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            fields = _stat(f"{pid}/task/{t.name}")
        except FileNotFoundError:  # a thread that ended meanwhile
            continue
        out.add((int(fields[38]), int(fields[16])))
    return out


def extraction_workers(server: int) -> list[int]:
    """The server's child processes that run in the background (the text workers run at its own priority)."""
    workers = []
    for k in _children(server):
        try:
            if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes() and policies(k) != policies(server):
                workers.append(k)
        except FileNotFoundError:  # a worker that ended meanwhile (killed and being replaced)
            pass
    return workers
