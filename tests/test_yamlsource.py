"""YAML parsing with source positions."""

from __future__ import annotations

from pathlib import Path

import pytest

from buildkit.matrix.yamlsource import YamlSourceError, format_path, load_yaml

SRC = Path("m.yaml")
TEXT = """\
top: 1
stacks:
  one:
    os: [a, b]
    pins:
      - name: x
        version: "1.0"
"""


def test_positions_of_keys_and_values() -> None:
    data, source, findings = load_yaml(TEXT, SRC)
    assert findings == []
    assert data["stacks"]["one"]["pins"][0]["version"] == "1.0"
    assert source.keys[("stacks", "one", "os")] == (4, 5)
    assert source.values[("stacks", "one", "os", 1)] == (4, 13)
    assert source.values[("stacks", "one", "pins", 0, "version")] == (7, 18)
    assert str(source.locate(("stacks", "one", "pins", 0, "version"))) == "m.yaml:7:18"
    # an unknown path resolves to its nearest ancestor
    assert str(source.locate(("stacks", "one", "missing", "deeper"))) == "m.yaml:4:5"
    assert str(source.locate(("stacks", "one", "os"), prefer_key=True)) == "m.yaml:4:5"


def test_raw_text_of_scalars_is_kept() -> None:
    _, source, _ = load_yaml("python: 3.10\n", SRC)
    assert source.raw[("python",)] == "3.10"


def test_duplicate_keys_are_findings_with_both_lines() -> None:
    data, _, findings = load_yaml("a: 1\nb: 2\na: 3\n", SRC)
    assert data == {"a": 1, "b": 2}  # the first value is kept
    (finding,) = findings
    assert finding.message == "duplicate key 'a' (first defined on line 1)"
    assert str(finding.location) == "m.yaml:3:1"


def test_merge_keys_are_resolved() -> None:
    data, _, _ = load_yaml("base: &b {x: 1}\nchild:\n  <<: *b\n  y: 2\n", SRC)
    assert data["child"] == {"x": 1, "y": 2}


@pytest.mark.parametrize(
    ("text", "message", "where"),
    [
        ("a: [1, 2\n", "malformed YAML", "m.yaml:2:1"),
        ("a: 1\n b: 2\n", "malformed YAML", "m.yaml:2:3"),
        ("", "the file is empty", "m.yaml"),
        ("- 1\n", "the top level must be a mapping", "m.yaml:1:1"),
        ("? [a]\n: 1\n", "a mapping key must be a plain scalar", "m.yaml:1:3"),
        ("a: !!python/object:os.system x\n", "malformed YAML", "m.yaml:1:4"),
    ],
)
def test_fatal_problems_are_located(text: str, message: str, where: str) -> None:
    try:
        _, _, findings = load_yaml(text, SRC)
    except YamlSourceError as exc:
        findings = exc.findings
    assert findings, text
    assert message in findings[0].message
    assert str(findings[0].location) == where


def test_format_path() -> None:
    assert format_path(("stacks", "cann8.3", "os", 0)) == "stacks.cann8.3.os[0]"
    assert format_path(()) == ""


def test_anchors_a_person_writes_still_load() -> None:
    text = "base: &torch {version: '2.7.1'}\none: *torch\ntwo: *torch\n"
    data, _, findings = load_yaml(text, SRC)
    assert data["one"] == data["two"] == {"version": "2.7.1"} and not findings


def test_alias_bombs_and_deep_nesting_are_refused_with_a_location() -> None:
    bomb = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
        f"{n}: &{n} [{', '.join([f'*{p}'] * 10)}]\n" for p, n in zip("abcdef", "bcdefg", strict=True)
    )
    with pytest.raises(YamlSourceError) as info:
        load_yaml(bomb, SRC)
    finding = info.value.findings[0]
    assert "alias bomb" in finding.message and finding.location.line > 1
    with pytest.raises(YamlSourceError, match="levels deep"):
        load_yaml("a: " + "[" * 65 + "]" * 65 + "\n", SRC)
    load_yaml("a: " + "[" * 60 + "]" * 60 + "\n", SRC)  # deep, but within the limit
