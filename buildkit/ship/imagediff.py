"""Two published images compared file by file, as diffoci does: which layer, which file, and what
differs (content, mtime, mode, owner, link target, kind, or a file on one side only), and the config
field by field. What ``ascendkit diff`` prints and ``rebuild`` reports when a rebuild does not match.

Layers are read from the registry as they stream (decompressed on the way, never stored whole), one
image's layer beside the other's at the same position; a file's content is compared by its sha256.
"""

from __future__ import annotations

import hashlib
import json
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import IO, Any, cast

from buildkit.errors import InputError, PublishFailed
from buildkit.imageref import registry_of, split_ref
from buildkit.ship.layers.compressors import BLOCK, StoredLayer
from buildkit.ship.oci.registry import Manifest, Registry
from buildkit.ship.trust.attach import member_digest

# The config fields compared (rootfs is the layers, compared file by file instead); created and history
# differ between builds at other moments unless publishing normalized them.
CONFIG_FIELDS = ("architecture", "os", "config", "rootfs", "history", "created")


@dataclass(frozen=True)
class Entry:
    kind: str
    mode: int
    owner: str
    mtime: int
    size: int
    link: str
    sha256: str


@dataclass(frozen=True)
class Difference:
    layer: int  # 1-based position (A's, or the side's that alone has the layer); 0 for the config, -1 for the layers
    path: str
    what: str  # content, mtime, mode, owner, link, kind, only in A/B, removed in A/B, added in A/B, a config field, ...
    a: str = ""
    b: str = ""
    side: str = ""  # "A" or "B": a layer only that image has (inserted, dropped or added on top)
    created_by: str = ""  # the history's created_by of the layer, where one side alone has it
    normalization: bool = False  # only what publishing normalizes differs (a time, tar headers, the compression)
    layer_b: int = 0  # B's position of the layer, where it is not A's

    def where(self) -> str:
        if self.layer == 0:
            return "config"
        if self.layer < 0:
            return "layers"
        if self.side:
            return f"layer {self.layer} of {self.side}"
        return f"layer {self.layer}" + (f" (B's {self.layer_b})" if self.layer_b and self.layer_b != self.layer else "")

    def line(self) -> str:
        detail = f": {self.a} != {self.b}" if self.a or self.b else ""
        if self.what.startswith(("only in ", "added in ")):  # one side's entry: what it is
            detail = f": {self.a or self.b}"
        if self.side and not self.path:  # a layer one side alone has: the step that made it
            detail = f": {self.created_by[:200] or '(no history)'}"
        return f"{self.where()}: {self.path}: {self.what}{detail}" if self.path else f"{self.where()}: {self.what}{detail}"

    def as_dict(self) -> dict[str, Any]:
        found: dict[str, Any] = {"layer": self.layer, "path": self.path, "what": self.what, "a": self.a, "b": self.b}
        found.update(side=self.side, created_by=self.created_by, normalization=self.normalization, layer_b=self.layer_b or self.layer)
        return found


@dataclass
class Published:
    """One image (one platform) as a registry serves it."""

    ref: str
    registry: Registry
    repository: str
    manifest: Manifest
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def layers(self) -> list[dict[str, Any]]:
        return list(self.manifest.json().get("layers") or [])


_KINDS = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
}


def check_ref(ref: str) -> tuple[str, str]:
    """(host, repository) of a published image's reference; refused, with no contact, when it names no registry."""
    where = registry_of(ref)
    if where is None:
        raise InputError(f"{ref}: not a registry reference (HOST[:PORT]/REPO[:TAG][@sha256:...]): a published image is compared")
    return where


def read_published(ref: str, arch: str | None) -> Published:
    """``HOST[:PORT]/REPO[:TAG][@DIGEST]`` as its registry serves it; of an index, its ``arch`` image."""
    host, repository = check_ref(ref)
    _, tag, digest = split_ref(ref)
    registry = Registry(host)
    manifest = registry.get_manifest(repository, digest or tag or "latest")
    if manifest is None:
        raise InputError(f"{ref}: the registry {host} has no such image")
    if manifest.is_index:  # its arch's image (member_digest refuses an index without --arch, or without that arch)
        digest = member_digest(manifest, arch, ref)
        member = registry.get_manifest(repository, digest)
        if member is None:
            raise PublishFailed(f"{ref}: the index names {digest}, which the registry does not serve")
        manifest = member
    config_digest = (manifest.json().get("config") or {}).get("digest")
    body = registry.get_blob(repository, str(config_digest)) if config_digest else None
    if body is None:
        raise PublishFailed(f"{ref}: the registry does not serve its config {config_digest}")
    return Published(ref, registry, repository, manifest, json.loads(body))


def _entries(stream: IO[bytes]) -> Iterator[tuple[str, Entry]]:
    layer = StoredLayer(stream)  # gzip, zstd or a plain tar, told by its first bytes
    with tarfile.open(fileobj=layer.reader, mode="r|") as archive:
        for member in archive:
            sha = ""
            if member.isfile():
                source = archive.extractfile(member)
                digest = hashlib.sha256()
                while source is not None and (chunk := source.read(BLOCK)):
                    digest.update(chunk)
                sha = digest.hexdigest()
            kind = _KINDS.get(member.type, f"type {member.type.decode(errors='replace')}")
            entry = Entry(kind, member.mode, f"{member.uid}:{member.gid}", int(member.mtime), member.size, member.linkname, sha)
            yield member.name.rstrip("/"), entry


