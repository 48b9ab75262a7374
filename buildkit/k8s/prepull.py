"""Pre-pulling a published image onto a fleet with the engine the cluster already runs.

Three pullers, one list of images (every image of the tag: the gzip index and its ``-zstd``
sibling where the registry has one, each index covering both arches):

- ``daemonset``: ascendkit's own DaemonSet (kinds.prepull_daemonset), the image the job names;
- ``openkruise``: an OpenKruise ``ImagePullJob`` (apps.kruise.io/v1alpha1, which OpenKruise 1.6 to
  1.9 serve; v1beta1 is 1.9's alone) per image, on the SKU's nodes, pulled by kruise-daemon through
  the CRI with the cluster's pull secret. Its pull timeout is raised from OpenKruise's 600 s, which
  a 25 GB image on a busy registry outlives;
- ``dragonfly``: Dragonfly preheat jobs for its manager's Open API (``POST /oapi/v1/jobs``), one per
  image and platform (a manifest list is preheated one platform at a time), into every peer.

The ImagePullJob is checked against OpenKruise's vendored CRD by ``k8s validate``; the preheat's
fields follow the manager's ``PreheatArgs`` binding rules (tests/test_prepull_engines.py reads
them from Dragonfly's vendored source). No credential is ever rendered: the preheat gets the
registry's username and password when it is posted (the note says how, from the pull secret).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal, get_args

from buildkit.errors import InputError, PublishFailed, Unavailable
from buildkit.imageref import registry_of, split_ref
from buildkit.plan import LABEL_PREFIX

Puller = Literal["daemonset", "openkruise", "dragonfly"]
PULLERS: tuple[str, ...] = get_args(Puller)
# ImagePullJob as every OpenKruise from 1.6 (its imagePullPolicy) to 1.9 serves it: 1.9 added v1beta1 and
# still serves v1alpha1 (converting), 1.8 and older serve v1alpha1 alone.
KRUISE_API = "apps.kruise.io/v1alpha1"
DRAGONFLY_VERSION = "v2.5.1"  # its request and result types: tests/fixtures/upstream/dragonfly
VARIANT_LABEL = f"{LABEL_PREFIX}/variant"  # gzip or zstd: `kubectl apply -l io.ascendkit/variant=gzip` takes one

# OpenKruise's defaults are 600 s per pull and 3 retries: a 20-30 GB image over a shared registry
# link takes longer than 600 s on a cold node, so a pull gets an hour and the job a day at most.
PULL_TIMEOUT_S = 3600
PULL_RETRIES = 3
JOB_DEADLINE_S = 86400
JOB_TTL_S = 86400
DEFAULT_PARALLELISM = 10  # nodes pulling at once: the registry's (or mirror's) link is what is shared
# Dragonfly: preheat into every peer of the cluster; the manager's default timeout (60 minutes) is
# too short for a 20-30 GB image on every peer of a fleet, so three hours.
PREHEAT_SCOPE = "all_peers"
PREHEAT_TIMEOUT_NS = 3 * 3600 * 10**9  # a Go time.Duration in JSON: nanoseconds


@dataclass(frozen=True)
class PrepullImage:
    """One image of the tag: a pinned reference (``NAME:TAG@sha256:...``), its layers' compression,
    and the platforms its index holds (empty: a single image, or not read)."""

    ref: str
    variant: str = "gzip"
    platforms: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return split_ref(self.ref)[0]

    @property
    def reference(self) -> str:
        """What the registry is asked for: the digest when pinned, else the tag."""
        _, tag, digest = split_ref(self.ref)
        return digest or tag or "latest"


def variant_of(ref: str) -> str:
    return "zstd" if split_ref(ref)[1].endswith("-zstd") else "gzip"


def the_image(ref: str) -> PrepullImage:
    """The image a job names, before its registry is asked (what a request starts with)."""
    return PrepullImage(ref, variant_of(ref))


def images_of_tag(ref: str) -> tuple[tuple[PrepullImage, ...], list[str]]:
    """Every published image of ``ref``'s tag: the named one and its gzip or ``-zstd`` sibling where
    the registry has it, each pinned, with the platforms of its index. Notes say what was found."""
    from buildkit.ship.oci.remote import index_platforms, pinned_platforms

    name, tag, _ = split_ref(ref)
    notes: list[str] = []
    found = [PrepullImage(ref, variant_of(ref), tuple(index_platforms(ref)))]
    if tag:
        sibling_tag = tag.removesuffix("-zstd") if tag.endswith("-zstd") else f"{tag}-zstd"
        try:
            sibling = pinned_platforms(f"{name}:{sibling_tag}")  # its digest and platforms in one read
        except (InputError, Unavailable, PublishFailed) as exc:  # not "no such tag": said, the named image still pre-pulled
            notes.append(f"could not ask for {name}:{sibling_tag} ({exc}); pre-pulling {ref} alone")
        else:
            if sibling is not None:
                found.append(PrepullImage(sibling[0], variant_of(sibling[0]), tuple(sibling[1])))
            else:
                notes.append(f"{name}:{sibling_tag} is not published: only {found[0].variant} is pre-pulled")
    else:
        notes.append(f"{ref} names no tag: its other compression cannot be found, only it is pre-pulled")
    found.sort(key=lambda image: image.variant != "gzip")  # gzip first: every runtime pulls it
    return tuple(found), notes


def imagepulljob(name: str, metadata: dict[str, Any], image: PrepullImage, node_labels: dict[str, str], **opts: Any) -> dict[str, Any]:
    """An OpenKruise ImagePullJob pulling ``image`` onto every node with ``node_labels``."""
    spec: dict[str, Any] = {
        "image": image.ref,
        "imagePullPolicy": "IfNotPresent",
        "selector": {"matchLabels": dict(node_labels)},
        "parallelism": opts.get("parallelism", DEFAULT_PARALLELISM),
        "pullPolicy": {"timeoutSeconds": PULL_TIMEOUT_S, "backoffLimit": PULL_RETRIES},
        "completionPolicy": {"type": "Always", "activeDeadlineSeconds": JOB_DEADLINE_S, "ttlSecondsAfterFinished": JOB_TTL_S},
    }
    if opts.get("pull_secret"):
        spec["pullSecrets"] = [opts["pull_secret"]]
    meta = {"name": name, **metadata, "labels": {**metadata.get("labels", {}), VARIANT_LABEL: image.variant}}
    return {"apiVersion": KRUISE_API, "kind": "ImagePullJob", "metadata": meta, "spec": spec}


def manifest_url(image: PrepullImage) -> str:
    """The image's manifest as Dragonfly fetches it: ``https://HOST/v2/REPO/manifests/REF``."""
    from buildkit.ship.oci.session import host_url

    where = registry_of(image.ref)
    assert where is not None, "a prepull image is pinned at its registry"
    host, repository = where
    return f"{host_url(host)}/v2/{repository}/manifests/{image.reference}"


