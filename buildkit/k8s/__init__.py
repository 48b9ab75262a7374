"""Kubernetes: the smoke job and training runs as manifests (Job, RayJob), and their offline validation."""

KUBERNETES_VERSION = "1.32.0"  # the schemas `k8s validate` checks against
KUBERAY_VERSION = "v1.4"  # the ray.io/v1 RayJob fields rendered here (name limit of 47 since v1.4)
DEFAULT_MODEL_PATH = "/data/models/Qwen2.5-0.5B-Instruct"
