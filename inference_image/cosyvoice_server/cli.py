"""`cosyvoice-server`: serve, doctor, fetch, convert."""

from __future__ import annotations

import argparse
import logging
import os
import sys
from pathlib import Path

from . import __version__
from .config import ConfigError, Settings, env_name, flag_name, from_env_and_args


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="run the HTTP server", description="Every flag can also be set as the environment variable shown.")
    types = {name: Path for name, field in Settings.model_fields.items() if field.annotation in (Path, Path | None)}
    for name, field in Settings.model_fields.items():
        flag = flag_name(name)
        if flag is None:
            continue
        ann = field.annotation
        kind = types.get(name) or (int if ann in (int, int | None) else float if ann is float else str)
        choices = getattr(ann, "__args__", None) if str(ann).startswith("typing.Literal") else None
        # A switch given alone turns on (`--allow-voice-registration`); `--docs false` still works.
        switch = {"nargs": "?", "const": "true"} if ann is bool else {}
        p.add_argument(flag, type=kind, choices=choices, default=None, **switch,
                       help=f"{field.description or ''} [env {env_name(name)}; default {field.default}]")


def _serve(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    try:
        settings = from_env_and_args(vars(args))
    except ValidationError as exc:
        for e in exc.errors():
            print(f"error: {'.'.join(map(str, e['loc']))}: {e['msg']}", file=sys.stderr)
        return 2
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # The server's own matrix products are small (a clip's filterbanks): a second OpenBLAS thread made them
    # 13 % faster for 73 % more CPU (bench/blas_threads.py) (it spins), taken from the flow's cores. Set before numpy loads; the text
    # and voice worker processes inherit it.
    for var in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ.setdefault(var, "1")
    from . import onnxruntime_install

    if problem := onnxruntime_install.problem(onnxruntime_install.installed_builds()):
        print(f"error: {problem}", file=sys.stderr)
        return 2
    # Fail fast, before listening, on what the operator or user can fix: the model files and the device.
    from .engine.runtime import DeviceError, Runtime, RuntimeOptions
    from .model.manifest import ModelLoadError, validate_model_dir

    try:
        validate_model_dir(settings.model_dir, extra_aliases=settings.voice_alias_table())
        Runtime(settings.device, RuntimeOptions(device_id=settings.device_id))
        settings.resolved_api_key()
        settings.resolved_registration_key()
        settings.resolved_admin_key()
    except (ModelLoadError, DeviceError, ConfigError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    from .server import run

    return run(settings)


def _doctor(_: argparse.Namespace) -> int:
    from . import onnxruntime_install

    builds = onnxruntime_install.installed_builds()
    if problem := onnxruntime_install.problem(builds):
        print(f"ONNX Runtime: NOT usable: {problem}")
        return 1
    import onnxruntime as ort

    from .engine.runtime import DeviceError, Runtime, cuda_missing_reason
    from .gpu import nvml_devices

    print(f"cosyvoice-server {__version__}")
    print(f"onnxruntime {ort.__version__} (from {builds[0]}); providers: {', '.join(ort.get_available_providers())}")
    devices, driver = nvml_devices()
    print(f"NVIDIA driver: {driver or 'not found (NVML unavailable)'}")
    for d in devices:
        kind = f"MIG {d.mig_profile} {d.mig_uuid}" if d.mig_uuid else "whole GPU"
        print(f"  {d.name} {d.gpu_uuid}: {kind}, memory {d.memory_used / 2**30:.1f}/{d.memory_total / 2**30:.1f} GiB")
    if hasattr(ort, "get_build_info"):
        print(f"build: {ort.get_build_info()}")
    missing = cuda_missing_reason()
    if missing is None:
        try:
            Runtime("cuda")
            print("--device cuda: usable")
            return 0
        except DeviceError as exc:
            missing = str(exc)
    print(f"--device cuda: NOT usable: {missing}")
    print("--device auto will use the CPU.")
    return 0


def _size(text: str) -> int:
    """Bytes, with an optional Kubernetes-style suffix (Ki, Mi, Gi, Ti, K, M, G, T)."""
    units = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}
    for suffix, factor in units.items():
        if text.endswith(suffix) and text[: -len(suffix)].isdigit():
            return int(text[: -len(suffix)]) * factor
    if text.isdigit():
        return int(text)
    raise argparse.ArgumentTypeError(f"not a size: {text!r} (e.g. 20Gi)")


def _fetch(args: argparse.Namespace) -> int:
    from .fetch import FetchError, Limits, fetch, shown, sigterm_raises
    from .model_cache import CacheError, ensure
    from .startup import Phases

    if (args.dest is None) == (args.cache_dir is None):
        print("error: give exactly one of --dest or --cache-dir", file=sys.stderr)
        return 2
    if args.cache_dir is not None and not args.sha256:
        print("error: --cache-dir needs --sha256: cache entries are named and checked by the archive's digest",
              file=sys.stderr)
        return 2
    logging.basicConfig(level="INFO", format="%(message)s", stream=sys.stdout)
    phases = Phases(emit=lambda line: print(line, flush=True))
    limits = Limits(args.max_bytes, args.max_files, args.timeout_s)
    try:
        with sigterm_raises():
            if args.cache_dir is None:
                root = fetch(args.uri, Path(args.dest), args.sha256, limits, phases)
            else:  # a wait for another pod's fill of the same entry is bounded by that pod's deadline
                root = ensure(Path(args.cache_dir), args.sha256,
                              lambda dest: fetch(args.uri, dest, args.sha256, limits, phases), phases,
                              args.cache_max_bytes, args.cache_min_idle_s)
    except CacheError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except FetchError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Exception as exc:  # one line for the pod's termination message, never a traceback
        print(f"error: {shown(args.uri)}: {exc.__class__.__name__}: {exc}".splitlines()[0], file=sys.stderr)
        return 1
    print(root)
    return 0


def _convert(args: argparse.Namespace) -> int:
    logging.basicConfig(level="WARNING", format="%(levelname)s %(name)s: %(message)s")
    from .convert.checkpoint import ConvertError
    from .convert.convert import Options, convert
    from .model.manifest import ModelLoadError

    try:
        aliases = dict(a.split("=", 1) for a in args.voice_alias)
        voices = {}
        for v in args.voice:
            name, _, rest = v.partition("=")
            clip, _, transcript = rest.partition(":")
            voices[name] = (Path(clip), transcript or None)
        out = convert(Path(args.checkpoint), Path(args.out), [p.strip() for p in args.precision.split(",") if p.strip()],
                      args.name, Options(args.noise_seconds, aliases, voices))
    except (ConvertError, ModelLoadError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(out)
    return 0


def main(argv: list[str] | None = None) -> int:
    from .fetch import Limits
    from .model_cache import DEFAULT_MAX_BYTES, DEFAULT_MIN_IDLE_S

    parser = argparse.ArgumentParser(prog="cosyvoice-server", description=__doc__)
    parser.add_argument("--version", action="version", version=__version__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    sub.add_parser("doctor", help="report ONNX Runtime, CUDA and GPU/MIG facts, and what --device cuda lacks")
    f = sub.add_parser("fetch", help="download/unpack a model directory (the operator's init container)")
    f.add_argument("--uri", required=True, help="path, file://, http(s)://, s3:// or gs:// of a directory or archive")
    defaults = Limits()
    f.add_argument("--dest", help="directory to fill (or --cache-dir)")
    f.add_argument("--sha256", help="expected SHA-256 of the archive")
    f.add_argument("--cache-dir", help="node-local model cache: the model lands in CACHE_DIR/sha256-<digest>/model, "
                                       "fetched only if absent or damaged (needs --sha256)")
    f.add_argument("--cache-max-bytes", type=_size, default=DEFAULT_MAX_BYTES,
                   help="evict least recently used cache entries above this size (default 100Gi)")
    f.add_argument("--cache-min-idle-s", type=float, default=DEFAULT_MIN_IDLE_S,
                   help="never evict an entry used this recently (default %(default)s)")
    f.add_argument("--max-bytes", type=_size, default=defaults.max_bytes,
                   help="largest download, and largest unpacked size (default 20Gi)")
    f.add_argument("--max-files", type=int, default=defaults.max_files, help="most files in the model (default %(default)s)")
    f.add_argument("--timeout-s", type=float, default=defaults.timeout_s,
                   help="deadline for the whole fetch in seconds (default %(default)s)")
    c = sub.add_parser("convert", help="convert a published CosyVoice2 or CosyVoice3 checkpoint into a model directory",
                       description="Needs the 'convert' extra (pip install 'cosyvoice-server[convert]'); a CosyVoice2 "
                                   "checkpoint also upstream's model code: pip install --no-deps cosyvoice-minicpmo==0.1.0")
    c.add_argument("--checkpoint", required=True, help="the checkpoint directory as published (cosyvoice3.yaml or "
                                                       "cosyvoice2.yaml, llm.pt, ...)")
    c.add_argument("--out", required=True, help="model directory to create (must not exist)")
    c.add_argument("--precision", default="fp32", help="fp32 or fp32,fp16 (fp16 files for the GPU)")
    c.add_argument("--name", help="model name in model.yaml and the API (default: the checkpoint directory's name)")
    c.add_argument("--noise-seconds", type=float, help="keep this many seconds of upstream's fixed noise (default: "
                   "all 300): it bounds the longest segment, prompt included; CosyVoice3's vocoder noise takes 864 KB a second")
    c.add_argument("--voice-alias", action="append", default=[], metavar="ALIAS=VOICE",
                   help="another name for a voice, e.g. alloy=dave (repeatable)")
    c.add_argument("--voice", action="append", default=[], metavar="NAME=CLIP[:TRANSCRIPT]",
                   help="a voice from a clip (WAV, FLAC, MP3 or Ogg, 30 s at most) and the words spoken in it, made as "
                        "the server registers one; without a transcript a cross-lingual voice; the first is the default "
                        "(repeatable; needed for a checkpoint without spk2info.pt)")
    args = parser.parse_args(argv)
    return {"serve": _serve, "doctor": _doctor, "fetch": _fetch, "convert": _convert}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
