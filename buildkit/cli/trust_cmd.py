"""``ascendkit keygen``, ``sign`` and ``verify``: cosign keys, signatures on images already in a
registry, and every check of an image's signatures and provenance, offline (no transparency log,
no engine)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from buildkit.cli.base import JsonFlag, MatrixPath, app, out, print_json, user_errors
from buildkit.cli.ship_options import MediaTypesOption, load_sign_key, passphrase, to_stderr
from buildkit.errors import ExitCode, InputError
from buildkit.resources import DEFAULT_MATRIX

KEY_FILE, PUB_FILE = "cosign.key", "cosign.pub"
RegistryImage = Annotated[str, typer.Argument(metavar="IMAGE", help="HOST[:PORT]/REPO:TAG or HOST[:PORT]/REPO@sha256:<hex>.")]


@app.command("keygen")
@user_errors
def keygen(
    output: Annotated[Path, typer.Option("--output", "-o", help="Directory for cosign.key and cosign.pub.")] = Path(),
    force: Annotated[bool, typer.Option("--force", help="Replace a key pair already there.")] = False,
) -> None:
    """Write a new key pair: cosign.key (encrypted with $COSIGN_PASSWORD, else a passphrase asked twice) and cosign.pub."""
    from buildkit.fsio import check_output_dir, write_all_atomic
    from buildkit.trust.keys import generate

    key, pub = output / KEY_FILE, output / PUB_FILE
    existing = [str(p) for p in (key, pub) if p.exists()]
    if existing and not force:
        raise InputError(f"{', '.join(existing)} already exist: keep them, or give --force to replace the key pair")
    check_output_dir(output, "key directory")
    private_pem, public_pem = generate(passphrase(f"Passphrase for the new {key}", confirm=True))
    output.mkdir(parents=True, exist_ok=True)
    write_all_atomic([(key, private_pem), (pub, public_pem)])
    key.chmod(0o600)
    typer.echo(f"wrote {key} (private, encrypted; keep it secret) and {pub} (give it to whoever verifies)", err=True)


@app.command("sign")
@user_errors
def sign(
    image: RegistryImage,
    key: Annotated[str, typer.Option("--key", metavar="KEY", help="cosign.key (a file, or env://VAR holding the PEM).")],
    media_types: MediaTypesOption = None,
    as_json: JsonFlag = False,
) -> None:
    """Sign an image in a registry (an index and every member) with a cosign key, as cosign does:
    a signature at sha256-<hex>.sig beside each digest, for this repository. No network beyond the registry."""
    from buildkit.ship.trust.checks import check_registry_ref, resolve, sign_tree

    check_registry_ref(image)
    signer = load_sign_key(key)
    registry, repository, manifest = resolve(image)
    form = media_types.value if media_types else None
    signed = sign_tree(registry, repository, manifest, signer, form, to_stderr)  # type: ignore[arg-type]
    typer.echo(f"signed {registry.host}/{repository}@{manifest.digest}: {len(signed)} manifest(s)", err=True)
    if as_json:
        print_json({"image": f"{registry.host}/{repository}@{manifest.digest}", "signed": signed, "key": signer.public.keyid})


@app.command("verify")
@user_errors
def verify(
    image: RegistryImage,
    key: Annotated[str, typer.Option("--key", metavar="KEY", help="cosign.pub (a file, or env://VAR holding the PEM).")],
    matrix: MatrixPath = DEFAULT_MATRIX,
    as_json: JsonFlag = False,
) -> None:
    """Check an image with no engine: the signature of the index and of each member, each member's
    provenance (signature, subject), and that its pins match the SBOM and the matrix stack its labels
    name. Exit 0 when every check passes, 1 naming each that failed."""
    from buildkit.cli.tables import RichTable as Table
    from buildkit.matrix.load import load_matrix
    from buildkit.plan.layers import expected_packages
    from buildkit.ship.trust.checks import check_registry_ref, verify_image
    from buildkit.trust.keys import load_public_key

    check_registry_ref(image)
    public = load_public_key(key)
    loaded = load_matrix(matrix)

    def stack_pins(stack_id: str) -> dict[str, str] | None:
        stack = loaded.matrix.stacks.get(stack_id)
        return None if stack is None else expected_packages(stack)

    where, checks = verify_image(image, public, stack_pins)
    failed = [c for c in checks if c.failed]
    if as_json:
        print_json({"image": where, "key": public.keyid, "ok": not failed, "checks": [c.describe() for c in checks]})
    else:
        table = Table(title=f"{where}: {len(checks) - len(failed)} of {len(checks)} checks passed")
        for column in ("check", "result", "detail"):
            table.add_column(column)
        for check in checks:
            table.add_row(check.name, "FAILED" if check.failed else check.status, check.detail)
        out.print(table)
    if failed:
        typer.echo(f"ascendkit: {where}: failed: {', '.join(c.name for c in failed)}", err=True)
        raise typer.Exit(int(ExitCode.CHECK_FAILED))
