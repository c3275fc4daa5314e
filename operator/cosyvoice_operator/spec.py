"""The CosyVoiceService spec as typed models.

The CRD's openAPIV3Schema and CEL rules reject bad specs at admission; these models re-check the same
invariants because specs also arrive from files (``cosyvoice-operator render``), from clusters whose
CRD is older than the operator, or through paths that skip validation. Defaults here match the CRD's
defaults (a test holds them together), so a spec parses the same whether or not the API server
defaulted it.
"""
from __future__ import annotations

import difflib
import hashlib
import json
import re
import types
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError, model_validator
from pydantic.alias_generators import to_camel

from . import mig
from .constants import DEFAULT_IMAGE, FORBIDDEN_ENV, FORBIDDEN_ENV_PREFIXES, OPERATOR_ENV, SERVER_PORT
from .server_settings import cr_field

QUANTITY_RE = (r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
               r"(([KMGTPE]i)|[numkMGTPE]|([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
PERCENT_RE = r"^[0-9]+%$"
DNS1035_RE = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
# What Kubernetes accepts as the name of a Secret, ConfigMap, claim, ServiceAccount or PriorityClass. The
# operator puts these names into API paths: a '/' or '..' would reach another namespace's objects.
DNS1123_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"
STORAGE_URI_RE = r"^(file|https?|s3|gs)://\S+$"

Quantity = int | Annotated[str, Field(pattern=QUANTITY_RE)]
IntOrPercent = Annotated[int, Field(ge=0)] | Annotated[str, Field(pattern=PERCENT_RE)]
Precision = Literal["fp32", "fp16", "int8"]


def _object_name(value: str) -> str:
    if not re.match(DNS1123_SUBDOMAIN, value):
        raise ValueError(f"{value!r} is not a Kubernetes object name (lowercase letters, digits, '-' and '.', "
                         "starting and ending with a letter or digit)")
    return value


ObjectName = Annotated[str, Field(min_length=1, max_length=253), AfterValidator(_object_name)]


class InvalidSpec(ValueError):
    """The spec cannot be deployed as written; retrying will not help until a user edits it."""


class UnknownField(InvalidSpec):
    """The applied manifest named a field the CRD does not have (the API server dropped it)."""


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True, extra="forbid", frozen=True,
                              strict=True)  # "3" is not 3: the API server would reject it too


class SecretKeyRef(_Model):
    name: ObjectName
    key: str = Field(min_length=1, max_length=253)


class LocalObjectReference(_Model):
    name: ObjectName


# A path inside a volume: relative, no trailing '/' (and no '..', checked by each model).
SUB_PATH_RE = r"^[^/](.*[^/])?$"


# --- model source -------------------------------------------------------------------------------

class PVCSource(_Model):
    claim_name: ObjectName
    sub_path: str | None = Field(default=None, max_length=1024, pattern=SUB_PATH_RE)
    read_only: bool = True

    @model_validator(mode="after")
    def _inside_the_volume(self) -> PVCSource:
        if self.sub_path is not None and ".." in self.sub_path.split("/"):
            raise ValueError("storage.pvc.subPath must stay inside the volume (no '..')")
        return self


class CachePVC(_Model):
    claim_name: ObjectName


class ModelCache(_Model):
    """The node-local model cache; without a claim, the node's directory (a hostPath)."""
    pvc: CachePVC | None = None
    max_size: Quantity = "100Gi"


class Storage(_Model):
    pvc: PVCSource | None = None
    storage_uri: str | None = Field(default=None, pattern=STORAGE_URI_RE, max_length=2048)
    sha256: str | None = Field(default=None, pattern=r"^[a-f0-9]{64}$")
    size_limit: Quantity | None = None
    credentials_secret: LocalObjectReference | None = None
    cache: ModelCache | None = None

    @model_validator(mode="after")
    def _one_source(self) -> Storage:
        if (self.pvc is None) == (self.storage_uri is None):
            raise ValueError("set exactly one of storage.pvc or storage.storageUri")
        if self.storage_uri is None:
            for name, value in (("sha256", self.sha256), ("sizeLimit", self.size_limit),
                                ("credentialsSecret", self.credentials_secret)):
                if value is not None:
                    raise ValueError(f"storage.{name} applies to storage.storageUri only")
        if self.cache is not None and (self.storage_uri is None or self.sha256 is None):
            raise ValueError("storage.cache needs storage.storageUri and storage.sha256: cache entries are named and "
                             "checked by the archive's digest")
        return self


