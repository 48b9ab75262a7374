"""The matrix's ``compat:`` section: facts the rules check stacks against, each with its source in
the matrix (see :mod:`model` for the rest of the shape)."""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import Field, StrictBool, StrictStr, model_validator

from buildkit.matrix.fields import CannVersion, Frozen, PackageName, PackageVersion, PythonVersion, VersionSpecifier


class OpenRlhfLine(Frozen):
    """What an OpenRLHF release's Ascend branch was validated with (PEP 440 specifiers on the stack's pins)."""

    cann: CannVersion
    torch_npu: VersionSpecifier
    vllm: VersionSpecifier
    vllm_ascend: VersionSpecifier
    transformers: VersionSpecifier | None = None
    deepspeed: VersionSpecifier | None = None
    ring_attn_ascend: VersionSpecifier | None = None


class KnownIssue(Frozen):
    torch_npu: PackageVersion
    cann: CannVersion
    severity: Literal["error", "warning"]
    reason: StrictStr


# An Ascend HDK (NPU driver and firmware package) release as Ascend's compatibility tables write it:
# 25.0.RC1, 25.2.0, 26.0.RC1, or a whole line 25.5.X; a patch (25.0.RC1.1) belongs to its release.
HdkVersion = Annotated[StrictStr, Field(pattern=r"^\d+\.\d+\.(X|\d+|RC\d+)$")]


class CannDrivers(Frozen):
    """The Ascend HDK releases Ascend publishes as supported for one CANN release, with where it says so."""

    hdk: tuple[HdkVersion, ...] = Field(min_length=1, description="supported Ascend HDK releases or lines (25.5.X)")
    source: StrictStr = Field(min_length=1, description="the published compatibility information these come from")
    complete: StrictBool = Field(
        default=True,
        description=(
            "the source lists every supported release, so an older driver is unsupported (doctor fails); false: only the "
            "release paired with this CANN is known, so an older driver is merely unconfirmed (doctor warns)"
        ),
    )
    refused: tuple[HdkVersion, ...] = Field(
        default=(),
        description=(
            "Ascend HDK releases or lines the source says this CANN no longer supports (CANN 9.2.0: 25.0.X, 25.2.X): a host "
            "driver of one fails doctor even where the supported list is only the paired release"
        ),
    )

    @model_validator(mode="after")
    def _refused_is_not_supported(self) -> CannDrivers:
        both = sorted(set(self.hdk) & set(self.refused))
        if both:
            raise ValueError(f"{', '.join(both)} both supported (hdk) and refused: a release is one or the other")
        return self

    def describe(self) -> str:
        """The supported releases as the pages and `matrix show` print them, with what is refused."""
        text = ", ".join(self.hdk) + ("" if self.complete else " (the paired release; older ones unconfirmed)")
        return text + (f"; not {', '.join(self.refused)}" if self.refused else "")

    def as_image_info(self) -> dict[str, object]:
        """What image.json holds for doctor: ``refused`` only where there is one, so an image of a CANN with
        nothing refused holds the bytes it held before the field existed."""
        return self.model_dump(mode="json", exclude={"refused"} if not self.refused else None)


class Compat(Frozen):
    """Facts the rules check stacks against (see the comments in the matrix)."""

    torch_python: dict[Annotated[StrictStr, Field(pattern=r"^\d+\.\d+$")], VersionSpecifier]
    torch_npu_cann: dict[PackageVersion, tuple[CannVersion, ...]]
    cann_python: dict[Annotated[StrictStr, Field(pattern=r"^\d+\.\d+$")], tuple[PythonVersion, ...]]
    known_issues: tuple[KnownIssue, ...] = ()
    cann_drivers: dict[CannVersion, CannDrivers] = Field(
        default={}, description="CANN release -> the Ascend HDK (driver) releases it supports: doctor judges the host's driver by it"
    )
    verl_npu_autodetect: PackageVersion = Field(
        description="first verl release whose main_ppo sets trainer.device=npu by itself; older ones need the override"
    )
    verl_sft_trainer: PackageVersion = Field(
        description=(
            "first verl release whose SFT entry point is verl.trainer.sft_trainer (which sets trainer.device=npu itself); "
            "older ones run verl.trainer.fsdp_sft_trainer and need the override"
        )
    )
    verl_legacy_reward_ignored: PackageVersion = Field(
        description=(
            "first verl release whose main_ppo no longer moves the legacy reward keys (custom_reward_function, reward_model, "
            "sandbox_fusion) under reward:, so a job that sets them runs as if it had not; the config check refuses them there"
        )
    )
    openrlhf_ascend: dict[PackageVersion, OpenRlhfLine] = Field(
        default={}, description="OpenRLHF release -> the pins its Ascend branch was validated with"
    )
    tool_requirements: dict[PackageName, dict[PackageVersion, dict[PackageName, VersionSpecifier]]] = Field(
        default={},
        description=(
            "Ascend tool -> release -> what its wheel requires that a stack may not allow (python: its Requires-Python); "
            "rule tool-fits-stack refuses a stack that pins the tool against them"
        ),
    )
