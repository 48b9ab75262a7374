"""Which pre-pull engines a cluster runs, from what kubectl lists, and the one to use.

Read from ``kubectl get crd,daemonsets,deployments -A -o json``: OpenKruise by its ImagePullJob CRD
(the versions it serves) and its kruise-manager image (the release); Dragonfly by its images
(dragonflyoss/manager: the Open API a preheat is posted to; dragonflyoss/client or dfdaemon as a
DaemonSet: a peer on every node). The recommendation: Dragonfly where both its manager and its
peers run (each layer leaves the registry once, peers serve each other), else OpenKruise where it
serves ImagePullJob (per-node status, a bounded parallelism, no pod per node), else ascendkit's
DaemonSet, which needs nothing installed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from buildkit.errors import InputError
from buildkit.k8s.prepull import KRUISE_API

KRUISE_CRD = "imagepulljobs.apps.kruise.io"
_IMAGE_TAG = re.compile(r":(v?\d+\.\d+[\w.\-]*)$")


@dataclass(frozen=True)
class Pullers:
    kruise_versions: tuple[str, ...] = ()  # ImagePullJob versions served; () when the CRD is absent
    kruise_release: str = ""
    dragonfly_manager: str = ""  # its release ("" when absent; "unknown" without a tagged image)
    dragonfly_peers: str = ""  # the DaemonSet that puts a peer on every node, namespace/name
    notes: list[str] = field(default_factory=list)

    @property
    def recommended(self) -> str:
        if self.dragonfly_manager and self.dragonfly_peers:
            return "dragonfly"
        if KRUISE_API.rpartition("/")[2] in self.kruise_versions:
            return "openkruise"
        return "daemonset"

    def describe(self) -> dict[str, Any]:
        return {
            "openkruise": {"imagepulljob_versions": list(self.kruise_versions), "release": self.kruise_release or None}
            if self.kruise_versions
            else None,
            "dragonfly": {"manager": self.dragonfly_manager or None, "peers": self.dragonfly_peers or None}
            if self.dragonfly_manager or self.dragonfly_peers
            else None,
            "recommended": self.recommended,
            "notes": self.notes,
        }

    def lines(self) -> list[str]:
        kruise = (
            f"OpenKruise {self.kruise_release or '(release unknown)'} serves ImagePullJob {', '.join(self.kruise_versions)}"
            if self.kruise_versions
            else "no OpenKruise ImagePullJob CRD"
        )
        if self.dragonfly_manager or self.dragonfly_peers:
            dragonfly = f"Dragonfly {self.dragonfly_manager or '(no manager found)'}" + (
                f", peers from {self.dragonfly_peers}" if self.dragonfly_peers else ", no peer DaemonSet found"
            )
        else:
            dragonfly = "no Dragonfly"
        why = {
            "dragonfly": "each layer leaves the registry once and the peers serve one another",
            "openkruise": "per-node status and a bounded number of nodes pulling at once, no pod per node",
            "daemonset": "it needs nothing installed; at tens of nodes a P2P engine (Dragonfly) spares the registry",
        }[self.recommended]
        return [
            f"pre-pull engines: {kruise}; {dragonfly}",
            f"pre-pull with: k8s render --job prepull --puller {self.recommended} ({why})",
            *self.notes,
        ]


def _images(item: dict[str, Any]) -> list[str]:
    """The images of a workload's pod template (what is not shaped as one is read past)."""
    spec: Any = item
    for key in ("spec", "template", "spec"):
        spec = spec.get(key) if isinstance(spec, dict) else None
    if not isinstance(spec, dict):
        return []
    containers = [c for key in ("containers", "initContainers") if isinstance(spec.get(key), list) for c in spec[key]]
    return [str(c.get("image", "")) for c in containers if isinstance(c, dict)]


def _tag(image: str) -> str:
    match = _IMAGE_TAG.search(image.partition("@")[0])
    return match.group(1) if match else "unknown"


def detect(doc: Any, source: str) -> Pullers:
    """What ``source`` (a List kubectl printed) says of the cluster's pre-pull engines."""
    if not isinstance(doc, dict) or not isinstance(doc.get("items"), list):
        raise InputError(f"{source}: expected a List: kubectl get crd,daemonsets,deployments -A -o json")
    versions: tuple[str, ...] = ()
    kruise_release = manager = peers = ""
    notes = []
    for item in doc["items"]:
        if not isinstance(item, dict):
            continue
        kind, meta = item.get("kind"), item.get("metadata") or {}
        where = f"{meta.get('namespace', '')}/{meta.get('name', '')}".lstrip("/")
        if kind == "CustomResourceDefinition" and meta.get("name") == KRUISE_CRD:
            spec: dict[str, Any] = item["spec"] if isinstance(item.get("spec"), dict) else {}
            listed: list[Any] = spec["versions"] if isinstance(spec.get("versions"), list) else []
            served = [str(v.get("name", "")) for v in listed if isinstance(v, dict) and v.get("served")]
            versions = tuple(sorted(served))
        for image in _images(item) if kind in ("DaemonSet", "Deployment") else []:
            if "openkruise/kruise-manager" in image:
                kruise_release = kruise_release or _tag(image)
            elif re.search(r"dragonflyoss/manager(:|@|$)", image):
                manager = _tag(image)
            elif kind == "DaemonSet" and re.search(r"dragonflyoss/(client|dfdaemon)(:|@|$)", image):
                peers = where
    if versions and KRUISE_API.rpartition("/")[2] not in versions:
        notes.append(
            f"this OpenKruise serves ImagePullJob as {', '.join(versions)}, not as {KRUISE_API}, the version ascendkit renders: "
            "the DaemonSet is recommended instead"
        )
    if peers and not manager:
        notes.append(
            "Dragonfly's peers run but no manager was listed: a preheat needs the manager's Open API (another namespace or cluster?)"
        )
    if peers:
        notes.append("Dragonfly serves a node's pulls only where its containerd sends them to the local peer (a hosts.toml mirror)")
    return Pullers(versions, kruise_release, manager, peers, notes)
