"""The one place `k8s render` is asked for: the request built and checked from the options before
any registry is asked, then the image resolved at its registry (a tag pinned to its digest, the
stack, framework and user its labels name). `ascendkit k8s render` and :func:`buildkit.api.k8s_render`
both go through here."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

from buildkit.errors import InputError, PublishFailed, Unavailable
from buildkit.k8s import NodeRuntime
from buildkit.k8s.prepull import images_of_tag
from buildkit.k8s.request import NODE_JOBS, K8sRequest, check_request
from buildkit.matrix.load import LoadedMatrix, check_stack_sku, resolve_sku, resolve_stack
from buildkit.matrix.model import ImageUser
from buildkit.plan import LABEL_PREFIX, USER_LABEL
from buildkit.run.job import ImageJob, JobFacts, check_overrides


@dataclass(frozen=True)
class Resolved:
    """A request ready to render, and what the user should be told about how it was made."""

    request: K8sRequest
    notes: tuple[str, ...] = ()  # what was looked up (a tag's digest)
    warnings: tuple[str, ...] = ()  # what could not be, and what was assumed instead


def make_request(
    loaded: LoadedMatrix,
    hw: str,
    image: str,
    *,
    stack: str | None = None,
    arch: str | None = None,
    overrides: Sequence[str] = (),
    command: Sequence[str] = (),
    nodes: int = 1,
    job: str = "smoke",
    scheduler: str = "default",
    queue: str | None = None,
    kuberay: bool = True,
    npu_resource: str | None = None,
    nic: str = "eth0",
    host_network: bool | None = None,
    node_runtime: NodeRuntime = "ascend",
    network_topology: str | None = None,
    topology_tier: int | None = None,
    namespace: str | None = None,
    device_gid: int | None = None,
    puller: str = "daemonset",
    parallelism: int | None = None,
    pull_secret: str | None = None,
    name: str | None = None,
    model_path: str | None = None,
    model_pvc: str | None = None,
    steps: int = 5,
    deadline: int = 3600,
    allow_tag: bool = False,
) -> K8sRequest:
    """The request, every refusal of the options made (exit 2) before any registry is asked."""
    sku_id, sku, _ = resolve_sku(loaded, hw, "pods are sized by the SKU")
    if stack is not None:
        check_stack(loaded, stack, sku_id)
    request = K8sRequest(
        sku_id=sku_id,
        sku=sku,
        image=image,
        nodes=nodes,
        job=job,
        command=tuple(command),
        namespace=namespace,
        name=name,
        pull_secret=pull_secret,
        arch=arch or sku.host_arch,
        model_path=model_path,
        model_pvc=model_pvc,
        steps=steps,
        deadline_s=deadline,
        allow_tag=allow_tag,
        overrides=check_overrides(list(overrides)),
        facts=JobFacts.of(loaded.matrix.compat),
        scheduler=scheduler,
        queue=queue,
        kuberay=kuberay,
        npu_resource=npu_resource,
        nic=nic,
        host_network=host_network,
        node_runtime=node_runtime,
        topology_mode=network_topology,
        topology_tier=topology_tier,
        user=loaded.matrix.image_user,
        device_gid=device_gid,
        puller=puller,
        parallelism=parallelism,
    )
    check_request(request, to_pin=True)
    return request


def resolve(loaded: LoadedMatrix, request: K8sRequest, stack: str | None = None) -> Resolved:
    """The request with its image as the registry has it: a tag pinned to its digest (unless
    ``allow_tag``), the job's stack and framework from the image's labels (else ``stack``), the
    pods' user from the labels (else the matrix's). An unreachable registry is exit 4 only where
    nothing else can stand in for what it would have said."""
    from buildkit.ship.oci.remote import image_labels, pin_digest

    notes: list[str] = []
    warnings: list[str] = []
    image = request.image
    if "@" not in image and not request.allow_tag:  # a registry's tag: what it names now, pinned
        image = pin_digest(image)
        notes.append(f"--image {request.image} is {image.partition('@')[2]} at its registry now; the manifests pin {image}")
        request = dataclasses.replace(request, image=image)
    if request.smoke_job is not None:
        found, said, labels = _image_job(loaded, image, request.arch, stack)
        warnings += said
        if found.stack is not None and found.stack != stack:
            check_stack(loaded, found.stack, request.sku_id, what=f"{image} (its {LABEL_PREFIX}.stack label)")
        user, problem = user_of(labels, loaded.matrix.image_user)
        warnings += [problem] if problem else []
        request = dataclasses.replace(request, image_job=found, user=user)
    elif request.job in NODE_JOBS:  # the pods run as the image's user: its labels, where the registry answers
        try:
            labels = image_labels(image, request.arch)
        except (InputError, Unavailable, PublishFailed) as exc:
            labels, warnings = {}, [f"could not read the image's labels ({exc}): the pods run as the matrix's user"]
        user, problem = user_of(labels, loaded.matrix.image_user)
        warnings += [problem] if problem else []
        request = dataclasses.replace(request, user=user)
        if request.job == "prepull" and request.puller != "daemonset":  # every image of the tag as the registry holds it
            try:
                images, said = images_of_tag(image)
            except (Unavailable, PublishFailed) as exc:  # the pullers are rendered for what the registry holds
                raise Unavailable(f"cannot list the images of {image} for --puller {request.puller}: {exc}") from None
            notes += said
            request = dataclasses.replace(request, prepull_images=images)
    elif stack is not None:  # your own command: --stack still names the framework (labels, default name)
        chosen = loaded.matrix.stacks[stack]
        request = dataclasses.replace(request, image_job=ImageJob.of(stack, chosen))
    return Resolved(request, tuple(notes), tuple(warnings))


def check_stack(loaded: LoadedMatrix, stack: str, sku_id: str, what: str = "--stack") -> None:
    """The stack must be one of the matrix's and support the SKU: the checks `render` and `build` make, named by ``what``."""
    try:
        resolve_stack(loaded, stack)
        check_stack_sku(loaded, stack, sku_id)
    except InputError as exc:
        raise InputError(f"{what}: {exc}") from None