def preheat_requests(images: tuple[PrepullImage, ...], bio: str) -> list[dict[str, Any]]:
    """One Dragonfly preheat job per image and platform (every peer of the cluster)."""
    requests = []
    for image in images:
        for platform in image.platforms or ("",):
            args: dict[str, Any] = {"type": "image", "url": manifest_url(image), "scope": PREHEAT_SCOPE, "timeout": PREHEAT_TIMEOUT_NS}
            if platform:
                args["platform"] = platform
            what = f"{bio}: {image.variant}" + (f" {platform}" if platform else "")
            requests.append({"type": "preheat", "bio": what, "args": args})
    return requests


def preheat_note(pull_secret: str | None, namespace: str | None) -> list[str]:
    """How to post the rendered preheat jobs, credentials added from the pull secret on the way."""
    ns = f" -n {namespace}" if namespace else ""
    post = (
        'curl -fsS -X POST "$DRAGONFLY_MANAGER/oapi/v1/jobs" -H "Authorization: Bearer $DRAGONFLY_TOKEN" '
        '-H "Content-Type: application/json" -d "$job"'
    )
    lines = [f"post each preheat job to Dragonfly {DRAGONFLY_VERSION}'s manager (a personal access token with the job scope):"]
    if pull_secret:
        lines += [
            f"  auth=$(kubectl get secret {pull_secret}{ns} -o jsonpath='{{.data.\\.dockerconfigjson}}' | base64 -d "
            "| jq -r '.auths[].auth' | head -1 | base64 -d)",
            '  jq -c --arg u "${auth%%:*}" --arg p "${auth#*:}" \'.[] | .args += {username: $u, password: $p}\' preheat.json |',
        ]
    else:
        lines.append("  jq -c '.[]' preheat.json |")
    lines += [f"    while read -r job; do {post}; done", "then follow each job: ascendkit k8s prepull-status (GET /oapi/v1/jobs/ID)"]
    return lines


def dump_preheat(requests: list[dict[str, Any]]) -> str:
    return json.dumps(requests, indent=2) + "\n"
