"""The pipeline as the peer servers host it (bench/peers/static_batch.py): a batch of whole requests gives
each its audio, the same for the same seed alone or batched, so the peers' columns measure working servers."""

from __future__ import annotations

import numpy as np
import pytest

from bench.peers.static_batch import synthesize_batch
from cosyvoice_server.config import BUNDLED_MODEL
from cosyvoice_server.engine.pipeline import Pipeline


@pytest.fixture(scope="module")
def pipeline() -> Pipeline:
    return Pipeline(BUNDLED_MODEL, "cpu", "fp32")


def test_each_request_of_a_batch_gets_its_audio_as_when_alone(pipeline):
    requests = [("The quick brown fox jumps over the lazy dog.", 1), ("Hello there.", 2), ("?!", 3)]
    batched = synthesize_batch(pipeline, requests)
    assert [len(a) > 0 for a in batched] == [True, True, False]  # nothing to say: no audio
    for (text, seed), audio in zip(requests[:2], batched):
        alone = synthesize_batch(pipeline, [(text, seed)])[0]
        # the same tokens, so the same length; the flow batches rows of other lengths, within float rounding
        assert audio.dtype == np.float32 and audio.shape == alone.shape and np.abs(alone - audio).max() < 1e-5
        assert len(audio) % (pipeline.manifest.token_mel_ratio * pipeline.vocoder.hop) == 0  # whole tokens
