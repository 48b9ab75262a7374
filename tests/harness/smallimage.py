"""A small image of two layers (a few MB) with a build manifest and an SBOM beside it, as publishing
takes it: every fault mode of the tests and the quick benchmark gets a whole publish of its own in
seconds. Built FROM scratch on the engine; nothing in it runs."""

from __future__ import annotations

import io
import json
import tarfile
import uuid
from pathlib import Path

import docker

from buildkit.image.archive import identify
from buildkit.ship.layers.local import LocalImage


def build_small_image(client: docker.APIClient, manifests: Path) -> LocalImage:
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as tar:
        for name, data in (
            ("Dockerfile", b"FROM scratch\nCOPY noise /noise\nCOPY text /text\nLABEL io.ascendkit.test=faults\n"),
            ("noise", bytes(range(256)) * 4096 + uuid.uuid4().bytes * 65536),  # a new image each time: nothing cached anywhere
            ("text", b"an Ascend NPU image layer\n" * 200_000),
        ):
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    context.seek(0)
    image_id = ""
    for event in client.build(fileobj=context, custom_context=True, decode=True, rm=True):
        image_id = event.get("aux", {}).get("ID", image_id)
    if not image_id:
        raise RuntimeError("the small image did not build")
    identity = identify(client, image_id)  # the containerd store names it by its manifest's digest
    manifests.mkdir(parents=True, exist_ok=True)
    manifest = manifests / "fault-x86_64.json"
    recorded = {"id": identity.config, "engine_id": identity.engine_id, "tags": ["x/faults:fault-x86_64"]}
    manifest.write_text(json.dumps({"passed": True, "image": recorded}))
    (manifests / "fault-x86_64.cdx.json").write_text('{"bomFormat": "CycloneDX", "specVersion": "1.6", "components": []}\n')
    engine_id = "" if identity.engine_id == identity.config else identity.engine_id
    return LocalImage(identity.config, "x86_64", ("x86_64",), ("fault-x86_64", "alias-x86_64"), manifest, engine_id)
