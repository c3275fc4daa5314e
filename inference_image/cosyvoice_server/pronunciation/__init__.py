"""Saying words as their authors mean them: W3C PLS lexicons, an SSML subset, and the model's phone markup.

Pure functions and data, no I/O: `phones` turns a pronunciation (CMU, IPA, pinyin) into the phone tokens a
model's tokenizer holds; `lexicon` parses PLS documents and finds their graphemes in text; `ssml` parses an
SSML document into a plan of spoken parts and pauses (`plan`), the frontend's input.
"""
