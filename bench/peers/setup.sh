#!/usr/bin/env bash
# Installs what the peer servers (bench/peers) need, from PyPI only. Idempotent: a second run only checks.
#   bash bench/peers/setup.sh
# LitServe goes into the project's .venv when that changes no installed package, else into
# .bench-venvs/litserve. PyTriton always gets .bench-venvs/pytriton (it pins numpy 1.x and an older protobuf),
# with the same onnxruntime version as .venv so the engine under both peers is the same.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
PYTHON="${PYTHON:-python3}"
MAIN="$ROOT/.venv/bin/python"
VENVS="$ROOT/.bench-venvs"
LITSERVE="litserve==0.2.19"
PYTRITON="nvidia-pytriton==0.7.0"

[ -x "$MAIN" ] || make -C "$ROOT" install PYTHON="$PYTHON"

# Exit 0 when installing the requirements into that interpreter would only add packages.
only_adds() {
  local py="$1"; shift
  "$py" -m pip install --dry-run --quiet --report - "$@" 2>/dev/null | "$py" -c '
import json, sys
from importlib.metadata import PackageNotFoundError, version
changed = []
for item in json.load(sys.stdin)["install"]:
    name, new = item["metadata"]["name"], item["metadata"]["version"]
    try:
        old = version(name)
    except PackageNotFoundError:
        continue
    if old != new:
        changed.append(f"{name} {old} -> {new}")
if changed:
    print("would change: " + ", ".join(changed), file=sys.stderr)
sys.exit(1 if changed else 0)'
}

# A venv for one peer: its packages plus our pipeline (editable), reinstalled only when the spec changes.
venv_with() {
  local name="$1"; shift
  local dir="$VENVS/$name" spec="$* -e $ROOT/inference_image[cpu] $(cksum < "$ROOT/inference_image/pyproject.toml")"
  if [ -f "$dir/.installed" ] && [ "$(cat "$dir/.installed")" = "$spec" ]; then
    echo "$name: $dir up to date"; return
  fi
  [ -x "$dir/bin/python" ] || "$PYTHON" -m venv "$dir"
  "$dir/bin/python" -m pip install -q --upgrade pip
  "$dir/bin/python" -m pip install -q "$@" -e "$ROOT/inference_image[cpu]"
  echo "$spec" > "$dir/.installed"
  echo "$name: installed into $dir"
}

if "$MAIN" -c 'import sys, litserve; sys.exit(litserve.__version__ != sys.argv[1])' "${LITSERVE#*==}" 2>/dev/null; then
  echo "litserve: ${LITSERVE#*==} already in .venv"
elif only_adds "$MAIN" "$LITSERVE"; then
  "$MAIN" -m pip install -q "$LITSERVE"
  echo "litserve: installed into .venv"
else
  venv_with litserve "$LITSERVE"
fi

ORT="$("$MAIN" -c 'from importlib.metadata import version; print(version("onnxruntime"))')"
venv_with pytriton "$PYTRITON" "onnxruntime==$ORT"

# Triton's Python backend stub links libpython<major.minor>.so.1.0; pytriton_server.py puts this interpreter's
# LIBDIR first on LD_LIBRARY_PATH, so only an interpreter built without a shared library needs Debian's.
PT="$VENVS/pytriton/bin/python"
read -r PYVER LIBDIR < <("$PT" -c 'import sys, sysconfig; print(f"{sys.version_info[0]}.{sys.version_info[1]}", sysconfig.get_config_var("LIBDIR"))')
STUB="$("$PT" -c 'import pathlib, pytriton; print(pathlib.Path(pytriton.__file__).parent)')/tritonserver/python_backend_stubs/$PYVER/triton_python_backend_stub"
if LD_LIBRARY_PATH="$LIBDIR" ldd "$STUB" | grep -q "not found"; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "libpython$PYVER" >/dev/null
  fi
  if LD_LIBRARY_PATH="$LIBDIR" ldd "$STUB" | grep "not found"; then
    echo "pytriton: the Python backend stub is missing the libraries above; PeerServer will report it" >&2
  fi
fi
"$PT" -c 'import pytriton, cosyvoice_server' && echo "pytriton: ok ($PT)"
