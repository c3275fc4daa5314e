"""Upstream main's `Qwen2LM.inference_bistream`, restated around upstream's own modules, as the parity reference.

The `cosyvoice-minicpmo` snapshot's `inference_bistream` predates main's fill schedule: it starts with
`next_fill_index = -1`, so a fill comes only when the model samples one. Main forces the first fill after
`(P // 15 + 1) * 15 - P` speech tokens (P prompt speech tokens) and every 16 tokens after a fill, and its
`sampling_ids` masks only eos while `ignore_eos` (the Reference patches that in). This restates main's loop
step by step with the snapshot's Qwen2 body, embeddings, decoder and sampling (`Reference.load` builds
them from the checkpoint). Text arrives one token per iteration, as upstream's frontend
(`_extract_text_token_generator`) yields it.
"""

from __future__ import annotations

import torch

MIX_TEXT, MIX_SPEECH = 5, 15


@torch.no_grad()
def bistream_tokens(reference, text: list[int], spk: dict) -> list[int]:
    """The speech tokens main's inference_bistream yields for `text` (ids) and a reference speaker."""
    llm = reference.llm
    speech_size = llm.speech_token_size
    fill = speech_size + 2
    embed_text = llm.llm.model.model.embed_tokens
    sos = llm.llm_embedding.weight[0].reshape(1, 1, -1)
    task = llm.llm_embedding.weight[1].reshape(1, 1, -1)
    prompt_speech = spk["prompt_token"]
    p = prompt_speech.shape[1]
    speech_left = llm.speech_embedding(prompt_speech.long()) if p else torch.zeros(1, 0, sos.shape[2])
    text_cache = embed_text(spk["prompt_text"].long().reshape(1, -1))
    lm_input = sos
    out: list[int] = []
    yielded: list[int] = []
    cache = None
    next_fill = (p // MIX_SPEECH + 1) * MIX_SPEECH - p

    def forward(x):
        nonlocal cache
        n = x.shape[1] + (0 if cache is None else cache[0][0].size(2))
        y, cache = llm.llm.forward_one_step(x, masks=torch.tril(torch.ones((1, n, n))).to(torch.bool), cache=cache)
        return llm.llm_decoder(y[:, -1]).log_softmax(dim=-1)

    for token in text:
        text_cache = torch.concat([text_cache, embed_text(torch.tensor([[token]]))], dim=1)
        while speech_left.shape[1] and text_cache.shape[1] >= MIX_TEXT:
            lm_input = torch.concat([lm_input, text_cache[:, :MIX_TEXT], speech_left[:, :MIX_SPEECH]], dim=1)
            text_cache, speech_left = text_cache[:, MIX_TEXT:], speech_left[:, MIX_SPEECH:]
        if speech_left.shape[1]:
            continue
        after_fill = bool(out) and out[-1] == fill
        if after_fill or (not out and lm_input.shape[1] == 1):
            if text_cache.shape[1] < MIX_TEXT:
                continue
            group, text_cache = text_cache[:, :MIX_TEXT], text_cache[:, MIX_TEXT:]
            lm_input = group if after_fill else torch.concat([lm_input, group], dim=1)
        while True:
            logp = forward(lm_input)
            if len(out) == next_fill:
                top = fill
            else:
                top = int(llm.sampling_ids(logp.squeeze(dim=0), out, 25, ignore_eos=True))
            if top == fill:
                next_fill = len(out) + MIX_SPEECH + 1
            out.append(top)
            if top >= speech_size:
                if top != fill:
                    raise ValueError(f"upstream raises on token {top} between text groups")
                break
            yielded.append(top)
            lm_input = llm.speech_embedding.weight[top].reshape(1, 1, -1)

    lm_input = torch.concat([lm_input, text_cache, task], dim=1)
    while True:
        top = int(llm.sampling_ids(forward(lm_input).squeeze(dim=0), out, 25, ignore_eos=False))
        out.append(top)
        if top >= speech_size:
            if top != speech_size:
                raise ValueError(f"upstream raises on token {top} at the end")
            return yielded
        yielded.append(top)
        lm_input = llm.speech_embedding.weight[top].reshape(1, 1, -1)
