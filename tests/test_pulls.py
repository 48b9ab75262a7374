"""A node's containerd pull settings, as doctor reads them from /etc/containerd and `k8s preflight`
judges them with the version Kubernetes reports: the keys checked against containerd's own config
structs (vendored), the defaults read from what the real containerd 1.6 and 1.7 binaries write with
`containerd config default`, and no registry credential ever copied into the report."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from buildkit.doctor.base import Environment
from buildkit.doctor.pulls import check_pulls, pull_config, read_config, settings
from buildkit.k8s.preflight import format_table, summarize
from tests.harness.services import STATE
from tests.harness.upstream_sources import vendored

UPSTREAM = Path(__file__).resolve().parent / "fixtures" / "upstream" / "containerd"
V3 = 'version = 3\n[plugins."io.containerd.cri.v1.images"]\n'


def node(tmp_path: Path, text: str, extra: dict[str, str] | None = None) -> Environment:
    etc = tmp_path / "etc" / "containerd"
    etc.mkdir(parents=True, exist_ok=True)
    (etc / "config.toml").write_text(text)
    for name, body in (extra or {}).items():
        (tmp_path / name.lstrip("/")).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name.lstrip("/")).write_text(body)
    return Environment(root=tmp_path)


def test_the_vendored_structs_are_the_recorded_files_and_hold_every_key_read() -> None:
    vendored("containerd")  # each file's sha256 checked against SOURCES.json
    v17 = (UPSTREAM / "v1.7.24-pkg-cri-config-config.go").read_text()
    v21 = (UPSTREAM / "v2.1.0-internal-cri-config-config.go").read_text()
    transfer = (UPSTREAM / "v2.1.0-plugins-transfer-plugin.go").read_text()
    read = ("max_concurrent_downloads", "snapshotter", "discard_unpacked_layers", "disable_snapshot_annotations", "registry", "mirrors",
            "configs", "auths")  # fmt: skip
    for key in read:
        assert f'toml:"{key}"' in v17 and f'toml:"{key}"' in v21, key
    assert 'toml:"containerd"' in v17, "1.x: snapshotter and discard_unpacked_layers sit in the CRI's containerd table"
    assert 'toml:"use_local_image_pull"' in v21 and 'toml:"max_concurrent_downloads"' in transfer
    assert re.search(r"MaxConcurrentDownloads:\s+3,", transfer), "the transfer service's default is 3"
    # the fallbacks doctor names are the ones containerd 2.1 checks
    fallback = v21[v21.index("func CheckLocalImagePullConfigs") :]
    for name in ("DiscardUnpackedLayers", "Registry.Mirrors", "Registry.Configs", "Registry.Auths", "MaxConcurrentDownloads",
                 "DisableSnapshotAnnotations"):  # fmt: skip
        assert f'Name:      "{name}"' in fallback or f'Name: "{name}"' in fallback, name
    assert "c.MaxConcurrentDownloads != 3" in fallback


@pytest.mark.docker  # the engines `make services` unpacks: in CI's docker job
@pytest.mark.parametrize(("binary", "version"), [("engine-bookworm-v1", "1.6.20"), ("engine-trixie-v1", "1.7.24")])
def test_the_defaults_the_real_containerd_writes(tmp_path: Path, binary: str, version: str) -> None:
    containerd = STATE / binary / "usr" / "bin" / "containerd"
    assert containerd.is_file(), f"{containerd}: `make services` unpacks it"
    said = subprocess.run([str(containerd), "--version"], capture_output=True, text=True, check=True).stdout
    assert version in said
    text = subprocess.run([str(containerd), "config", "default"], capture_output=True, text=True, check=True).stdout
    checks, config = check_pulls(node(tmp_path, text), [f"containerd://{version}"])
    assert config is not None
    found = settings(config, version)
    assert (found.downloads, found.snapshotter, found.discard_unpacked, found.transfer) == (3, "overlayfs", False, None)
    (check,) = checks
    assert check.status == "warn" and "3 layer download(s) at once" in check.detail and "= 8" in check.detail
    # the same file with the settings raised: nothing to warn of
    raised = text.replace("max_concurrent_downloads = 3", "max_concurrent_downloads = 8", 1)
    (check,), _ = check_pulls(node(tmp_path, raised), [f"containerd://{version}"])
    assert check.status == "ok", check.detail


def test_containerd_2_1_pulls_through_the_transfer_service_unless_the_cri_config_stops_it(tmp_path: Path) -> None:
    plain = V3 + '[plugins."io.containerd.transfer.v1.local"]\nmax_concurrent_downloads = 8\n'
    found = settings(read_config(node(tmp_path, plain).path("/etc/containerd/config.toml")), "2.1.4")
    assert (found.transfer, found.downloads, found.fallback) == (True, 8, "")
    assert found.where == 'plugins."io.containerd.transfer.v1.local".max_concurrent_downloads'
    # the CRI's own max_concurrent_downloads = 8 makes it fall back, and the transfer service's setting no longer counts
    cri = V3 + "max_concurrent_downloads = 8\n"
    found = settings(read_config(node(tmp_path, cri).path("/etc/containerd/config.toml")), "2.1.4")
    assert found.transfer is False and "max_concurrent_downloads = 8" in found.fallback and found.downloads == 8
    (check,), _ = check_pulls(node(tmp_path, cri), ["containerd://2.1.4"])
    assert check.status == "warn" and "falls back from the transfer service" in check.detail
    # before 2.1: the CRI pulls itself, whatever the file says
    assert settings(read_config(node(tmp_path, cri).path("/etc/containerd/config.toml")), "2.0.5").transfer is None


def test_imports_are_merged_and_credentials_never_leave_the_node(tmp_path: Path) -> None:
    text = 'version = 2\nimports = ["/etc/containerd/conf.d/*.toml"]\n[plugins."io.containerd.grpc.v1.cri"]\nmax_concurrent_downloads = 3\n'
    secret = (
        '[plugins."io.containerd.grpc.v1.cri".registry.configs."harbor.example.com".auth]\n'
        'username = "robot"\npassword = "s3cr3t-token"\n'
        '[plugins."io.containerd.grpc.v1.cri".containerd]\nsnapshotter = "soci"\n'
        '[plugins."io.containerd.grpc.v1.cri"]\nmax_concurrent_downloads = 10\n'
    )
    env = node(tmp_path, text, {"/etc/containerd/conf.d/50-harbor.toml": secret})
    (check,), config = check_pulls(env, ["containerd://1.7.24"])
    assert config is not None
    assert "s3cr3t-token" not in json.dumps(config) and "robot" not in json.dumps(config)
    assert config["plugins"]["io.containerd.grpc.v1.cri"]["registry"] == {"configs": True}
    found = settings(config, "1.7.24")
    assert (found.downloads, found.snapshotter) == (10, "soci")
    assert check.status == "warn" and "soci pulls lazily" in check.detail


def test_a_config_that_is_not_toml_is_a_warning_not_a_crash(tmp_path: Path) -> None:
    (check,), config = check_pulls(node(tmp_path, "version = 2\n[plugins\n"), ["containerd://1.7.24"])
    assert config is None and check.status == "warn" and "cannot read it" in check.detail
    assert check_pulls(Environment(root=tmp_path / "none"), []) == ([], None), "no containerd here: nothing said"


def test_preflight_judges_the_config_again_with_the_version_kubernetes_reports() -> None:
    config = pull_config({"version": 3, "plugins": {"io.containerd.cri.v1.images": {"max_concurrent_downloads": 8}}})
    report = {
        "node": "npu-01", "devices": 16, "exit_code": 0, "containerd_config": config,
        "checks": [{"name": "containerd pulls", "status": "warn", "detail": "containerd (version unknown): ..."}],
    }  # fmt: skip
    verdicts, _ = summarize([("npu-01", report)], runtimes={"npu-01": "containerd://2.1.4"})
    (verdict,) = verdicts
    assert verdict.pulls is not None and verdict.pulls["containerd"] == "2.1.4" and verdict.pulls["transfer_service"] is False
    assert verdict.check == "containerd pulls" and "falls back from the transfer service" in verdict.detail
    table = format_table(verdicts, [])
    assert "pulls: containerd 2.1.4: max_concurrent_downloads 8, snapshotter overlayfs" in table and "old pull" in table
