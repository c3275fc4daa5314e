"""Writes configs in the shape upstream publishes them, for miniature checkpoints and converter tests.

Upstream's model directories carry the training config as the model's yaml: seeds applied at load time,
the model (`llm`, `flow`, `hift`), the GAN wrapper with its discriminators, data-pipeline functions,
`data_pipeline: [` lists closed by a `]` at column 0, commented-out blocks, and training settings. The
documents below follow `examples/libritts/cosyvoice2/conf/cosyvoice2.yaml` and
`examples/libritts/cosyvoice3/conf/cosyvoice3.yaml` section by section, with the layer sizes as parameters.
`emit` writes hyperpyyaml the way upstream formats it (four-space blocks, flow-style number lists,
single-quoted strings, `!ref` arithmetic).

    text = cosyvoice2(Sizes(...))                           # upstream's current CosyVoice2 example config
    text = cosyvoice2(Sizes(...), streaming_params=False)   # its earlier layout (encoder without chunks)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class New:
    """`!new:target` with its arguments below it."""
    target: str
    items: dict


class Name(New):
    """`!name:target`, written like `!new:`."""


@dataclass(frozen=True)
class Apply:
    target: str
    args: list


@dataclass(frozen=True)
class R:
    """`!ref <a>`; `expr` is what follows the tag."""
    expr: str


@dataclass(frozen=True)
class Raw:
    """A scalar written as is (`adam`, `1e-06`, `null`)."""
    text: str


@dataclass(frozen=True)
class Note:
    """A value with a comment after it on the same line."""
    value: Any
    comment: str
    gap: str = " "


@dataclass(frozen=True)
class RefList:
    """A flow-style list of references over several lines, its `]` at the key's indent."""
    refs: list[str]
    trailing_comma: bool = True


@dataclass(frozen=True)
class Comment:
    text: str  # one or more lines, written with '# ' (an empty line as '#')


BLANK = Comment("")


def _scalar(v: Any) -> str:
    if isinstance(v, Raw):
        return v.text
    if isinstance(v, bool):
        return "True" if v else "False"
    if v is None:
        return "null"
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    if isinstance(v, (list, tuple)):
        return "[" + ", ".join(_scalar(x) for x in v) + "]"
    return str(v)


def _entry(key: str, v: Any, indent: int) -> list[str]:
    pad = " " * indent
    comment = ""
    if isinstance(v, Note):
        v, comment = v.value, f"{v.gap}# {v.comment}"
    if isinstance(v, New):
        kind = "name" if isinstance(v, Name) else "new"
        return [f"{pad}{key}: !{kind}:{v.target}{comment}"] + _block(v.items, indent + 4)
    if isinstance(v, Apply):
        return [f"{pad}{key}: !apply:{v.target} {_scalar(v.args)}{comment}"]
    if isinstance(v, R):
        return [f"{pad}{key}: !ref {v.expr}{comment}"]
    if isinstance(v, RefList):
        refs = [f"{pad}    !ref {r}," for r in v.refs]
        if not v.trailing_comma:
            refs[-1] = refs[-1][:-1]
        return [f"{pad}{key}: ["] + refs + [f"{pad}]"]
    if isinstance(v, dict):
        return [f"{pad}{key}:{comment}"] + _block(v, indent + 4)
    return [f"{pad}{key}: {_scalar(v)}{comment}"]


def _block(items: dict, indent: int) -> list[str]:
    lines: list[str] = []
    for k, v in items.items():
        lines += _entry(k, v, indent)
    return lines


def emit(doc: list) -> str:
    """`doc`: Comment lines and one-key dicts (top-level entries), in file order."""
    lines: list[str] = []
    for part in doc:
        if isinstance(part, Comment):
            lines += [("# " + t if t else "") if part is not BLANK else "" for t in part.text.split("\n")]
        else:
            lines += _block(part, 0)
    return "\n".join(lines) + "\n"