def layer_files(image: Published, position: int) -> dict[str, Entry]:
    """The entries of the image's layer at ``position`` (0-based), read from the registry."""
    descriptor = image.layers[position]
    response = image.registry.open_blob(image.repository, str(descriptor["digest"]))
    try:
        return dict(_entries(cast(IO[bytes], response.raw)))
    except (tarfile.TarError, ValueError, EOFError, OSError) as exc:
        raise PublishFailed(f"{image.ref}: layer {position + 1} ({descriptor['digest']}) is unreadable: {exc}") from None
    finally:
        response.close()


WHITEOUT = ".wh."
OPAQUE = ".wh..wh..opq"


def _as_removal(path: str) -> tuple[str, str] | None:
    """A whiteout entry as what it removes: (path, how), or None for an ordinary entry."""
    head, _, name = path.rpartition("/")
    if name == OPAQUE:
        return (head or "/"), "emptied (opaque whiteout: what lower layers held there is hidden)"
    if name.startswith(WHITEOUT):
        return (f"{head}/" if head else "") + name[len(WHITEOUT) :], "removed (whiteout)"
    return None


def _one_side_entry(position: int, side: str, path: str, entry: Entry, created_by: str | None = None) -> Difference:
    """An entry one side alone has: in a layer both have (``created_by`` None), or in a layer only that side has."""
    alone = {"side": side, "created_by": created_by} if created_by is not None else {}
    removal = _as_removal(path)
    if removal is not None:
        return Difference(position, removal[0], f"{removal[1]} in {side}", **alone)  # type: ignore[arg-type]
    shown = f"{entry.kind}, {oct(entry.mode)}, {entry.owner}" + (f", {entry.size} bytes" if entry.kind == "file" else "")
    shown += f" -> {entry.link}" if entry.link else ""
    what = f"added in {side}" if alone else f"only in {side}"
    return Difference(position, path, what, *((shown, "") if side == "A" else ("", shown)), **alone)  # type: ignore[arg-type]


def _compare_entries(position: int, a: dict[str, Entry], b: dict[str, Entry], layer_b: int = 0) -> list[Difference]:
    """Each entry that differs: its content, link, mode, owner, kind or presence, and its time. A file whose only
    difference is its time is a normalization difference (publishing clamps times; an engine's push does not)."""
    found = []
    for path in sorted(set(a) | set(b)):
        left, right = a.get(path), b.get(path)
        if left is None or right is None:
            side = "A" if right is None else "B"
            found.append(replace(_one_side_entry(position, side, path, left or right), layer_b=layer_b))  # type: ignore[arg-type]
            continue
        here = []
        for what, x, y in (
            ("kind", left.kind, right.kind),
            ("content", left.sha256, right.sha256),
            ("link", left.link, right.link),
            ("mode", oct(left.mode), oct(right.mode)),
            ("owner", left.owner, right.owner),
            ("mtime", str(left.mtime), str(right.mtime)),
        ):
            if x != y:
                shown = (x[:19], y[:19]) if what == "content" else (x, y)
                here.append(Difference(position, path, what, *shown, layer_b=layer_b))
        if [d.what for d in here] == ["mtime"]:
            here = [replace(here[0], normalization=True)]
        found += here
    return found


def layer_keys(image: Published) -> list[tuple[str, str]]:
    """Each layer's (DiffID, created_by): what tells a layer two images share from one only an image has."""
    diff_ids = [str(d) for d in (image.config.get("rootfs") or {}).get("diff_ids") or []]
    history = [h for h in image.config.get("history") or [] if isinstance(h, dict) and not h.get("empty_layer")]
    created = [str(h.get("created_by", "")) for h in history] if len(history) == len(image.layers) else []
    return [(diff_ids[i] if i < len(diff_ids) else "", created[i] if i < len(created) else "") for i in range(len(image.layers))]


def _same_layer(x: tuple[str, str], y: tuple[str, str]) -> bool:
    return bool(x[0] and x[0] == y[0]) or bool(x[1] and x[1] == y[1])