# --- registered voices ----------------------------------------------------------------------------

REGISTRATION_NEEDS_PVC = ("voices.registration.enabled needs voices.pvc: registered voices live on a volume every "
                          "replica mounts (a ReadWriteMany PersistentVolumeClaim)")
REGISTRATION_NEEDS_KEY = ("voices.registration.keySecret is required when apiKeySecret is set: the key that may "
                          "synthesize must not also be able to clone voices")


class VoicesPVC(_Model):
    claim_name: ObjectName
    sub_path: str | None = Field(default=None, max_length=1024, pattern=SUB_PATH_RE)

    @model_validator(mode="after")
    def _inside_the_volume(self) -> VoicesPVC:
        if self.sub_path is not None and ".." in self.sub_path.split("/"):
            raise ValueError("voices.pvc.subPath must stay inside the volume (no '..')")
        return self


class VoiceRegistration(_Model):
    enabled: bool = False
    key_secret: SecretKeyRef | None = None


class Voices(_Model):
    pvc: VoicesPVC | None = None
    registration: VoiceRegistration = Field(default_factory=VoiceRegistration)

    @model_validator(mode="after")
    def _registration_has_a_store(self) -> Voices:
        if self.registration.enabled and self.pvc is None:
            raise ValueError(REGISTRATION_NEEDS_PVC)
        return self


# --- pronunciation lexicons ----------------------------------------------------------------------

LEXICON_NAME_RE = r"^[a-z0-9][a-z0-9._-]{0,62}$"  # the server's lexicon names (cosyvoice_server.pronunciation)
CONFIG_MAP_KEY_RE = r"^[-._a-zA-Z0-9]+$"
MAX_LEXICONS = 16


class ConfigMapKeyRef(_Model):
    name: ObjectName
    key: str = Field(min_length=1, max_length=253, pattern=CONFIG_MAP_KEY_RE)


class LexiconRef(_Model):
    config_map_ref: ConfigMapKeyRef
    name: str | None = Field(default=None, pattern=LEXICON_NAME_RE)
    default: bool = False

    @property
    def lexicon_name(self) -> str:
        """The name requests use: `name`, else the ConfigMap's."""
        return self.name or self.config_map_ref.name


class Pronunciation(_Model):
    lexicons: list[LexiconRef] = Field(default_factory=list, max_length=MAX_LEXICONS)

    @model_validator(mode="after")
    def _names(self) -> Pronunciation:
        names = [lex.lexicon_name for lex in self.lexicons]
        for lex in self.lexicons:
            if lex.name is None and not re.match(LEXICON_NAME_RE, lex.config_map_ref.name):
                raise ValueError(f"pronunciation.lexicons: the ConfigMap name {lex.config_map_ref.name!r} is not a "
                                 "lexicon name (at most 63 characters): give the lexicon a name")
        dup = next((n for n in names if names.count(n) > 1), None)
        if dup is not None:
            raise ValueError(f"pronunciation.lexicons: two lexicons are named {dup!r}; give each its own name")
        return self


# --- GPU placement ------------------------------------------------------------------------------

SINGLE_MEDIA_EXTENSION = ("a media-extension (+me) MIG profile needs gpu.migStrategy mixed: the single strategy "
                          "selects nodes by a label value, which cannot contain '+'")