@dataclass(frozen=True)
class Sizes:
    """What a miniature changes; the released models' values are the defaults."""
    llm_hidden: int = 896
    speech_tokens: int = 6561
    encoder_heads: int = 8
    encoder_units: int = 2048
    encoder_blocks: int = 6
    est_channels: int = 256
    est_head_dim: int = 64
    est_blocks: int = 4
    est_mid_blocks: int = 12
    est_heads: int = 8
    dit_dim: int = 1024
    dit_depth: int = 22
    dit_heads: int = 16
    dit_head_dim: int = 64
    dit_ff_mult: int = 2
    lookahead_channels: int = 1024
    hift_channels: int = 512
    hift_res_kernels: tuple[int, ...] = (3, 7, 11)
    f0_channels: int = 512


_SEEDS = [Comment("set random seed, so that you may reproduce your result."),
          {"__set_seed1": Apply("random.seed", [1986])}, {"__set_seed2": Apply("numpy.random.seed", [1986])},
          {"__set_seed3": Apply("torch.manual_seed", [1986])}, {"__set_seed4": Apply("torch.cuda.manual_seed_all", [1986])},
          BLANK]
_MODEL_NOTE = Comment("model params\nfor all class/function included in this repo, we use !<name> or !<new> for "
                      "intialization, so that user may find all corresponding class/function according to one single "
                      "yaml.\nfor system/third_party class/function, we do not require this.")
_DATA = "cosyvoice.dataset.processor."
_TRAIN = {"optim": Raw("adam"), "optim_conf": {"lr": Note(Raw("1e-5"), "change to 1e-5 during sft")},
          "scheduler": Note(Raw("constantlr"), "change to constantlr during sft"),
          "scheduler_conf": {"warmup_steps": 2500}, "max_epoch": 200, "grad_clip": 5, "accum_grad": 2,
          "log_interval": 100, "save_per_step": -1}
_TRAIN_GAN = {"optim": Raw("adam"), "optim_conf": {"lr": Note(Raw("0.0002"), "use small lr for gan training")},
              "scheduler": Raw("constantlr"), "optim_d": Raw("adam"),
              "optim_conf_d": {"lr": Note(Raw("0.0002"), "use small lr for gan training")},
              "scheduler_d": Raw("constantlr"), "max_epoch": 200, "grad_clip": 5,
              "accum_grad": Note(1, "in gan training, accum_grad must be 1"), "log_interval": 100, "save_per_step": -1}


def _fixed(s: Sizes) -> list:
    return [Comment("fixed params"), {"sample_rate": 24000}, {"llm_input_size": s.llm_hidden},
            {"llm_output_size": s.llm_hidden}, {"spk_embed_dim": 192}, {"qwen_pretrain_path": ""},
            {"token_frame_rate": 25}, {"token_mel_ratio": 2}, BLANK]


def _stream_params(left_chunks: int) -> list:
    return [Comment("stream related params"), {"chunk_size": Note(25, "streaming inference chunk size, in token")},
            {"num_decoding_left_chunks": Note(left_chunks, "streaming inference flow decoder left chunk size, <0 means "
                                                           "use all left chunks")}, BLANK]


def _llm(cls: str, s: Sizes) -> dict:
    return {"llm": New(cls, {
        "llm_input_size": R("<llm_input_size>"), "llm_output_size": R("<llm_output_size>"),
        "speech_token_size": s.speech_tokens, "length_normalized_loss": True, "lsm_weight": 0, "mix_ratio": [5, 15],
        "llm": New("cosyvoice.llm.llm.Qwen2Encoder", {"pretrain_path": R("<qwen_pretrain_path>")}),
        "sampling": Name("cosyvoice.utils.common.ras_sampling", {"top_p": 0.8, "top_k": 25, "win_size": 10, "tau_r": 0.1}),
    })}


def _cfm(estimator: New) -> New:
    return New("cosyvoice.flow.flow_matching.CausalConditionalCFM", {
        "in_channels": 240, "n_spks": 1, "spk_emb_dim": 80,
        "cfm_params": New("omegaconf.DictConfig", {"content": {
            "sigma_min": Raw("1e-06"), "solver": "euler", "t_scheduler": "cosine", "training_cfg_rate": 0.2,
            "inference_cfg_rate": 0.7, "reg_loss_type": "l1"}}),
        "estimator": estimator})


