"""Python clients for the server's APIs (async)."""

from .lexicons import lexicons
from .speech_stream import AudioChunk, AudioDone, SegmentDone, SpeechStream, StreamError, StreamResult, connect, speak

__all__ = ["AudioChunk", "AudioDone", "SegmentDone", "SpeechStream", "StreamError", "StreamResult", "connect", "lexicons",
           "speak"]
