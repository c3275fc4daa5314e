"""Kubernetes operator for CosyVoice text-to-speech: the CosyVoiceService custom resource.

Importing the package needs no cluster and no kopf; ``cosyvoice_operator.handlers`` is the kopf part.
"""
from .constants import API_VERSION, DEFAULT_IMAGE, GROUP, KIND, OPERATOR_VERSION, PLURAL, VERSION
from .render import Owner, Rendered
from .spec import CosyVoiceServiceSpec, InvalidSpec, parse_spec

__version__ = OPERATOR_VERSION

__all__ = [
    "API_VERSION",
    "DEFAULT_IMAGE",
    "GROUP",
    "KIND",
    "OPERATOR_VERSION",
    "PLURAL",
    "VERSION",
    "CosyVoiceServiceSpec",
    "InvalidSpec",
    "Owner",
    "Rendered",
    "__version__",
    "parse_spec",
]
