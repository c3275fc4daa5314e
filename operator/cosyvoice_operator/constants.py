"""Names shared by the CRD, the rendered children and the inference server contract.

Everything a user could grep for (API group, labels, env names, ports) is defined once here.
"""
from __future__ import annotations

from typing import Final

from . import server_settings

OPERATOR_VERSION: Final = "0.1.0"

# The custom resource.
GROUP: Final = "tts.cosyvoice.dev"
VERSION: Final = "v1alpha1"
API_VERSION: Final = f"{GROUP}/{VERSION}"
KIND: Final = "CosyVoiceService"
PLURAL: Final = "cosyvoiceservices"
SHORT_NAME: Final = "cvs"

# Images: the single place where the default server image is named.
DEFAULT_IMAGE: Final = f"ghcr.io/cosyvoice-k8s/cosyvoice-server:{OPERATOR_VERSION}"
OPERATOR_IMAGE: Final = f"ghcr.io/cosyvoice-k8s/cosyvoice-operator:{OPERATOR_VERSION}"

# Labels (app.kubernetes.io/* recommended labels).
APP_NAME: Final = "cosyvoice"
MANAGER: Final = "cosyvoice-operator"
LABEL_NAME: Final = "app.kubernetes.io/name"
LABEL_INSTANCE: Final = "app.kubernetes.io/instance"
LABEL_COMPONENT: Final = "app.kubernetes.io/component"
LABEL_PART_OF: Final = "app.kubernetes.io/part-of"
LABEL_MANAGED_BY: Final = "app.kubernetes.io/managed-by"
LABEL_VERSION: Final = "app.kubernetes.io/version"
COMPONENT: Final = "inference-server"

# Annotation holding the last manifest the operator applied to a child (three-way merge base).
LAST_APPLIED_ANNOTATION: Final = f"{GROUP}/last-applied"

# Inference server contract.
SERVER_PORT: Final = int(server_settings.default("port"))  # the server's own default: it is started without --port
SERVER_PORT_NAME: Final = "http"
SERVER_COMMAND: Final = ("cosyvoice-server", "serve")
FETCH_COMMAND: Final = ("cosyvoice-server", "fetch")
HEALTH_PATH: Final = "/healthz"
READY_PATH: Final = "/readyz"
METRICS_PATH: Final = "/metrics"
MODEL_MOUNT: Final = "/models"
TMP_MOUNT: Final = "/tmp"
MODEL_CACHE_MOUNT: Final = "/model-cache"  # the fetch container's view of the node-local model cache
NODE_MODEL_CACHE_PATH: Final = "/var/cache/cosyvoice/models"  # the cache's hostPath when no claim is named
MODEL_CACHE_ENTRY: Final = "sha256-{digest}/model"  # cosyvoice_server.model_cache's layout (a test holds them together)
API_KEY_DIR: Final = "/var/run/secrets/cosyvoice"
API_KEY_FILE: Final = f"{API_KEY_DIR}/api-key"
REGISTRATION_KEY_DIR: Final = "/var/run/secrets/cosyvoice-registration"
REGISTRATION_KEY_FILE: Final = f"{REGISTRATION_KEY_DIR}/registration-key"
# The shared volume of registered voices (spec.voices.pvc), mounted by every replica.
VOICE_STORE_MOUNT: Final = "/var/lib/cosyvoice/voices"
LEXICON_MOUNT: Final = "/etc/cosyvoice/lexicons"  # one ConfigMap volume per lexicon below it, read-only
# Environment the operator renders (or that would override what it renders: COSYVOICE_API_KEY wins over the
# key file): a CosyVoiceService's spec.env may not set these. The CRD repeats the list in a CEL rule (tested).
OPERATOR_ENV: Final = (
    "HOME", "COSYVOICE_HOST", "COSYVOICE_PORT", "COSYVOICE_DEVICE", "COSYVOICE_PRECISION",
    "COSYVOICE_SERVED_MODEL_NAME", "COSYVOICE_MAX_BATCH_SIZE", "COSYVOICE_MAX_QUEUE_DELAY_MS",
    "COSYVOICE_MAX_QUEUE_SIZE", "COSYVOICE_REQUEST_TIMEOUT_S", "COSYVOICE_DRAIN_TIMEOUT_S", "COSYVOICE_MODEL_DIR",
    "COSYVOICE_GPU_MEM_LIMIT_BYTES", "COSYVOICE_API_KEY_FILE", "COSYVOICE_API_KEY", "COSYVOICE_VOICE_STORE_DIR",
    "COSYVOICE_ALLOW_VOICE_REGISTRATION", "COSYVOICE_VOICE_REGISTRATION_KEY_FILE", "COSYVOICE_VOICE_REGISTRATION_KEY",
    "COSYVOICE_MODEL_VERSION",
)

# Variables that change what the server's interpreter, dynamic loader or GPU runtime loads or exposes: with
# them a CR could run its own code inside an image the administrator allowed (PYTHONPATH, LD_PRELOAD) or, on
# a GPU node, see every GPU of the node (NVIDIA_VISIBLE_DEVICES=all under the NVIDIA container runtime).
FORBIDDEN_ENV_PREFIXES: Final = ("LD_", "PYTHON", "NVIDIA_")
FORBIDDEN_ENV: Final = ("GCONV_PATH", "LOCPATH")

# A Secret, ConfigMap, PersistentVolumeClaim or ServiceAccount a CosyVoiceService names (API key, storage
# credentials, env references, model and voice claims, the pods' service account) must be in the service's
# namespace and carry this label: its owner opts in to having CosyVoiceServices use it.
OPT_IN_LABEL: Final = f"{GROUP}/allow-reference"
OPT_IN_VALUE: Final = "true"

# NVIDIA device plugin / GPU feature discovery names.
GPU_RESOURCE: Final = "nvidia.com/gpu"
MIG_RESOURCE_PREFIX: Final = "nvidia.com/mig-"
LABEL_GPU_PRODUCT: Final = "nvidia.com/gpu.product"
LABEL_MIG_STRATEGY: Final = "nvidia.com/mig.strategy"
LABEL_MIG_CONFIG_STATE: Final = "nvidia.com/mig.config.state"

# Condition types surfaced in status.conditions.
COND_READY: Final = "Ready"
COND_PROGRESSING: Final = "Progressing"
COND_DEGRADED: Final = "Degraded"
COND_CAPACITY: Final = "CapacityAvailable"
COND_DEMO_MODEL: Final = "DemoModel"  # True: no spec.storage, the bundled random-weight model is served
COND_CANARY: Final = "Canary"  # only with spec.canary: True while the canary serves its share
CONDITION_TYPES: Final = (COND_READY, COND_PROGRESSING, COND_DEGRADED, COND_CAPACITY, COND_DEMO_MODEL, COND_CANARY)

# Leader election: the Lease held by the one operator replica that acts (the others wait).
LEASE_NAME: Final = MANAGER
