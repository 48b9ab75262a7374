"""The ``ascendkit`` commands and the modules that define them, read without importing those modules.

``ascendkit --help`` lists the commands from this table, and running a command imports only the
modules it names, so the command starts without loading every other one (Typer and its
conversion of every option are most of a start-up). ``help`` is each command's help text as its
module gives it; tests/test_cli.py checks the table against the modules and that the listing is
the one the fully loaded command prints (``ASCENDKIT_UPDATE_GOLDEN=1`` rewrites it).
"""

from __future__ import annotations

# name -> its line in `ascendkit --help`: one whole sentence that fits beside the name in 80 columns
SUMMARIES: dict[str, str] = {
    "build": "Build, verify and tag images from the matrix.",
    "publish": "Push verified images and their indexes to registries.",
    "mirror": "Copy a published image between registries by digest.",
    "describe": "Set a repository's description to its overview page.",
    "keygen": "Write a cosign key pair for signing images.",
    "sign": "Sign an image in a registry with a cosign key.",
    "verify": "Check an image's signatures and provenance offline.",
    "doctor": "Check that this host or image is ready for its NPUs.",
    "lock": "Pin every package of an image, with hashes.",
    "wheelhouse": "Download an image's locked packages for offline builds.",
    "compare": "Judge an NPU run against a GPU baseline.",
    "plan": "List the images the matrix builds.",
    "render": "Render Dockerfiles and every generated file.",
    "sbom": "List or diff the components of an image.",
    "diff": "Compare two published images file by file.",
    "rebuild": "Rebuild an image from its inputs and compare.",
    "smoke": "Run a short training job in an image and judge it.",
    "matrix": "Inspect and validate the compatibility matrix.",
    "k8s": "Kubernetes manifests and the node preflight.",
    "metrics": "Read verl and OpenRLHF console logs.",
    "baseline": "Make baselines from real GPU runs.",
    "team": "A team's image on top of a reference image.",
}

# name -> (modules that register it, its help text), in the order --help lists them
COMMANDS: dict[str, tuple[tuple[str, ...], str]] = {
    "build": (
        ("buildkit.cli.build_cmd",),
        (
            "Build, verify and tag one image (one stack, chip, OS and arch), or with --all every image the "
            "filters leave; optionally push them."
        ),
    ),
    "publish": (
        ("buildkit.cli.publish_cmd",),
        (
            "Push verified images by digest with their SBOMs to each registry, then the multi-arch index (refused if an "
            "arch is missing); or, with --index-only, only the indexes of images already pushed."
        ),
    ),
    "mirror": (
        ("buildkit.cli.publish_cmd",),
        (
            "Copy a published image (an index with every member, the SBOM and every other attachment) from one registry "
            "to another by digest, byte for byte, with no engine; what the destination has is not sent again."
        ),
    ),
    "describe": (
        ("buildkit.cli.publish_cmd",),
        (
            "Set a repository's description on quay.io, Harbor or Docker Hub to an overview page; credentials from "
            "$ASCENDKIT_REGISTRY_TOKEN (quay) or $ASCENDKIT_REGISTRY_USERNAME / _PASSWORD, never an argument."
        ),
    ),
    "keygen": (
        ("buildkit.cli.trust_cmd",),
        "Write a new key pair: cosign.key (encrypted with $COSIGN_PASSWORD, else a passphrase asked twice) and cosign.pub.",
    ),
    "sign": (
        ("buildkit.cli.trust_cmd",),
        (
            "Sign an image in a registry (an index and every member) with a cosign key, as cosign does: a signature at "
            "sha256-<hex>.sig beside each digest, for this repository. No network beyond the registry."
        ),
    ),
    "verify": (
        ("buildkit.cli.trust_cmd",),
        (
            "Check an image with no engine: the signature of the index and of each member, each member's provenance "
            "(signature, subject), and that its pins match the SBOM and the matrix stack its labels name. Exit 0 when "
            "every check passes, 1 naming each that failed."
        ),
    ),
    "doctor": (
        ("buildkit.cli.doctor_cmd",),
        "Check pins, the CANN environment, the driver, the NPUs and their links here (exit 1: failed, 10: no devices, preflight only).",
    ),
    "lock": (
        ("buildkit.cli.lock_cmd",),
        "Write locks/<stack>-<arch>.txt: every package of the image, pinned with hashes, for the target.",
    ),
    "wheelhouse": (
        ("buildkit.cli.lock_cmd",),
        "Download every locked artifact of one stack and arch, each checked against the lock's hashes.",
    ),
    "compare": (
        ("buildkit.cli.metrics_cmd",),
        "Judge an NPU run against a reference run by one method (exit 1 when it fails; docs/smoke.md says what each proves).",
    ),
    "plan": (
        ("buildkit.cli.plan_cmd",),
        "List the build targets (stack, chip, OS, arch) with base image, tags, lock status and SKUs.",
    ),
    "render": (
        ("buildkit.cli.render_cmd",),
        "Render a Dockerfile for one SKU, or (with --all / --check) every generated file.",
    ),
    "sbom": (
        ("buildkit.cli.sbom_cmd",),
        (
            "The components of an image (Python packages, OS packages, CANN, git checkouts, base image) from its "
            "CycloneDX SBOM; or, with `diff A B`, those added, removed and changed from A to B."
        ),
    ),
    "diff": (
        ("buildkit.cli.diff_cmd",),
        (
            "Compare two published images as a rebuild is checked: the same manifest digest, or each differing file "
            "named with its layer and what differs (content, mtime, mode, owner, link, kind, on one side only) and each "
            "differing config field. Exit 0 when they are the same image, 1 when they differ."
        ),
    ),
    "rebuild": (
        ("buildkit.cli.rebuild_cmd",),
        (
            "Rebuild an image from its recorded inputs (stack, SKU, arch, OS, the base by digest, each lock "
            "section by sha256, the epoch): a published one's from its provenance, a local one's (NAME:TAG on "
            "this engine) from its build record in --manifest-dir, published to --to first as `publish` would "
            "(its own tag and record left as they were; the rebuild tagged REPO-rebuilt, recorded in "
            "--manifest-dir/rebuilt). Built with nothing cached, published to --to as the original was, and "
            "compared: exit 0 when it is the same image (the same digest), 1 when it differs, each differing file "
            "named with its layer and what differs. An image whose inputs cannot be recovered here (no provenance "
            "or no epoch, another matrix stack or lock section, a base this engine lacks) is refused (exit 2) "
            "before anything is built."
        ),
    ),
    "smoke": (
        ("buildkit.cli.smoke_cmd",),
        (
            "Check the job's config with the image's framework, run doctor and a short GRPO (or verl SFT) job "
            "with the SKU's devices; judge it and write a report."
        ),
    ),
    "matrix": (
        ("buildkit.cli.matrix_cmd", "buildkit.cli.outdated_cmd"),
        "Inspect and validate compat_matrix.yaml.",
    ),
    "k8s": (
        ("buildkit.cli.k8s_cmd",),
        (
            "Kubernetes manifests for published images (Job, KubeRay RayJob, Volcano Job, preflight and prepull DaemonSets) "
            "and the preflight verdict."
        ),
    ),
    "metrics": (
        ("buildkit.cli.metrics_cmd",),
        "Read verl and OpenRLHF console logs.",
    ),
    "baseline": (
        ("buildkit.cli.metrics_cmd", "buildkit.cli.replay_cmd"),
        "Baselines from real GPU runs.",
    ),
    "team": (
        ("buildkit.cli.team_cmd",),
        "A team's image on top of a reference image: its packages, its framework fork, its files.",
    ),
}
