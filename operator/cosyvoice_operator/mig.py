"""MIG profile catalog and the Kubernetes resource names each device-plugin strategy exposes.

The catalog is what NVIDIA's MIG user guide and mig-parted's configurations list for each GPU
(profile → the most instances that fit on one GPU), including the media-extension profiles
(``1g.10gb+me``: one slice per GPU that also owns the GPU's video decoders and JPEG/OFA engines).
Node labels name GPUs in many spellings (``NVIDIA-A100-SXM4-40GB``, ``NVIDIA-H100-80GB-HBM3``,
``A100-SXM4-40GB-MIG-1g.5gb`` under the single strategy), so products are normalised to a catalog
*family* before a profile is checked.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal

from .constants import GPU_RESOURCE, MIG_RESOURCE_PREFIX

MigStrategy = Literal["mixed", "single", "none"]

PROFILE_PATTERN = re.compile(r"^([1-7])g\.([0-9]+)gb(\+me)?$")
MEDIA_EXTENSION = "+me"


@dataclass(frozen=True)
class MigProfile:
    name: str
    max_instances: int

    @property
    def compute_slices(self) -> int:
        return int(self.name.split("g.", 1)[0])

    @property
    def memory_gb(self) -> int:
        return profile_memory_gb(self.name)


def _profiles(*pairs: tuple[str, int]) -> tuple[MigProfile, ...]:
    return tuple(MigProfile(name, count) for name, count in pairs)


_A100_80 = _profiles(("1g.10gb", 7), ("1g.10gb+me", 1), ("1g.20gb", 4), ("2g.20gb", 3), ("3g.40gb", 2),
                     ("4g.40gb", 1), ("7g.80gb", 1))

CATALOG: dict[str, tuple[MigProfile, ...]] = {
    "A30-24GB": _profiles(("1g.6gb", 4), ("1g.6gb+me", 1), ("2g.12gb", 2), ("2g.12gb+me", 1), ("4g.24gb", 1)),
    "A100-40GB": _profiles(("1g.5gb", 7), ("1g.5gb+me", 1), ("1g.10gb", 4), ("2g.10gb", 3), ("3g.20gb", 2),
                           ("4g.20gb", 1), ("7g.40gb", 1)),
    "A100-80GB": _A100_80,
    "H100-80GB": _A100_80,
    "H100-94GB": _profiles(("1g.12gb", 7), ("1g.12gb+me", 1), ("1g.24gb", 4), ("2g.24gb", 3), ("3g.47gb", 2),
                           ("4g.47gb", 1), ("7g.94gb", 1)),
    "H100-96GB": _profiles(("1g.12gb", 7), ("1g.24gb", 4), ("2g.24gb", 3), ("3g.48gb", 2), ("4g.48gb", 1),
                           ("7g.96gb", 1)),
    "H200-141GB": _profiles(("1g.18gb", 7), ("1g.18gb+me", 1), ("1g.35gb", 4), ("2g.35gb", 3), ("3g.71gb", 2),
                            ("4g.71gb", 1), ("7g.141gb", 1)),
    "B200-180GB": _profiles(("1g.23gb", 7), ("1g.23gb+me", 1), ("1g.45gb", 4), ("2g.45gb", 3), ("3g.90gb", 2),
                            ("4g.90gb", 1), ("7g.180gb", 1)),
    "GB200-189GB": _profiles(("1g.24gb", 7), ("1g.24gb+me", 1), ("1g.47gb", 4), ("2g.47gb", 3), ("3g.95gb", 2),
                             ("4g.95gb", 1), ("7g.189gb", 1)),
}


def profile_memory_gb(profile: str) -> int:
    match = PROFILE_PATTERN.match(profile)
    if match is None:
        raise ValueError(f"not a MIG profile name: {profile!r} (expected e.g. 1g.10gb or 1g.10gb+me)")
    return int(match.group(2))


def strip_mig_suffix(product: str) -> str:
    """``NVIDIA-A100-SXM4-40GB-MIG-1g.5gb`` (single strategy label) → ``NVIDIA-A100-SXM4-40GB``."""
    return re.sub(r"-MIG-.*$", "", product)


def gpu_family(product: str) -> str | None:
    """Map a ``nvidia.com/gpu.product`` label (or a catalog key) to a catalog family, None if unknown.

    Unknown products (L4, RTX parts, ...) are not guessed: their profiles are simply not checked.
    """
    p = strip_mig_suffix(product).upper()
    if "GB200" in p:  # before "B200", which it contains
        return "GB200-189GB"
    if "B200" in p:
        return "B200-180GB"
    if "GH200" in p:  # before "H200", which it contains
        return "H200-141GB" if "144" in p else "H100-96GB"
    if "H200" in p:  # SXM and NVL share one profile set
        return "H200-141GB"
    if "H100" in p and "96GB" in p:
        return "H100-96GB"
    if "H100" in p and ("NVL" in p or "94GB" in p):
        return "H100-94GB"
    if "H100" in p:
        return "H100-80GB"
    if "A100" in p:
        if "80GB" in p:
            return "A100-80GB"
        if "40GB" in p:
            return "A100-40GB"
    if re.search(r"(^|-)A30($|-)", p):
        return "A30-24GB"
    return None


def valid_profiles(family: str) -> list[str]:
    return [p.name for p in CATALOG[family]]


def profile_error(profile: str, product: str) -> str | None:
    """A readable reason why ``profile`` cannot exist on ``product``; None when it can or is unknown."""
    family = gpu_family(product)
    if family is None or profile in valid_profiles(family):
        return None
    return (f"MIG profile {profile} does not exist on {family} ({product}); "
            f"valid profiles: {', '.join(valid_profiles(family))}")


def resource_name(strategy: MigStrategy, profile: str | None) -> str:
    """The extended resource a pod requests: ``nvidia.com/mig-<profile>`` only under the mixed strategy.

    Named as NVIDIA's device plugin names it: a resource name cannot hold ``+``, so the plugin writes
    ``1g.10gb+me`` as ``nvidia.com/mig-1g.10gb.me``.
    """
    if strategy == "mixed":
        if not profile:
            raise ValueError("the mixed strategy needs a MIG profile")
        return f"{MIG_RESOURCE_PREFIX}{profile}".replace("+", ".")
    return GPU_RESOURCE


def single_strategy_product_label(product: str, profile: str) -> str:
    """Value of ``nvidia.com/gpu.product`` on nodes whose GPUs are all cut into ``profile`` (single strategy)."""
    return f"{strip_mig_suffix(product)}-MIG-{profile}"
