"""Upstream CosyVoice3's own PyTorch inference behind the speech API, from a local checkout of
FunAudioLLM/CosyVoice (a `git clone`; no package ships upstream's CosyVoice3 code, and neither the server nor
the test suite needs it), run the way upstream's FastAPI server runs it: one `CosyVoice3Model` shared by every
request, its `tts` generator iterated in a thread per request (its LLM in a thread of its own).

The models are upstream's classes from the checkout, built from the checkpoint's cosyvoice3.yaml by
hyperpyyaml (its training sections dropped) with the checkpoint's state dicts. Everything that runs is
upstream's code but for one thing: `token_hop_len`, which upstream's model keeps on the shared object and
grows across requests (its issues #1798, #1849), belongs to the request here (each request iterates the `tts`
of a shallow copy of the model: the same modules and per-request dictionaries, its own hop), so every
request streams with upstream's intended hops. torchaudio (imported for training-time features: not on PyPI for
every torch) is a stand-in module; nothing timed calls it. Text goes through the converted model's tokenizer,
which is upstream's CosyVoice3 vocabulary; upstream's text normalisation is not part of what is timed.

    python -m bench.vs_upstream.upstream3_server --upstream PATH/TO/CosyVoice --checkpoint CKPT \
        --model-dir CONVERTED --port 8100 [--threads 2]
"""

from __future__ import annotations

import argparse
import copy
import importlib.machinery
import sys
import threading
import time
import types
from collections import defaultdict
from pathlib import Path

import torch
import uvicorn

from cosyvoice_server.convert import upstream
from cosyvoice_server.convert.miniature import upstream_modules
from cosyvoice_server.frontend import TextFrontend
from cosyvoice_server.model.manifest import load_manifest

from .upstream_server import app


def _stand_in_torchaudio() -> None:
    for name in ("torchaudio", "torchaudio.compliance", "torchaudio.compliance.kaldi", "torchaudio.transforms"):
        mod = types.ModuleType(name)
        mod.__spec__ = importlib.machinery.ModuleSpec(name, None)
        mod.__path__ = []
        sys.modules.setdefault(name, mod)
    sys.modules["torchaudio"].compliance = sys.modules["torchaudio.compliance"]
    sys.modules["torchaudio.compliance"].kaldi = sys.modules["torchaudio.compliance.kaldi"]


class Upstream:
    def __init__(self, checkout: Path, ckpt: Path, model_dir: Path) -> None:
        if not (checkout / "cosyvoice" / "cli" / "model.py").is_file():
            raise SystemExit(f"{checkout}: not a checkout of FunAudioLLM/CosyVoice (no cosyvoice/cli/model.py)")
        _stand_in_torchaudio()
        upstream.stub_matcha()
        sys.path.insert(0, str(checkout))
        from cosyvoice.cli.model import CosyVoice3Model

        configs = upstream_modules((ckpt / "cosyvoice3.yaml").read_text(), ckpt / "CosyVoice-BlankEN")
        self.model = CosyVoice3Model(configs["llm"], configs["flow"], configs["hift"], fp16=False)
        self.model.load(str(ckpt / "llm.pt"), str(ckpt / "flow.pt"), str(ckpt / "hift.pt"))
        self.spk2info = torch.load(ckpt / "spk2info.pt", weights_only=True)
        m = load_manifest(model_dir)
        self.frontend = TextFrontend.of_model(model_dir, m.frontend)
        self.default_voice = m.voices.default
        self.seconds: dict[str, float] = defaultdict(float)
        self._lock = threading.Lock()
        for stage, module, method in (("llm", self.model.llm, "forward_one_step"), ("flow", self.model.flow, "inference"),
                                      ("vocoder", self.model.hift, "inference")):
            self._time(stage, module.llm if stage == "llm" else module, method)

    def _time(self, stage: str, obj, method: str) -> None:
        """Adds each call's seconds to the stage's total (the /stats the benchmark reads)."""
        fn = getattr(obj, method)

        def timed(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                with self._lock:
                    self.seconds[stage] += time.perf_counter() - t0

        setattr(obj, method, timed)

    def tts(self, text: list[int], voice: str, stream: bool):
        model = copy.copy(self.model)
        model.token_hop_len = 25  # upstream's first hop, for this request alone
        model_input = {**self.spk2info[voice], "text": torch.tensor([text], dtype=torch.int32),
                       "text_len": torch.tensor([len(text)], dtype=torch.int32)}
        for out in model.tts(**model_input, stream=stream):
            yield out["tts_speech"][0].numpy()


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--upstream", type=Path, required=True, help="a checkout of FunAudioLLM/CosyVoice")
    ap.add_argument("--checkpoint", type=Path, required=True)
    ap.add_argument("--model-dir", type=Path, required=True)
    ap.add_argument("--port", type=int, required=True)
    ap.add_argument("--threads", type=int, default=0, help="torch intra-op threads (0: torch's default, every core)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    uvicorn.run(app(Upstream(args.upstream, args.checkpoint, args.model_dir)), host="127.0.0.1", port=args.port,
                log_level="warning")


if __name__ == "__main__":
    main()
