"""The bundled models: what `convert` makes of two miniature checkpoints in upstream's layout, one per family,
with random weights (miniature.py: CosyVoice2's built with upstream's classes, CosyVoice3's with the project's
implementation of them). They run every stage a converted model runs (the incremental streaming flow, the
family's seams and fixed noise, voices from spk2info.pt) at small layer sizes, so their audio is noise, not
speech. The same command gives the same bytes.

    python -m cosyvoice_server.convert.tiny [--out-dir inference_image/cosyvoice_server/models]   # make tiny-model
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import tempfile
from pathlib import Path

from . import miniature
from .convert import Options, convert

OPENAI_ALIASES = {"alloy": "default", "ash": "warm", "ballad": "warm", "cedar": "warm", "coral": "bright",
                  "echo": "default", "fable": "bright", "marin": "bright", "nova": "bright", "onyx": "warm",
                  "sage": "default", "shimmer": "bright", "verse": "default"}
VOICES = ("default", "bright", "warm")
# The released models' structure at small sizes, a speech vocabulary of 512 (the released models': 6561) and a
# text vocabulary of the miniature's own ids to keep the embeddings small. CosyVoice2's flow encoder stays 512
# wide whatever the config says (upstream's PreLookaheadLayer and Upsample1D have 512 channels built in): at one
# conformer block and 64 linear units it is 10.9 M parameters, most of the model.
TINY2 = dataclasses.replace(miniature.SIZES["mini"], speakers=VOICES, sft_speakers=2, speech_tokens=512,
                            encoder_units=64)
TINY3 = dataclasses.replace(miniature.MINI3, speakers=VOICES, speech_tokens=512, hift_channels=32,
                            hift_res_kernels=(3,), f0_channels=32, qwen_ids=False)


@dataclasses.dataclass(frozen=True)
class Bundled:
    family: str
    size: miniature.Size
    noise_seconds: float  # the longest segment, prompt included: the fixed noises are kept for this long


MODELS = {
    "tiny": Bundled("cosyvoice2", TINY2, 80),
    # CosyVoice3's vocoder noise takes 864 KB a second: the bundled model's segments stay under 12 s
    "tiny3": Bundled("cosyvoice3", TINY3, 12),
}
SEED = 0


def build(out_dir: Path, names: list[str] | None = None) -> list[Path]:
    written = []
    for name in names or list(MODELS):
        b = MODELS[name]
        with tempfile.TemporaryDirectory() as tmp:
            builder = miniature.build_cosyvoice3 if b.family == "cosyvoice3" else miniature.build_cosyvoice2
            ckpt = builder(Path(tmp) / f"miniature-{b.family}", b.size, SEED)
            target = out_dir / name
            model = convert(ckpt, Path(tmp) / name, ["fp32"], f"{b.family}-tiny",
                            Options(noise_seconds=b.noise_seconds, aliases=OPENAI_ALIASES))
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(model, target)
        written.append(target)
    return written


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out-dir", type=Path, default=Path(__file__).resolve().parents[1] / "models")
    ap.add_argument("--model", action="append", choices=sorted(MODELS), help="only these (default: all)")
    args = ap.parse_args(argv)
    for path in build(args.out_dir, args.model):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