def _hift(cls: str, f0: str, s: Sizes, look_right: int | None) -> dict:
    items = {"in_channels": 80, "base_channels": s.hift_channels, "nb_harmonics": 8, "sampling_rate": R("<sample_rate>"),
             "nsf_alpha": 0.1, "nsf_sigma": 0.003, "nsf_voiced_threshold": 10, "upsample_rates": [8, 5, 3],
             "upsample_kernel_sizes": [16, 11, 7], "istft_params": {"n_fft": 16, "hop_len": 4},
             "resblock_kernel_sizes": list(s.hift_res_kernels),
             "resblock_dilation_sizes": [[1, 3, 5]] * len(s.hift_res_kernels),
             "source_resblock_kernel_sizes": [7, 7, 11], "source_resblock_dilation_sizes": [[1, 3, 5]] * 3,
             "lrelu_slope": 0.1, "audio_limit": 0.99}
    if look_right is not None:
        items["conv_pre_look_right"] = look_right
    items["f0_predictor"] = New(f0, {"num_class": 1, "in_channels": 80, "cond_channels": s.f0_channels})
    return {"hift": New(cls, items)}


def _mel(n_fft: int, hop: int, fmax: Any) -> Name:
    return Name("matcha.utils.audio.mel_spectrogram", {
        "n_fft": n_fft, "num_mels": 80, "sampling_rate": R("<sample_rate>"), "hop_size": hop, "win_size": n_fft,
        "fmin": 0, "fmax": fmax, "center": False})


def _gan(mel: Name, mrd: str) -> list:
    return [Comment("gan related module"), {"mel_spec_transform1": mel},
            {"hifigan": New("cosyvoice.hifigan.hifigan.HiFiGan", {
                "generator": R("<hift>"),
                "discriminator": New("cosyvoice.hifigan.discriminator.MultipleDiscriminator", {
                    "mpd": New("matcha.hifigan.models.MultiPeriodDiscriminator", {}),
                    "mrd": New(f"cosyvoice.hifigan.discriminator.{mrd}", {})}),
                "mel_spec_transform": RefList(["<mel_spec_transform1>"], trailing_comma=False)})}, BLANK]


def _pipeline_steps(whisper: bool) -> list[str]:
    steps = ["parquet_opener", "tokenize", "filter", "resample", "compute_fbank", "parse_embedding"]
    return steps + (["compute_whisper_fbank"] if whisper else []) + ["shuffle", "sort", "batch", "padding"]


def _gan_steps() -> list[str]:
    return ["parquet_opener", "tokenize", "filter", "resample", "truncate", "compute_fbank", "compute_f0",
            "parse_embedding", "shuffle", "sort", "batch", "padding"]


def _commented(key: str, refs: list[str]) -> Comment:
    return Comment("\n".join([f"{key}: ["] + [f"    !ref <{r}>," for r in refs] + ["]"]))


