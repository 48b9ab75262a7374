"""``ascendkit k8s prepull-status``: where a pre-pull stands, node by node, from what the cluster says.

It reads what each puller reports, as kubectl or the manager prints it:

- the DaemonSet's pods (``kubectl get pods -l app.kubernetes.io/instance=NAME -o json``): a node is
  done when its container runs, failed when the kubelet gives up pulling (``ErrImagePull``,
  ``ImagePullBackOff``, with the engine's message); its time is from scheduling to the start;
- an OpenKruise ImagePullJob (``kubectl get imagepulljob NAME -o json``), with the NodeImages
  (``kubectl get nodeimages -o json``) for each node's phase, message and pull time;
- Dragonfly preheat jobs (``GET /oapi/v1/jobs/ID``, one job or a JSON list): each peer that
  succeeded or failed, with the description the scheduler gave.

Field names follow the pullers' own types: OpenKruise v1.9.0 ``ImagePullJobStatus`` and
``NodeImageStatus`` (the vendored CRDs), Dragonfly v2.5.1 ``models.Job``, ``GroupJobState`` and
``PreheatResponse`` (tests/fixtures/upstream/dragonfly).
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from buildkit.errors import InputError
from buildkit.fsio import read_input_json
from buildkit.imageref import split_ref

# What the kubelet says when it cannot pull (kubernetes pkg/kubelet/images/types.go) and will not retry soon.
PULL_FAILURES = {
    "ErrImagePull", "ImagePullBackOff", "InvalidImageName", "ErrImageNeverPull", "RegistryUnavailable", "SignatureValidationFailed",
}  # fmt: skip


@dataclass(frozen=True)
class NodePull:
    node: str
    state: str  # done, failed, pulling, waiting
    seconds: float | None = None
    reason: str = ""

    def describe(self) -> dict[str, Any]:
        return {"node": self.node, "state": self.state, "seconds": self.seconds, "reason": self.reason}


@dataclass(frozen=True)
class PrepullStatus:
    puller: str
    what: str  # the job or DaemonSet, the image
    nodes: list[NodePull] = field(default_factory=list)
    desired: int | None = None  # nodes the puller means to pull on, where it says
    message: str = ""
    counts: dict[str, int] = field(default_factory=dict)  # the puller's own counts, where its nodes are not listed

    def count(self, state: str) -> int:
        return max(self.counts.get(state, 0), sum(1 for n in self.nodes if n.state == state))

    @property
    def complete(self) -> bool:
        wanted = self.desired if self.desired is not None else len(self.nodes)
        return self.count("done") >= wanted and not self.count("failed")

    def percentile(self, q: float) -> float | None:
        times = sorted(n.seconds for n in self.nodes if n.state == "done" and n.seconds is not None)
        if not times:
            return None
        if len(times) == 1:
            return times[0]
        return statistics.quantiles(times, n=100, method="inclusive")[round(q * 100) - 1]

    def describe(self) -> dict[str, Any]:
        return {
            "puller": self.puller,
            "what": self.what,
            "desired": self.desired,
            "done": self.count("done"),
            "failed": self.count("failed"),
            "pending": self.count("pulling") + self.count("waiting"),
            "complete": self.complete,
            "p50_seconds": self.percentile(0.5),
            "p99_seconds": self.percentile(0.99),
            "message": self.message,
            "nodes": [n.describe() for n in self.nodes],
        }


def _time(value: Any) -> datetime | None:
    if not isinstance(value, str) or not value:
        return None
    try:
        return datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        return None


def _seconds(start: Any, end: Any) -> float | None:
    a, b = _time(start), _time(end)
    return (b - a).total_seconds() if a and b else None


def read(source: str, node_images: str | None = None) -> PrepullStatus:
    """The status in ``source`` (a file, or - for stdin), whichever puller it comes from."""
    doc = read_json(source)
    if isinstance(doc, list) or (isinstance(doc, dict) and doc.get("type") == "preheat"):
        if node_images:
            raise InputError("--node-images goes with an OpenKruise ImagePullJob, not with Dragonfly jobs")
        return dragonfly_status(doc if isinstance(doc, list) else [doc], source)
    if not isinstance(doc, dict):
        raise InputError(f"{source}: expected a JSON object (kubectl ... -o json) or Dragonfly jobs")
    kind = doc.get("kind")
    if kind == "ImagePullJob":
        listed = read_json(node_images) if node_images else None
        if node_images and not (isinstance(listed, dict) and isinstance(listed.get("items"), list)):
            raise InputError(f"--node-images {node_images}: expected a List (kubectl get nodeimages -o json)")
        return kruise_status(doc, listed, source)
    if node_images:
        raise InputError("--node-images goes with an OpenKruise ImagePullJob")
    if kind in ("PodList", "List") and all(isinstance(i, dict) and i.get("kind", "Pod") == "Pod" for i in doc.get("items", [])):
        return daemonset_status(doc["items"], source)
    raise InputError(
        f"{source}: a {kind or 'document without a kind'}: give the DaemonSet's pods (kubectl get pods -l ... -o json), "
        "an ImagePullJob (kubectl get imagepulljob NAME -o json) or Dragonfly jobs (GET /oapi/v1/jobs/ID)"
    )


def read_json(source: str) -> Any:
    """What kubectl (or Dragonfly's manager) printed as JSON, from a file or - (stdin)."""
    return read_input_json(source, "status", "ask kubectl for -o json")


def daemonset_status(pods: list[dict[str, Any]], source: str) -> PrepullStatus:
    nodes = []
    images: set[str] = set()
    for pod in pods:
        spec, status = pod.get("spec") or {}, pod.get("status") or {}
        node = spec.get("nodeName") or f"(unscheduled: {(pod.get('metadata') or {}).get('name', '?')})"
        images.update(c.get("image", "") for c in spec.get("containers", []))
        scheduled = next((c.get("lastTransitionTime") for c in status.get("conditions", []) if c.get("type") == "PodScheduled"), None)
        states = [c.get("state") or {} for c in status.get("containerStatuses", [])]
        waiting = [s["waiting"] for s in states if "waiting" in s]
        running = [s["running"] for s in states if "running" in s]
        failed = [w for w in waiting if w.get("reason") in PULL_FAILURES]
        if failed:
            nodes.append(NodePull(node, "failed", None, f"{failed[0]['reason']}: {failed[0].get('message', '')}".strip(": ")))
        elif states and len(running) == len(states):
            nodes.append(NodePull(node, "done", _seconds(scheduled, running[0].get("startedAt"))))
        else:
            reasons = ", ".join(w.get("reason", "") for w in waiting)
            nodes.append(NodePull(node, "pulling" if spec.get("nodeName") else "waiting", None, reasons))
    what = f"DaemonSet pods ({', '.join(sorted(images))})" if images else f"DaemonSet pods ({source})"
    return PrepullStatus("daemonset", what, sorted(nodes, key=lambda n: n.node), desired=len(pods))


def kruise_status(job: dict[str, Any], node_images: Any, source: str) -> PrepullStatus:
    spec, status = job.get("spec") or {}, job.get("status") or {}
    image = spec.get("image", "")
    name, tag, digest = split_ref(image)
    wanted_tag = digest or tag or "latest"
    failed_nodes = set(status.get("failedNodes") or [])
    nodes: dict[str, NodePull] = {}
    for item in node_images["items"] if node_images is not None else []:
        if not isinstance(item, dict):
            continue
        node = (item.get("metadata") or {}).get("name", "?")
        image_statuses = (item.get("status") or {}).get("imageStatuses") or {}
        for key, value in image_statuses.items():
            if not _same_repository(key, name):
                continue
            for tag_status in (value or {}).get("tags") or []:
                if tag_status.get("tag") != wanted_tag:
                    continue
                phase = tag_status.get("phase", "")
                state = {"Succeeded": "done", "Failed": "failed", "Pulling": "pulling"}.get(phase, "waiting")
                seconds = _seconds(tag_status.get("startTime"), tag_status.get("completionTime")) if state == "done" else None
                reason = tag_status.get("message", "") if state != "done" else ""
                if state == "pulling" and tag_status.get("progress") is not None:
                    reason = f"{tag_status['progress']}%"
                nodes[node] = NodePull(node, state, seconds, reason)
    for node in failed_nodes - set(nodes):
        nodes[node] = NodePull(node, "failed", None, "named in the job's failedNodes")
    what = f"ImagePullJob {_name(job)} ({image})"
    counts = {state: int(status.get(key) or 0) for state, key in (("done", "succeeded"), ("failed", "failed"), ("pulling", "active"))}
    message = status.get("message", "") + ("" if node_images is not None else " (each node's time and reason: give --node-images)")
    return PrepullStatus("openkruise", what, sorted(nodes.values(), key=lambda n: n.node), status.get("desired"), message.strip(), counts)


def _name(doc: dict[str, Any]) -> str:
    meta = doc.get("metadata") or {}
    return f"{meta.get('namespace')}/{meta.get('name')}" if meta.get("namespace") else str(meta.get("name", "?"))


def _same_repository(key: str, name: str) -> bool:
    """NodeImage keys are familiar names (docker.io/library/x is x): the image's name, either way."""

    def familiar(n: str) -> str:
        return n.removeprefix("docker.io/").removeprefix("library/")

    return familiar(key) == familiar(name)


def _dicts(value: Any) -> list[dict[str, Any]]:
    return [v for v in value if isinstance(v, dict)] if isinstance(value, list) else []


def dragonfly_status(jobs: list[Any], source: str) -> PrepullStatus:
    """One row per peer over every job: failed where any job failed on it (each description), else done."""
    done: set[str] = set()
    failed: dict[str, list[str]] = {}
    messages = []
    for job in jobs:
        if not isinstance(job, dict) or job.get("type") != "preheat":
            raise InputError(f'{source}: expected Dragonfly preheat jobs (GET /oapi/v1/jobs/ID), each with "type": "preheat"')
        args, result = job.get("args"), job.get("result")
        url = args.get("url", "") if isinstance(args, dict) else ""
        state = job.get("state", "")
        for job_state in _dicts(result.get("job_states") if isinstance(result, dict) else None):
            if job_state.get("error"):
                messages.append(f"job {job.get('id')}: {job_state['error']}")
            for response in _dicts(job_state.get("results")):
                done.update(_peer(task) for task in _dicts(response.get("success_tasks")))
                for task in _dicts(response.get("failure_tasks")):
                    failed.setdefault(_peer(task), []).append(str(task.get("description", "")))
        if state in ("PENDING", "RECEIVED", "STARTED", "RETRY"):
            messages.append(f"job {job.get('id')} ({url}) is {state}")
        elif state == "FAILURE" and not failed:
            messages.append(f"job {job.get('id')} ({url}) FAILED")
    peers = [NodePull(peer, "failed", None, "; ".join(dict.fromkeys(why))) for peer, why in failed.items()]
    peers += [NodePull(peer, "done") for peer in done - set(failed)]
    return PrepullStatus("dragonfly", f"{len(jobs)} preheat job(s)", sorted(peers, key=lambda n: n.node), None, "; ".join(messages))


def _peer(task: dict[str, Any]) -> str:
    return f"{task.get('hostname', '?')} ({task.get('ip', '?')})"


def format_table(status: PrepullStatus) -> str:
    d = status.describe()
    lines = [f"{status.puller}: {status.what}"]
    head = f"{d['done']} done, {d['failed']} failed, {d['pending']} pending" + (f" of {d['desired']}" if d["desired"] is not None else "")
    times = [f"{label} {value:.0f} s" for label, value in (("p50", d["p50_seconds"]), ("p99", d["p99_seconds"])) if value is not None]
    lines.append(head + (f"; per node {', '.join(times)}" if times else ""))
    if status.message:
        lines.append(status.message)
    width = max((len(n.node) for n in status.nodes), default=4)
    for n in status.nodes:
        seconds = f"{n.seconds:8.0f} s" if n.seconds is not None else " " * 10
        lines.append(f"  {n.node:<{width}}  {n.state:<7} {seconds}  {n.reason}".rstrip())
    lines.append("complete: every node has the image" if status.complete else "not complete")
    return "\n".join(lines)