def align(a: list[tuple[str, str]], b: list[tuple[str, str]]) -> list[tuple[int | None, int | None]]:
    """The layers of A and B paired in order (0-based), a layer only one image has paired with None: the longest
    common sequence of layers the same by DiffID or by the step that made them (created_by). Between two pairs, as
    many unpaired layers on each side are paired in order (a step that made other files); the rest are one side's."""
    n, m = len(a), len(b)
    longest = [[0] * (m + 1) for _ in range(n + 1)]
    for i in range(n - 1, -1, -1):
        for j in range(m - 1, -1, -1):
            longest[i][j] = longest[i + 1][j + 1] + 1 if _same_layer(a[i], b[j]) else max(longest[i + 1][j], longest[i][j + 1])
    anchors = []
    i = j = 0
    while i < n and j < m:
        if _same_layer(a[i], b[j]) and longest[i][j] == longest[i + 1][j + 1] + 1:
            anchors.append((i, j))
            i, j = i + 1, j + 1
        elif longest[i + 1][j] >= longest[i][j + 1]:
            i += 1
        else:
            j += 1
    pairs: list[tuple[int | None, int | None]] = []
    last_a = last_b = -1
    for x, y in [*anchors, (n, m)]:
        gap_a, gap_b = list(range(last_a + 1, x)), list(range(last_b + 1, y))
        if len(gap_a) == len(gap_b):
            pairs += list(zip(gap_a, gap_b, strict=True))
        else:
            pairs += [(p, None) for p in gap_a] + [(None, q) for q in gap_b]
        if x < n and y < m:
            pairs.append((x, y))
        last_a, last_b = x, y
    return pairs


def diff_images(a: Published, b: Published) -> list[Difference]:
    """Every difference between two published images. The layers are paired first (:func:`align`), so a layer one
    image alone has, on top or inserted or dropped anywhere, is named with every file it adds or removes, and the
    layers both have are read file by file where their digests differ."""
    found: list[Difference] = []
    for key in CONFIG_FIELDS:
        left, right = a.config.get(key), b.config.get(key)
        if key == "rootfs" or left == right:
            continue
        if isinstance(left, dict) and isinstance(right, dict):
            for sub in sorted(set(left) | set(right)):
                if left.get(sub) != right.get(sub):
                    shown = json.dumps(left.get(sub))[:80], json.dumps(right.get(sub))[:80]
                    found.append(Difference(0, f"{key}.{sub}", "differs", *shown))
        else:
            found.append(Difference(0, key, "differs", json.dumps(left)[:80], json.dumps(right)[:80]))
    if len(a.layers) != len(b.layers):
        found.append(Difference(-1, "", "layer count", str(len(a.layers)), str(len(b.layers))))
    keys_a, keys_b = layer_keys(a), layer_keys(b)
    for x, y in align(keys_a, keys_b):
        if x is None or y is None:
            image, position, keys, side = (a, x, keys_a, "A") if y is None else (b, y, keys_b, "B")
            assert position is not None
            created_by = keys[position][1]
            what = "a layer only A has (B drops it)" if side == "A" else "a layer only B has (added to A)"
            found.append(Difference(position + 1, "", what, side=side, created_by=created_by))
            for path, entry in sorted(layer_files(image, position).items()):
                found.append(_one_side_entry(position + 1, side, path, entry, created_by))
            continue
        left, right = a.layers[x], b.layers[y]
        if left.get("digest") == right.get("digest"):
            continue
        if keys_a[x][0] and keys_a[x][0] == keys_b[y][0]:  # the same tar, compressed otherwise: nothing to read
            what = "the same files and bytes, compressed otherwise"
            found.append(Difference(x + 1, "", what, left["digest"][:19], right["digest"][:19], normalization=True, layer_b=y + 1))
            continue
        before = len(found)
        found += _compare_entries(x + 1, layer_files(a, x), layer_files(b, y), layer_b=y + 1)
        if len(found) == before:  # the same files, other bytes: the tar headers (a field no entry shows) or the compression
            what = "the same files, other bytes (tar headers or compression)"
            found.append(Difference(x + 1, "", what, left["digest"][:19], right["digest"][:19], normalization=True, layer_b=y + 1))
    if not found and a.manifest.digest != b.manifest.digest:  # the same config and layers: the manifest's own fields
        found.append(Difference(-1, "", "the manifest (media types or annotations)", a.manifest.media_type, b.manifest.media_type))
    return found


def _normalized_by_layer(found: list[Difference]) -> dict[tuple[int, int], list[Difference]]:
    """What is only normalization, per pair of layers, in order."""
    per_layer: dict[tuple[int, int], list[Difference]] = {}
    for d in found:
        if d.normalization:
            per_layer.setdefault((d.layer, d.layer_b), []).append(d)
    return per_layer


def report_lines(found: list[Difference], full: bool = False) -> list[str]:
    """What ``diff`` and ``rebuild`` print: what changed first (the config, layers one side alone has with every file
    they add or remove, files whose content, mode, owner, link or presence differ), then what is only normalization,
    one line per layer with its count, unless ``full``."""
    lines = [d.line() for d in found if not d.normalization]
    if full:
        return lines + [d.line() for d in found if d.normalization]
    for group in _normalized_by_layer(found).values():
        files = [d for d in group if d.path]
        if files:
            said = f"{len(files):,} file(s) differ only in their times (normalization; --all lists them)"
            lines.append(f"{group[0].where()}: {said}")
        lines += [d.line() for d in group if not d.path]
    return lines


def normalization_summary(found: list[Difference]) -> list[dict[str, Any]]:
    """The JSON's summary of what is only normalization: per layer, how many files and what else."""
    return [
        {
            "layer": layer,
            "layer_b": layer_b or layer,
            "files": sum(bool(d.path) for d in group),
            "other": [d.what for d in group if not d.path],
        }
        for (layer, layer_b), group in _normalized_by_layer(found).items()
    ]