def _image_job(loaded: LoadedMatrix, image: str, arch: str, stack: str | None) -> tuple[ImageJob, list[str], dict[str, str]]:
    """Which stack and framework the image carries: its labels as the registry serves them (returned
    too), else ``--stack``.

    A ``--stack`` that disagrees with the image's own label is refused: the job's arguments
    (which framework's job; ``trainer.device=npu`` for a verl without NPU auto-detection) follow from it.
    """
    from buildkit.run.smoke import image_job_of
    from buildkit.ship.oci.remote import image_labels

    unreachable = False
    try:
        labels = image_labels(image, arch)
        problem = f"it has no {LABEL_PREFIX}.stack label"
    except (InputError, Unavailable, PublishFailed) as exc:
        labels, problem, unreachable = {}, str(exc), isinstance(exc, Unavailable)
    found = labels.get(f"{LABEL_PREFIX}.stack")
    if found is not None:
        if stack is not None and stack != found:
            raise InputError(f"--stack {stack}: {image} is built from stack {found!r} (its {LABEL_PREFIX}.stack label)")
        return image_job_of(labels, found), [], labels
    if stack is None:  # a registry that cannot be reached is that (exit 4), not a mistake in the command
        error = Unavailable if unreachable else InputError
        raise error(f"cannot tell which stack and framework {image} carries ({problem}); pass --stack with the stack it was built from")
    st = loaded.matrix.stacks[stack]
    return (
        ImageJob.of(stack, st),
        [f"the job follows --stack {stack} ({st.framework} {st.framework_version}): could not read the image's labels: {problem}"],
        {},
    )


def user_of(labels: dict[str, str], default: ImageUser) -> tuple[ImageUser, str | None]:
    """The user the pods run as: the image's own (its labels), else the matrix's; a warning when
    the labels say the image has none (built before images had a user)."""
    from buildkit.run.devices import image_user

    if not labels:
        return default, None
    name, uid, gid = image_user(labels, "")
    if uid == 0:
        return default, (
            f"the image has no {USER_LABEL} label (built before images ran as a user): the pods run as uid {default.uid}, "
            "which may have no passwd entry in it; rebuild the image"
        )
    return default.model_copy(update={"name": name, "uid": uid, "gid": gid}), None
