"""CosyVoice server: batched ONNX Runtime text-to-speech with an OpenAI-compatible API."""

__version__ = "0.1.0"
