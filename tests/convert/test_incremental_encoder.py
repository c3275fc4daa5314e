"""The flow encoder over a streamed segment's new tokens only (convert/incremental_encoder.py), exported to ONNX,
against upstream's own UpsampleConformerEncoder run over every token so far with its chunk masks, as upstream
streams.

The encoder is built by upstream's classes from the miniature's yaml with two conformer blocks at token rate
(the released models have six; the miniature one), every weight random. Its graph is driven as the engine
drives it: each row keeps the keys and values of its settled tokens (complete chunks whose look-ahead tokens
were known) and the next run starts after them; a voice's prompt is run once alone and its settled tokens'
states start every segment of that voice. Rows of different cache lengths run in one batch.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import pytest
import torch

from cosyvoice_server.streaming import ChunkPlanner

TOL = 1e-5
CHUNK, LOOKAHEAD = 25, 3


def report(what: str, err: float) -> None:
    print(f"\nPARITY {what}: max abs {err:.2e}")


@pytest.fixture(scope="module")
def flow(checkpoint):
    from cosyvoice_server.convert import miniature

    size = dataclasses.replace(miniature.SIZES["mini"], encoder_blocks=2)
    flow = miniature.upstream_modules(miniature.config_text(size), checkpoint / "CosyVoice-BlankEN")["flow"].eval()
    torch.manual_seed(1)
    with torch.no_grad():  # layer norms away from 1 and 0, every bias non-zero
        for p in flow.encoder.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    return flow


@pytest.fixture(scope="module")
def session(flow, tmp_path_factory):
    import onnxruntime as ort

    from cosyvoice_server.convert.incremental_encoder import export_incremental_encoder

    path = tmp_path_factory.mktemp("encoder") / "flow_encoder.incremental.onnx"
    export_incremental_encoder(flow, path)
    return ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])


@torch.no_grad()
def upstream_mu(flow, tokens: list[int], context: int) -> np.ndarray:
    """CausalMaskedDiffWithXvec.inference's encoder part with streaming=True: [80, 2 x tokens without context]."""
    x = flow.input_embedding(torch.tensor([tokens]))
    ctx = x[:, len(tokens) - context:]
    x = x[:, : len(tokens) - context]
    h, _ = flow.encoder(x, torch.tensor([x.size(1)]), context=ctx, streaming=True)
    return flow.encoder_proj(h)[0].T.numpy()


@dataclass
class Row:
    """One segment's tokens (its voice's prompt first) and the encoder states of its settled tokens."""

    tokens: list[int]
    embedding: np.ndarray
    settled: int = 0
    past: np.ndarray = field(default_factory=lambda: np.zeros((2, 0, 1024), np.float32))
    up_past: np.ndarray = field(default_factory=lambda: np.zeros((4, 0, 1024), np.float32))
    up_state: np.ndarray = field(default_factory=lambda: np.zeros((512, 2), np.float32))


