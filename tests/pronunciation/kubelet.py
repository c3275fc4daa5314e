"""A ConfigMap volume as the kubelet writes and updates it: files are links through `..data`, which is swapped
atomically to a new timestamped directory on each change."""

from __future__ import annotations

import os
from pathlib import Path


def kubelet_write(volume: Path, files: dict[str, str], generation: int) -> None:
    data = volume / f"..2026_01_01_00_00_{generation:02d}.000"
    data.mkdir(parents=True)
    for name, text in files.items():
        (data / name).write_text(text)
        if not (volume / name).is_symlink():
            (volume / name).symlink_to(f"..data/{name}")
    tmp = volume / "..data_tmp"
    tmp.symlink_to(data.name)
    os.replace(tmp, volume / "..data")