def cosyvoice2(s: Sizes = Sizes(), streaming_params: bool = True) -> str:
    """The CosyVoice2 example config. With `streaming_params` (upstream's current file, the layout of the
    CosyVoice3 config too): `chunk_size`/`num_decoding_left_chunks`, the encoder streaming in static chunks,
    the GAN settings at the mel rate. Without: the earlier file, whose encoder attends to every token."""
    encoder = {"output_size": 512, "attention_heads": s.encoder_heads, "linear_units": s.encoder_units,
               "num_blocks": s.encoder_blocks, "dropout_rate": 0.1, "positional_dropout_rate": 0.1,
               "attention_dropout_rate": 0.1, "normalize_before": True, "input_layer": "linear",
               "pos_enc_layer_type": "rel_pos_espnet", "selfattention_layer_type": "rel_selfattn", "input_size": 512,
               "use_cnn_module": False, "macaron_style": False}
    if streaming_params:
        encoder["static_chunk_size"] = R("<chunk_size>")
        chunk, left = R("<chunk_size> * <token_mel_ratio>"), R("<num_decoding_left_chunks>")
    else:
        encoder["use_dynamic_chunk"] = True
        chunk = Note(R("<token_frame_rate> * <token_mel_ratio>"),
                     "here we use static_chunk_size because we want to fix kv cache size during inference")
        left = 2
    estimator = New("cosyvoice.flow.decoder.CausalConditionalDecoder", {
        "in_channels": 320, "out_channels": 80, "channels": [s.est_channels], "dropout": 0.0,
        "attention_head_dim": s.est_head_dim, "n_blocks": s.est_blocks, "num_mid_blocks": s.est_mid_blocks,
        "num_heads": s.est_heads, "act_fn": "gelu", "static_chunk_size": chunk, "num_decoding_left_chunks": left})
    flow = {"flow": New("cosyvoice.flow.flow.CausalMaskedDiffWithXvec", {
        "input_size": 512, "output_size": 80, "spk_embed_dim": R("<spk_embed_dim>"), "output_type": "mel",
        "vocab_size": s.speech_tokens, "input_frame_rate": R("<token_frame_rate>"), "only_mask_loss": True,
        "token_mel_ratio": R("<token_mel_ratio>"), "pre_lookahead_len": 3,
        "encoder": New("cosyvoice.transformer.upsample_encoder.UpsampleConformerEncoder", encoder),
        "decoder": _cfm(estimator)})}
    if streaming_params:
        gan = _gan(_mel(1920, 480, None), "MultiResSpecDiscriminator")
        processors = _processors(s, whisper=False, fmax=8000, max_length=40960, truncate=24480, frames=2000, f0=True)
        gan_pipeline: dict | Comment = {"data_pipeline_gan": RefList([f"<{x}>" for x in _gan_steps()])}
    else:
        gan = _gan(_mel(1024, 256, None), "MultiResolutionDiscriminator")
        processors = _processors(s, whisper=False, fmax=8000, max_length=40960, truncate=24480, frames=2500, f0=False)
        gan_pipeline = _commented("data_pipeline_gan", _gan_steps())
    doc = [*_SEEDS, *_fixed(s), *(_stream_params(1) if streaming_params else []), _MODEL_NOTE,
           _llm("cosyvoice.llm.llm.Qwen2LM", s), BLANK, flow, BLANK,
           _hift("cosyvoice.hifigan.generator.HiFTGenerator", "cosyvoice.hifigan.f0_predictor.ConvRNNF0Predictor", s, None),
           BLANK, *gan, *processors, {"data_pipeline": RefList([f"<{x}>" for x in _pipeline_steps(False)])},
           gan_pipeline, BLANK, *_training()]
    return emit(doc)


def cosyvoice3(s: Sizes = Sizes()) -> str:
    """The CosyVoice3 example config (Fun-CosyVoice3-0.5B's layout)."""
    estimator = New("cosyvoice.flow.DiT.dit.DiT", {
        "dim": s.dit_dim, "depth": s.dit_depth, "heads": s.dit_heads, "dim_head": s.dit_head_dim,
        "ff_mult": s.dit_ff_mult, "mel_dim": 80, "mu_dim": 80, "spk_dim": 80, "out_channels": 80,
        "static_chunk_size": R("<chunk_size> * <token_mel_ratio>"),
        "num_decoding_left_chunks": R("<num_decoding_left_chunks>")})
    flow = {"flow": New("cosyvoice.flow.flow.CausalMaskedDiffWithDiT", {
        "input_size": 80, "output_size": 80, "spk_embed_dim": R("<spk_embed_dim>"), "output_type": "mel",
        "vocab_size": s.speech_tokens, "input_frame_rate": R("<token_frame_rate>"), "only_mask_loss": True,
        "token_mel_ratio": R("<token_mel_ratio>"), "pre_lookahead_len": 3,
        "pre_lookahead_layer": New("cosyvoice.transformer.upsample_encoder.PreLookaheadLayer", {
            "in_channels": 80, "channels": s.lookahead_channels, "pre_lookahead_len": 3}),
        "decoder": _cfm(estimator)})}
    doc = [*_SEEDS, *_fixed(s), *_stream_params(-1), _MODEL_NOTE, _llm("cosyvoice.llm.llm.CosyVoice3LM", s), BLANK,
           flow, BLANK,
           _hift("cosyvoice.hifigan.generator.CausalHiFTGenerator",
                 "cosyvoice.hifigan.f0_predictor.CausalConvRNNF0Predictor", s, 4),
           BLANK, *_gan(_mel(1920, 480, None), "MultiResSpecDiscriminator"),
           *_processors(s, whisper=True, fmax=None, max_length=6000, truncate=24960, frames=2000, f0=True),
           {"data_pipeline": RefList([f"<{x}>" for x in _pipeline_steps(True)])},
           {"data_pipeline_gan": RefList([f"<{x}>" for x in _gan_steps()])}, BLANK, *_training()]
    return emit(doc)