def run(session, calls: list[tuple[Row, int, int]]) -> list[np.ndarray]:
    """One batch: (row, token_len, context) per call -> each call's mu from its settled tokens' frames on; each
    row then keeps the states of its complete chunks (less the look-ahead a call without context lacks)."""
    left = 2
    offset = np.array([r.settled for r, _, _ in calls], np.int64)
    ends = [n + c for _, n, c in calls]
    width = max(e - o for e, o in zip(ends, offset)) + left
    token = np.zeros((len(calls), width), np.int64)
    for i, ((r, _, _), o, e) in enumerate(zip(calls, offset, ends)):
        first = max(o - left, 0)
        token[i, left - (o - first): left - (o - first) + e - first] = r.tokens[first:e]
    keep = np.array([(n - (LOOKAHEAD - c)) // CHUNK * CHUNK for _, n, c in calls], np.int64)
    commit = np.maximum(keep - offset, 0)
    tp = int(offset.max())
    past = np.zeros((len(calls), 2, tp, 1024), np.float32)
    up_past = np.zeros((len(calls), 4, 2 * tp, 1024), np.float32)
    for i, (r, _, _) in enumerate(calls):
        past[i, :, : r.settled], up_past[i, :, : 2 * r.settled] = r.past, r.up_past
    mu, _, new_past, new_up_past, new_up_state = session.run(None, {
        "token": token, "token_len": np.array([n for _, n, _ in calls], np.int64),
        "context_len": np.array([c for _, _, c in calls], np.int64), "offset": offset, "commit": commit,
        "embedding": np.stack([r.embedding for r, _, _ in calls]), "past": past, "up_past": up_past,
        "up_state": np.stack([r.up_state for r, _, _ in calls])})
    out = []
    for i, (r, n, _) in enumerate(calls):
        out.append(mu[i, :, : 2 * (n - r.settled)])
        assert not mu[i, :, 2 * (n - r.settled):].any()  # zeros past the row's frames
        k = int(commit[i])
        if k:
            r.past = np.concatenate([r.past, new_past[i, :, :k]], axis=1)
            r.up_past = np.concatenate([r.up_past, new_up_past[i, :, : 2 * k]], axis=1)
            r.up_state, r.settled = new_up_state[i], int(keep[i])
    return out


def plan(prompt: int, tokens: int) -> list[tuple[int, int]]:
    """(token_len, context) of a segment's streamed calls after a `prompt`-token voice prompt (upstream's hops)."""
    planner = ChunkPlanner(25, 100, 2, LOOKAHEAD, prompt, True)
    calls = []
    while (span := planner.next(tokens, True)) is not None and not span.final:
        calls.append((prompt + span.end, LOOKAHEAD))
    return calls


def test_new_tokens_only_match_upstreams_streamed_encoder_in_a_batch_of_different_caches(flow, session):
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, 6561, 60).tolist()  # (60 - 3) // 25 = 2 settled chunks every segment shares
    emb = rng.standard_normal(192).astype(np.float32)
    voice = Row(prompt, emb)
    (mu,) = run(session, [(voice, len(prompt), 0)])  # the prompt alone: its last tokens lack their look-ahead
    err = {"voice prompt": float(np.abs(mu - upstream_mu(flow, prompt, 0)).max())}
    assert voice.settled == 50
    segments = [Row(prompt + rng.integers(0, 6561, 230).tolist(), emb),  # the voice's: starts at token 50
                Row(rng.integers(0, 6561, 310).tolist(), rng.standard_normal(192).astype(np.float32)),
                Row(prompt + rng.integers(0, 6561, 140).tolist(), emb)]
    for s in (segments[0], segments[2]):
        s.settled, s.past, s.up_past, s.up_state = voice.settled, voice.past, voice.up_past, voice.up_state
    plans = [plan(60, 230), plan(0, 310), plan(60, 140)]
    err["streamed"] = 0.0
    offsets = set()
    for k in range(max(map(len, plans))):
        calls = [(s, *p[k]) for s, p in zip(segments, plans) if k < len(p)]
        offsets.add(tuple(s.settled for s, _, _ in calls))
        starts = [s.settled for s, _, _ in calls]
        for (s, n, c), start, got in zip(calls, starts, run(session, calls)):
            want = upstream_mu(flow, s.tokens[: n + c], c)
            assert got.shape == (80, 2 * (n - start))
            err["streamed"] = max(err["streamed"], float(np.abs(got - want[:, 2 * start:]).max()))
    assert (50, 0, 50) in offsets  # the voice's segments start after its prompt's states, beside a fresh one
    for k, e in err.items():
        report(f"incremental flow encoder ({k})", e)
        assert e <= TOL


def test_the_chunk_masks_matter_and_an_encoder_without_them_is_refused(flow, checkpoint):
    """A settled token's output is final only under the chunk masks; without a static chunk the graph is refused."""
    from cosyvoice_server.convert import miniature
    from cosyvoice_server.convert.incremental_encoder import IncrementalFlowEncoder, not_chunk_causal

    rng = np.random.default_rng(1)
    tokens = rng.integers(0, 6561, 90).tolist()
    a, b = upstream_mu(flow, tokens[:56], 3), upstream_mu(flow, tokens[:81], 3)  # 53 and 78 tokens
    assert np.abs(a[:, :100] - b[:, :100]).max() < 1e-6  # two complete chunks, final with their look-ahead
    assert np.abs(a[:, 100:] - b[:, 100:106]).max() > 1e-3  # the open chunk changes as tokens arrive
    earlier = miniature.upstream_modules(miniature.config_text(miniature.SIZES["mini"], "earlier"),
                                         checkpoint / "CosyVoice-BlankEN")["flow"]
    assert "static_chunk_size 0" in not_chunk_causal(earlier.encoder)
    with pytest.raises(ValueError, match="static chunk"):
        IncrementalFlowEncoder(earlier)
