"""A CosyVoice3 checkpoint of other sizes than the golden one (more DiT heads and blocks, another vocoder width
and kernels, other seed and voices), built in upstream's layout by the miniature builder: it converts, and every
exported stage computes what the modules it was exported from compute (those modules equal upstream's own
outputs: test_golden_stages.py). The LLM's reference is transformers' Qwen2 with the checkpoint's speech head."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("omegaconf")

from cosyvoice_server.convert import build, hyperyaml, miniature  # noqa: E402
from cosyvoice_server.engine.flow import FlowChunk, VocoderInput  # noqa: E402

SIZE = dataclasses.replace(miniature.MINI3, qwen_hidden=96, qwen_heads=6, qwen_kv_heads=3, qwen_mlp=160, dit_dim=96,
                           dit_depth=3, dit_heads=3, dit_head_dim=32, lookahead_channels=48, hift_channels=32,
                           hift_res_kernels=(3, 5), f0_channels=48, speakers=("ann", "bob", "cy"))


@pytest.fixture(scope="module")
def other(tmp_path_factory):
    from cosyvoice_server.convert.convert import convert
    from cosyvoice_server.engine.pipeline import Pipeline

    ckpt = miniature.build_cosyvoice3(tmp_path_factory.mktemp("ckpt") / "cv3-other", SIZE, seed=11)
    model = convert(ckpt, tmp_path_factory.mktemp("model") / "cv3-other", ["fp32"])
    path = ckpt / "cosyvoice3.yaml"
    cfg = hyperyaml.resolve(hyperyaml.parse(path.read_text(), path), {"qwen_pretrain_path": str(ckpt / "CosyVoice-BlankEN")},
                            path)
    flow = build.build(cfg["flow"], path, build.TABLES["cosyvoice3"])
    hift = build.build(cfg["hift"], path, build.TABLES["cosyvoice3"])
    flow.load_state_dict(torch.load(ckpt / "flow.pt", weights_only=True))
    hift.load_state_dict(torch.load(ckpt / "hift.pt", weights_only=True))
    return ckpt, Pipeline(model, "cpu", "fp32"), flow.eval(), hift.eval()


def test_llm_logits_under_teacher_forcing(other):
    from transformers import Qwen2ForCausalLM

    ckpt, p, _, _ = other
    state = torch.load(ckpt / "llm.pt", weights_only=True)
    qwen = Qwen2ForCausalLM.from_pretrained(str(ckpt / "CosyVoice-BlankEN"))
    qwen.load_state_dict({k[len("llm.model."):]: v for k, v in state.items() if k.startswith("llm.model.")})
    v = p.voices["bob"]
    text = np.asarray(p.frontend.encode("Other seed, other sizes, other voices."), np.int64)
    speech = np.random.default_rng(1).integers(0, 6561, 12)
    emb, sp = state["llm.model.model.embed_tokens.weight"], state["speech_embedding.weight"]
    ids = torch.tensor(np.concatenate([v.prompt_text_tokens, text]))
    x = torch.cat([sp[6561:6562], emb[ids], sp[6563:6564], sp[torch.tensor(v.prompt_speech_tokens)], sp[torch.tensor(speech)]])
    with torch.no_grad():
        hidden = qwen.model(inputs_embeds=x[None]).last_hidden_state[0]
        want = (hidden @ state["llm_decoder.weight"].T).numpy()
    q = p.llm.sequence(text, v.prompt_text_tokens, v.llm_prompt_speech_tokens, np.random.default_rng(0), owner=None)
    got = []
    llm = p.llm
    logits, kv = llm._run(q.prompt[None], np.ones((1, len(q.prompt)), np.int64), np.arange(len(q.prompt))[None], None)
    got.append(logits[0])
    for i, t in enumerate(speech[:-1]):
        pos = len(q.prompt) + i
        logits, kv = llm._run(llm.speech_embedding[[t]][None], np.ones((1, pos + 1), np.int64), np.array([[pos]]), kv)
        got.append(logits[0])
    start = len(x) - len(speech) - 1
    assert np.abs(np.stack(got) - want[start:-1]).max() < 1e-4


def test_flow_streamed_and_final_calls_match_the_modules(other):
    _, p, flow, _ = other
    v = p.voices["cy"]  # a prompt longer than a chunk: the voice's prompt states are kept
    tokens = np.random.default_rng(2).integers(0, 6561, 95).astype(np.int64)
    prompt = torch.tensor(v.prompt_speech_tokens)[None]
    feat, emb = torch.tensor(v.prompt_mel)[None], torch.tensor(v.embedding)[None]
    cache = p.flow.new_cache()
    offset = 0
    for end, final in ((28 + (25 - len(v.prompt_speech_tokens) % 25) % 25, False), (78, False), (95, True)):
        ctx = 0 if final else 3
        want = flow.inference(torch.tensor(tokens[: end + ctx])[None], None, prompt, None, feat, None, emb,
                              streaming=not final, finalize=final)[0].numpy()
        chunk = FlowChunk(np.concatenate([v.prompt_speech_tokens, tokens[: end + ctx]]), len(v.prompt_speech_tokens) + end,
                          ctx, not final, 2 * len(v.prompt_speech_tokens), 2 * offset, v.embedding, v.prompt_mel, cache)
        mel = p.flow.run([chunk])[0]
        assert np.abs(mel - want[:, 2 * offset:]).max() < 1e-4, end
        offset = end
    assert p.flow.prompt_cache_bytes > 0


def test_vocoder_matches_the_module_with_its_own_noise(other):
    _, p, _, hift = other
    mel = np.random.default_rng(3).standard_normal((80, 137)).astype(np.float32)
    noise = p.vocoder.noise(137, np.random.default_rng(0))
    assert np.array_equal(noise, hift.fixed_noise(137 * 480).numpy())
    with torch.no_grad():
        want = hift(torch.tensor(mel)[None], torch.tensor(noise)[None])[0].numpy()
    (wav, _), = p.vocoder.run([VocoderInput(mel, noise, None)])
    assert np.abs(wav - want).max() < 1e-5