class Gpu(_Model):
    mig_profile: str | None = Field(default=None, pattern=mig.PROFILE_PATTERN.pattern)
    mig_strategy: mig.MigStrategy = "mixed"
    product: str | None = Field(default=None, max_length=63, pattern=r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$")
    memory_limit_bytes: int | None = Field(default=None, ge=0)

    @model_validator(mode="after")
    def _strategy_matches_profile(self) -> Gpu:
        if self.mig_strategy == "none" and self.mig_profile is not None:
            raise ValueError("gpu.migProfile must not be set with gpu.migStrategy none (a whole GPU)")
        if self.mig_strategy != "none" and self.mig_profile is None:
            raise ValueError("gpu.migProfile is required unless gpu.migStrategy is none")
        if self.mig_strategy == "single" and self.product is None:
            raise ValueError("gpu.product is required with gpu.migStrategy single "
                             "(nodes are selected by nvidia.com/gpu.product=<product>-MIG-<profile>)")
        if self.mig_strategy == "single" and self.mig_profile and self.mig_profile.endswith(mig.MEDIA_EXTENSION):
            raise ValueError(SINGLE_MEDIA_EXTENSION)
        if self.mig_profile and self.product:
            error = mig.profile_error(self.mig_profile, self.product)
            if error:
                raise ValueError(error)
        return self

    @property
    def resource(self) -> str:
        return mig.resource_name(self.mig_strategy, self.mig_profile)


# --- autoscaling (schema only; the autoscaler reads it) -----------------------------------------

class ScalingPolicy(_Model):
    type: Literal["Pods", "Percent"]
    value: int = Field(ge=1)
    period_seconds: int = Field(ge=1, le=1800)


class ScalingRules(_Model):
    stabilization_window_seconds: int | None = Field(default=None, ge=0, le=3600)
    policies: list[ScalingPolicy] = Field(default_factory=list, max_length=10)
    select_policy: Literal["Max", "Min", "Disabled"] = "Max"


class PrometheusSource(_Model):
    """Deprecated: the URL selects the administrator's metrics source with the same URL (admin.resolve_source)."""
    url: str = Field(pattern=r"^https?://\S+$", max_length=2048)
    bearer_token_secret: SecretKeyRef | None = None
    insecure_skip_verify: bool = False
    ca_secret: SecretKeyRef | None = None


class QueryOverrides(_Model):
    p95_latency_ms: str | None = Field(default=None, max_length=4096)
    time_to_first_audio_ms: str | None = Field(default=None, max_length=4096)
    qps: str | None = Field(default=None, max_length=4096)
    inflight: str | None = Field(default=None, max_length=4096)
    sessions: str | None = Field(default=None, max_length=4096)


class Fallback(_Model):
    replicas: int = Field(ge=0, le=1000)
    failure_threshold: int = Field(default=3, ge=1, le=100)


# Scale to zero is refused: while no pod runs, nothing sees the requests that should wake the service
# (the Service has no endpoints, so they fail at once) and the autoscaler's signals are those pods'
# metrics. A request-holding proxy (KEDA's HTTP add-on, Knative's activator) can do it from outside.
SCALE_TO_ZERO = ("autoscaling.minReplicas must be at least 1 (scale to zero is not supported): with no pod "
                 "running nothing receives the requests that would have to wake the service up (they fail at "
                 "once) and there are no metrics to scale on; to park a service, disable autoscaling and set "
                 "spec.replicas to 0")
REPLICAS_ABOVE_MAX = ("spec.replicas must not exceed autoscaling.maxReplicas while autoscaling is enabled: "
                      "the autoscaler owns spec.replicas within minReplicas..maxReplicas (leave spec.replicas out, "
                      "or lower it with `kubectl scale` before lowering maxReplicas)")


class Forecast(_Model):
    lookback_seconds: int = Field(default=10800, ge=0, le=1_209_600)
    min_correlation: float = Field(default=0.6, ge=0, le=1)


class Autoscaling(_Model):
    enabled: bool = False
    min_replicas: int = Field(default=1, ge=0, le=1000)
    max_replicas: int | None = Field(default=None, ge=1, le=1000)
    target_p95_latency_ms: int | None = Field(default=None, ge=1)
    target_time_to_first_audio_ms: int | None = Field(default=None, ge=1)
    target_qps_per_replica: float | None = Field(default=None, gt=0, alias="targetQPSPerReplica")
    target_inflight_per_replica: float | None = Field(default=None, gt=0)
    target_sessions_per_replica: float | None = Field(default=None, gt=0)
    tolerance: float = Field(default=0.1, ge=0, le=1)
    scale_up: ScalingRules | None = None
    scale_down: ScalingRules | None = None
    interval_seconds: int = Field(default=15, ge=1, le=3600)
    # A metrics source defined by the operator's administrator (admin.py); None: the default source.
    metrics_source: str | None = Field(default=None, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    prometheus: PrometheusSource | None = None
    queries: QueryOverrides | None = None
    fallback: Fallback | None = None
    capacity_profile: str | None = Field(default=None, min_length=1, max_length=253)
    sizing_latency_ratio: float = Field(default=0.8, gt=0, le=1)
    cold_start_seconds: int | None = Field(default=None, ge=0, le=3600)  # None: the capacity profile's measured start
    forecast: Forecast = Field(default_factory=Forecast)
    outage_forecast_seconds: int = Field(default=600, ge=0, le=86400)
    latency_guard_step_percent: int = Field(default=25, ge=1, le=1000)
    latency_guard_memory_seconds: int = Field(default=3600, ge=0, le=604800)

    @model_validator(mode="after")
    def _bounds(self) -> Autoscaling:
        if self.min_replicas < 1:
            raise ValueError(SCALE_TO_ZERO)
        if self.max_replicas is not None and self.min_replicas > self.max_replicas:
            raise ValueError("autoscaling.minReplicas must not exceed autoscaling.maxReplicas")
        if self.enabled:
            if self.max_replicas is None:
                raise ValueError("autoscaling.maxReplicas is required when autoscaling is enabled")
            if not any(v is not None for v in (self.target_p95_latency_ms, self.target_time_to_first_audio_ms,
                                               self.target_qps_per_replica, self.target_inflight_per_replica,
                                               self.target_sessions_per_replica)):
                raise ValueError("autoscaling needs at least one target (targetQPSPerReplica, "
                                 "targetInflightPerReplica, targetSessionsPerReplica, targetP95LatencyMs or "
                                 "targetTimeToFirstAudioMs)")
        if self.fallback and self.max_replicas is not None and self.fallback.replicas > self.max_replicas:
            raise ValueError("autoscaling.fallback.replicas must not exceed autoscaling.maxReplicas")
        if self.capacity_profile is not None:
            from .autoscaling.profile import names  # the bundled profiles: a name, never a path a CR could pick

            if self.capacity_profile not in names():
                raise ValueError(f"autoscaling.capacityProfile {self.capacity_profile!r} is not a bundled profile "
                                 f"({', '.join(names())})")
            if self.target_p95_latency_ms is None:
                raise ValueError("autoscaling.capacityProfile sizes replicas for targetP95LatencyMs: set it too")
        return self


# --- server configuration -----------------------------------------------------------------------

# Defaults and bounds are the server's own (server_settings.CR_FIELDS); the types are checked against it.
class Batching(_Model):
    max_batch_size: int = cr_field("batching", "maxBatchSize").field()
    max_queue_delay_ms: float = cr_field("batching", "maxQueueDelayMs").field()
    max_queue_size: int = cr_field("batching", "maxQueueSize").field()
    request_timeout_seconds: int = cr_field("batching", "requestTimeoutSeconds").field()


class Shutdown(_Model):
    drain_timeout_seconds: int = cr_field("shutdown", "drainTimeoutSeconds").field()
    pre_stop_sleep_seconds: int = Field(default=5, ge=0, le=120)


class Resources(_Model):
    requests: dict[str, Quantity] = Field(default_factory=dict, max_length=32)
    limits: dict[str, Quantity] = Field(default_factory=dict, max_length=32)

    @model_validator(mode="after")
    def _no_gpu_keys(self) -> Resources:
        for key in [*self.requests, *self.limits]:
            if key.startswith("nvidia.com/"):
                raise ValueError("GPU resources come from spec.gpu; remove nvidia.com/* from spec.resources")
        return self


class KeySelector(_Model):
    name: ObjectName
    key: str = Field(min_length=1, max_length=253)
    optional: bool | None = None


class EnvVarSource(_Model):
    secret_key_ref: KeySelector | None = None
    config_map_key_ref: KeySelector | None = None
    field_ref: dict[str, Any] | None = None
    resource_field_ref: dict[str, Any] | None = None


FORBIDDEN_ENV_MESSAGE = ("spec.env may not set the interpreter's, the dynamic loader's or the GPU runtime's "
                         f"variables ({', '.join(p + '*' for p in FORBIDDEN_ENV_PREFIXES)}, "
                         f"{', '.join(FORBIDDEN_ENV)}): they would load other code into the server or expose "
                         "GPUs the pod was not given")


class EnvVar(_Model):
    name: str = Field(min_length=1, max_length=256)
    value: str | None = None
    value_from: EnvVarSource | None = None

    @model_validator(mode="after")
    def _not_the_operators(self) -> EnvVar:
        if self.name in OPERATOR_ENV:
            raise ValueError(f"{self.name} is set by the operator and cannot be overridden "
                             f"(reserved: {', '.join(OPERATOR_ENV)})")
        if self.name.startswith(FORBIDDEN_ENV_PREFIXES) or self.name in FORBIDDEN_ENV:
            raise ValueError(FORBIDDEN_ENV_MESSAGE)
        return self


class Toleration(_Model):
    key: str | None = None
    operator: Literal["Exists", "Equal"] | None = None
    value: str | None = None
    effect: Literal["NoSchedule", "PreferNoSchedule", "NoExecute"] | None = None
    toleration_seconds: int | None = None


# --- exposure and availability ------------------------------------------------------------------

class ServiceSpec(_Model):
    type: Literal["ClusterIP", "NodePort", "LoadBalancer"] = "ClusterIP"
    port: int = Field(default=SERVER_PORT, ge=1, le=65535)  # the Service's port: by default the server's
    annotations: dict[str, str] = Field(default_factory=dict)


class Playground(_Model):
    """The browser playground the server serves at /playground (its setting `playground`)."""
    enabled: bool = False


def _is_zero(value: int | str) -> bool:
    return value == 0 or value == "0%"


class Rollout(_Model):
    # Defaults let a rollout replace pods in place: no spare MIG slice is needed for a surge pod.
    max_surge: IntOrPercent = 0
    max_unavailable: IntOrPercent = 1
    progress_deadline_seconds: int = Field(default=1200, ge=60, le=86400)

    @model_validator(mode="after")
    def _can_progress(self) -> Rollout:
        if _is_zero(self.max_surge) and _is_zero(self.max_unavailable):
            raise ValueError("rollout.maxSurge and rollout.maxUnavailable cannot both be 0")
        return self


class PodDisruptionBudget(_Model):
    enabled: bool = True
    min_available: IntOrPercent | None = None
    max_unavailable: IntOrPercent | None = None

    @model_validator(mode="after")
    def _one_bound(self) -> PodDisruptionBudget:
        if self.min_available is not None and self.max_unavailable is not None:
            raise ValueError("set at most one of podDisruptionBudget.minAvailable and maxUnavailable")
        return self


class ServiceMonitor(_Model):
    enabled: bool = False
    interval: str = Field(default="15s", pattern=r"^([0-9]+(ms|s|m|h))+$")
    labels: dict[str, str] = Field(default_factory=dict)


class Monitoring(_Model):
    enabled: bool = True
    service_monitor: ServiceMonitor = Field(default_factory=ServiceMonitor)


# --- canary ----------------------------------------------------------------------------------------

LABEL_VALUE_RE = r"^([A-Za-z0-9]([-A-Za-z0-9_.]{0,61}[A-Za-z0-9])?)$"
CANARY_SAME = ("spec.canary must change something the stable version runs (image, storage, precision, voices, env, "
               "resources or batching)")
CANARY_SAME_VERSION = "spec.canary.modelVersion must differ from spec.modelVersion: metrics tell the versions apart by it"
# The spec fields a canary may replace: what a model upgrade changes.
CANARY_FIELDS = ("image", "storage", "precision", "voices", "env", "resources", "batching", "model_version")


class GatewayParent(_Model):
    """A Gateway API ``parentRef``: the Gateway (and optionally its listener) that routes to the service."""
    name: ObjectName
    namespace: ObjectName | None = None
    section_name: str | None = Field(default=None, max_length=253, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


class CanaryAnalysis(_Model):
    """Flagger-style automatic analysis: every ``intervalSeconds`` the canary's figures are compared with the
    stable version's; a passing interval moves to the next of ``stepWeights``, after the last one the canary
    is promoted; ``failureThreshold`` failing intervals in a row abort it."""
    step_weights: list[Annotated[int, Field(ge=1, le=100)]] = Field(min_length=1, max_length=20)
    interval_seconds: int = Field(default=60, ge=1, le=3600)
    max_p95_latency_ratio: float = Field(default=1.2, gt=0, le=100)
    max_time_to_first_audio_ratio: float = Field(default=1.2, gt=0, le=100)
    max_error_rate: float = Field(default=0.01, ge=0, le=1)
    min_requests: int = Field(default=20, ge=0, le=1_000_000)
    failure_threshold: int = Field(default=1, ge=1, le=100)
    promote: bool = True

    @model_validator(mode="after")
    def _increasing(self) -> CanaryAnalysis:
        if any(b <= a for a, b in zip(self.step_weights, self.step_weights[1:], strict=False)):
            raise ValueError("canary.analysis.stepWeights must increase")
        return self


class Canary(_Model):
    weight: int = Field(ge=0, le=100)
    # What differs from the stable version (unset: the same as spec's); the types are the spec's own.
    image: str | None = Field(default=None, min_length=1, max_length=1024)
    storage: Storage | None = None
    precision: Precision | None = None
    voices: Voices | None = None
    env: list[EnvVar] | None = None
    resources: Resources | None = None
    batching: Batching | None = None
    model_version: str | None = Field(default=None, max_length=63, pattern=LABEL_VALUE_RE)
    gateway: GatewayParent | None = None
    hostnames: list[Annotated[str, Field(min_length=1, max_length=253)]] = Field(default_factory=list, max_length=16)
    metrics_source: str | None = Field(default=None, max_length=63, pattern=r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
    analysis: CanaryAnalysis | None = None

    def overrides(self) -> dict[str, Any]:
        """The set fields among CANARY_FIELDS, as the CRD spells them."""
        return self.model_dump(by_alias=True, exclude_none=True, include=set(CANARY_FIELDS))


class CosyVoiceServiceSpec(_Model):
    image: str = Field(default=DEFAULT_IMAGE, min_length=1, max_length=1024)
    image_pull_policy: Literal["Always", "IfNotPresent", "Never"] = "IfNotPresent"
    image_pull_secrets: list[LocalObjectReference] = Field(default_factory=list)
    served_model_name: str = Field(default="cosyvoice", pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
    api_key_secret: SecretKeyRef | None = None
    storage: Storage | None = None
    voices: Voices = Field(default_factory=Voices)
    pronunciation: Pronunciation = Field(default_factory=Pronunciation)
    precision: Precision | None = None
    gpu: Gpu | None = None
    replicas: int = Field(default=1, ge=0, le=1000)
    autoscaling: Autoscaling | None = None
    batching: Batching = Field(default_factory=Batching)
    shutdown: Shutdown = Field(default_factory=Shutdown)
    resources: Resources | None = None
    env: list[EnvVar] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[Toleration] = Field(default_factory=list)
    affinity: dict[str, Any] | None = None
    priority_class_name: ObjectName | None = None
    service_account_name: ObjectName | None = None
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    pod_labels: dict[str, str] = Field(default_factory=dict)
    service: ServiceSpec = Field(default_factory=ServiceSpec)
    playground: Playground = Field(default_factory=Playground)
    rollout: Rollout = Field(default_factory=Rollout)
    pod_disruption_budget: PodDisruptionBudget = Field(default_factory=PodDisruptionBudget)
    monitoring: Monitoring = Field(default_factory=Monitoring)
    model_version: str | None = Field(default=None, max_length=63, pattern=LABEL_VALUE_RE)
    canary: Canary | None = None

    @model_validator(mode="after")
    def _canary_deployable(self) -> CosyVoiceServiceSpec:
        if self.canary is None:
            return self
        if not self.canary.overrides().keys() - {"modelVersion"}:
            raise ValueError(CANARY_SAME)
        try:
            canary = self.canary_spec()
        except ValidationError as exc:
            raise ValueError(f"spec.canary makes an invalid spec: {format_errors(exc)}") from None
        if canary is not None and canary.version == self.version:
            raise ValueError(CANARY_SAME_VERSION if self.model_version else CANARY_SAME)
        return self

    def canary_spec(self) -> CosyVoiceServiceSpec | None:
        """The spec the canary runs: this one with the canary's fields in place of its own (and no canary)."""
        if self.canary is None:
            return None
        raw = self.model_dump(by_alias=True, exclude_none=True, exclude={"canary"})
        raw.update(self.canary.overrides())
        return _validate(raw)

    def promotion(self, raw: dict[str, Any]) -> dict[str, Any]:
        """The merge patch of the stored spec ``raw`` that promotes the canary: its fields replace the spec's
        (whole: a key the canary's storage lacks is removed, not merged), and ``spec.canary`` goes."""
        overrides = self.canary.overrides() if self.canary else {}
        return {**{k: _replacing(raw.get(k), v) for k, v in overrides.items()}, "canary": None}

    @property
    def version(self) -> str:
        """The model version in labels and metrics: ``modelVersion``, else a digest of what defines the model."""
        if self.model_version:
            return self.model_version
        what = self.model_dump(mode="json", by_alias=True, include=set(CANARY_FIELDS) - {"model_version"})
        what["precision"] = self.effective_precision
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()[:12]

    @model_validator(mode="after")
    def _replicas_within_autoscaling_bounds(self) -> CosyVoiceServiceSpec:
        auto = self.autoscaling
        if auto is not None and auto.enabled and auto.max_replicas is not None and self.replicas > auto.max_replicas:
            raise ValueError(REPLICAS_ABOVE_MAX)
        reg = self.voices.registration
        if reg.enabled and self.api_key_secret is not None and reg.key_secret is None:
            raise ValueError(REGISTRATION_NEEDS_KEY)
        return self

    @property
    def desired_replicas(self) -> int:
        """The replicas to run: spec.replicas, raised to autoscaling.minReplicas while autoscaling is enabled.

        spec.replicas defaults to 1, so a service created with minReplicas 3 and no replicas starts at 3
        at once instead of waiting for the autoscaler's first evaluation."""
        auto = self.autoscaling
        if auto is not None and auto.enabled:
            return max(self.replicas, auto.min_replicas)
        return self.replicas

    @property
    def effective_precision(self) -> Precision:
        """fp16 on a GPU, fp32 on CPU unless set: fp16 only pays off where fp16 math is faster."""
        if self.precision is not None:
            return self.precision
        return "fp16" if self.gpu is not None else "fp32"


def _replacing(old: Any, new: Any) -> Any:
    """A merge patch value that turns ``old`` into exactly ``new`` (keys only ``old`` has are nulled)."""
    if isinstance(old, dict) and isinstance(new, dict):
        return {**{k: None for k in old if k not in new}, **{k: _replacing(old.get(k), v) for k, v in new.items()}}
    return new


def _location(loc: tuple[int | str, ...]) -> str:
    parts: list[str] = []
    for item in loc:
        if isinstance(item, int):
            parts[-1:] = [f"{parts[-1]}[{item}]"] if parts else [f"[{item}]"]
        elif item in ("int", "str", "constrained-str", "function-after[_is_zero()]"):
            continue  # union branch names add nothing for a reader
        else:
            parts.append(str(item))
    return ".".join(["spec", *parts])


def _model_of(annotation: Any) -> type[BaseModel] | None:
    """The pydantic model inside ``X``, ``X | None``, ``list[X]`` or ``dict[str, X]``."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    if get_origin(annotation) in (Union, types.UnionType, list, dict, Annotated):
        for arg in get_args(annotation):
            if (found := _model_of(arg)) is not None:
                return found
    return None


def _fields_at(loc: tuple[int | str, ...]) -> list[str]:
    """The camelCase field names valid at ``loc`` (a path below spec), [] where free-form."""
    model: type[BaseModel] | None = CosyVoiceServiceSpec
    for item in loc:
        if isinstance(item, int) or model is None:
            continue
        field = next((f for n, f in model.model_fields.items() if item in (n, f.alias)), None)
        model = _model_of(field.annotation) if field is not None else None
    if model is None:
        return []
    return [f.alias or n for n, f in model.model_fields.items()]


def suggest_field(name: str, loc: tuple[int | str, ...]) -> str | None:
    """The valid field a misspelt ``name`` most likely meant (difflib; case and ``_`` ignored first)."""
    valid = _fields_at(loc)
    folded = {v.lower(): v for v in valid}
    key = name.replace("_", "").replace("-", "").lower()
    if key in folded:
        return folded[key]
    close = difflib.get_close_matches(key, list(folded), n=1, cutoff=0.6)
    return folded[close[0]] if close else None


def _unknown_field_message(loc: tuple[int | str, ...]) -> str:
    *parent, name = loc
    hint = suggest_field(str(name), tuple(parent))
    return f"unknown field; did you mean {hint!r}?" if hint else "unknown field"


def format_errors(exc: ValidationError) -> str:
    """One clause per field, with the camelCase path a user sees in their YAML."""
    by_path: dict[str, list[str]] = {}
    for err in exc.errors():
        msg = str(err["msg"]).removeprefix("Value error, ")
        loc = tuple(x for x in err["loc"] if not (isinstance(x, str) and x.startswith(("function-", "constrained-"))))
        if err["type"] == "extra_forbidden":
            msg = _unknown_field_message(loc)
        messages = by_path.setdefault(_location(loc), [])
        if msg not in messages:
            messages.append(msg)
    return "; ".join(f"{path}: {' or '.join(msgs)}" for path, msgs in by_path.items())


def _validate(raw: dict[str, Any] | None) -> CosyVoiceServiceSpec:
    # Field names as the CRD spells them only: `max_replicas` is as unknown to the API server as a typo.
    return CosyVoiceServiceSpec.model_validate(raw or {}, by_alias=True, by_name=False)


def parse_spec(raw: dict[str, Any] | None) -> CosyVoiceServiceSpec:
    try:
        return _validate(raw)
    except ValidationError as exc:
        raise InvalidSpec(format_errors(exc)) from None


def unknown_fields(raw: dict[str, Any] | None) -> str | None:
    """Only the unknown-field errors of a spec (with suggestions), None when it names no unknown field.

    The API server prunes fields its schema lacks, so a typo in a manifest never reaches the operator in
    the stored object; ``kubectl apply`` keeps the manifest as written in its last-applied annotation,
    which is where the reconciler looks for them."""
    try:
        _validate(raw)
    except ValidationError as exc:
        found = [e for e in exc.errors() if e["type"] == "extra_forbidden"]
        if found:
            return "; ".join(f"{_location(tuple(e['loc']))}: {_unknown_field_message(tuple(e['loc']))}"
                             for e in found)
    return None


def check_name(name: str) -> None:
    """The CR's name names the Service, so it must be a DNS-1035 label."""
    if len(name) > 63 or not DNS1035_RE.match(name):
        raise InvalidSpec(f"metadata.name {name!r} must be a DNS-1035 label (at most 63 lowercase letters, "
                          "digits and '-', starting with a letter) because it names the Service")
