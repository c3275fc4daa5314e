"""The server's pronunciation lexicons: the PLS files of `--lexicon-dir`, kept current while it runs.

Each `*.pls` file in the directory, or one directory down (a ConfigMap volume per lexicon), is a lexicon
named by its file's stem. The directory is polled: when a file's target, size or modification time changes
(kubelet updates a ConfigMap volume by swapping its `..data` symlink to a new directory) every file is read
again and the new set replaces the old at once. A file that does not parse keeps its last good version if
it had one, and is listed with its error.
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path

from .pronunciation.lexicon import NAME, Lexicon, LexiconError, Matcher, parse_pls

log = logging.getLogger(__name__)

POLL_S = 1.0


@dataclass(frozen=True)
class Entry:
    name: str
    lexicon: Lexicon | None  # None: never readable
    error: str | None = None  # the last read's problem


def lexicon_files(directory: Path) -> dict[str, Path]:
    """name -> file: `*.pls` here and one level down, skipping kubelet's hidden `..` directories."""
    found: dict[str, Path] = {}
    for path in sorted([*directory.glob("*.pls"), *directory.glob("*/*.pls")]):
        if any(part.startswith(".") for part in path.relative_to(directory).parts):
            continue
        if re.match(NAME, path.stem):
            found.setdefault(path.stem, path)
        else:
            log.warning("lexicon file %s: its name is not a lexicon name (lowercase letters, digits, '.', '_', "
                        "'-'); skipped", path)
    return found


def _signature(files: dict[str, Path]) -> tuple:
    sig = []
    for name, path in sorted(files.items()):
        try:
            st = path.stat()
            sig.append((name, os.path.realpath(path), st.st_mtime_ns, st.st_size))
        except OSError:
            sig.append((name, None, 0, 0))
    return tuple(sig)


class LexiconStore:
    def __init__(self, directory: Path | None, defaults: list[str]) -> None:
        self.directory = directory
        self.defaults = defaults
        self.entries: dict[str, Entry] = {}
        self._signature: tuple | None = None
        self._matchers: dict[tuple[str, ...], Matcher] = {}
        self.reload()

    def reload(self) -> bool:
        """Reads the directory again if anything in it changed; True when it did."""
        if self.directory is None:
            return False
        files = lexicon_files(self.directory) if self.directory.is_dir() else {}
        sig = _signature(files)
        if sig == self._signature:
            return False
        entries: dict[str, Entry] = {}
        for name, path in files.items():
            old = self.entries.get(name)
            try:
                entries[name] = Entry(name, parse_pls(name, path.read_text(encoding="utf-8")))
            except (LexiconError, OSError, UnicodeDecodeError) as exc:
                error = str(exc) if isinstance(exc, LexiconError) else f"lexicon '{name}': cannot read {path}: {exc}"
                log.error("%s%s", error, "; keeping its last good version" if old and old.lexicon else "")
                entries[name] = Entry(name, old.lexicon if old else None, error)
        for name in self.defaults:
            if name not in entries:
                log.error("default lexicon '%s' is not in %s", name, self.directory)
        self.entries, self._signature, self._matchers = entries, sig, {}
        log.info("lexicons: %s", ", ".join(f"{n} ({len(e.lexicon.entries) if e.lexicon else 0} graphemes)"
                                            for n, e in entries.items()) or "none")
        return True

    def matcher(self, names: list[str] | None) -> Matcher | None:
        """The lexicons a request applies (None: the defaults that are readable); KeyError names an unknown one,
        LookupError one that cannot be read."""
        if names is None:
            names = [n for n in self.defaults if n in self.entries and self.entries[n].lexicon is not None]
        for name in names:
            if name not in self.entries:
                raise KeyError(name)
            if self.entries[name].lexicon is None:
                raise LookupError(name)
        if not names:
            return None
        key = tuple(names)
        if key not in self._matchers:
            self._matchers[key] = Matcher(tuple(self.entries[n].lexicon for n in names))
        return self._matchers[key]

    async def watch(self) -> None:
        """Polls the directory until cancelled (reads happen on a thread: a ConfigMap holds up to 1 MiB)."""
        while True:
            await asyncio.sleep(POLL_S)
            try:
                await asyncio.to_thread(self.reload)
            except Exception:  # never let a bad read end the watch
                log.exception("reading the lexicons failed")