def _processors(s: Sizes, whisper: bool, fmax: Any, max_length: int, truncate: int, frames: int, f0: bool) -> list:
    tokenizer = {"token_path": R("<qwen_pretrain_path>"), "skip_special_tokens": True}
    if whisper:
        tokenizer["version"] = Raw("cosyvoice3")
    fbank = {"feat_extractor": R("<feat_extractor>")}
    if whisper:
        fbank["num_frames"] = 960
    doc = [Comment("processor functions"), {"parquet_opener": Name(_DATA + "parquet_opener", {})},
           {"get_tokenizer": Name("cosyvoice.tokenizer.tokenizer.get_qwen_tokenizer", tokenizer)},
           {"allowed_special": "all"},
           {"tokenize": Name(_DATA + "tokenize", {"get_tokenizer": R("<get_tokenizer>"),
                                                 "allowed_special": R("<allowed_special>")})},
           {"filter": Name(_DATA + "filter", {"max_length": max_length, "min_length": 100, "token_max_length": 200,
                                             "token_min_length": 1})},
           {"resample": Name(_DATA + "resample", {"resample_rate": R("<sample_rate>")})},
           {"truncate": Name(_DATA + "truncate", {"truncate_length": Note(truncate, "must be a multiplier of hop_size" + (" and token_mel_ratio" if whisper else ""))})},
           {"feat_extractor": _mel(1920, 480, fmax)},
           {"compute_fbank": Name(_DATA + "compute_fbank", fbank)}]
    if whisper:
        doc.append({"compute_whisper_fbank": Name(_DATA + "compute_whisper_fbank", {"num_frames": 960})})
    if f0:
        doc.append({"compute_f0": Name(_DATA + "compute_f0", {"sample_rate": R("<sample_rate>"), "hop_size": 480})})
    else:
        doc.append(Comment("pitch_extractor: !name:torchaudio.functional.compute_kaldi_pitch # TODO need to replace it\n"
                           "    sample_rate: !ref <sample_rate>\n"
                           "    frame_length: 46.4 # match feat_extractor win_size/sampling_rate\n"
                           "    frame_shift: 11.6 # match feat_extractor hop_size/sampling_rate\ncompute_f0: !name:cosyvoice.dataset.processor.compute_f0\n"
                           "    pitch_extractor: !ref <pitch_extractor>"))
    return doc + [
        {"parse_embedding": Name(_DATA + "parse_embedding", {"normalize": True})},
        {"shuffle": Name(_DATA + "shuffle", {"shuffle_size": 1000})},
        {"sort": Name(_DATA + "sort", {"sort_size": Note(500, "sort_size should be less than shuffle_size", gap="  ")})},
        {"batch": Name(_DATA + "batch", {"batch_type": "dynamic", "max_frames_in_batch": frames})},
        {"padding": Name(_DATA + "padding", {"use_spk_embedding": Note(False, "change to True during sft")})},
        BLANK, BLANK, Comment("dataset processor pipeline")]


def _training() -> list:
    return [Comment("llm flow train conf"), {"train_conf": _TRAIN}, BLANK, Comment("gan train conf"),
            {"train_conf_gan": _TRAIN_GAN}]
