"""`[optional]`: the components whose packages may be missing, and in which environments.

A component whose module needs a package this environment lacks (or whose `[requires]` did not
install) cannot run its cells. Where matrix.toml declares it optional (TransformerEngine on a
CPU box) those cells skip; anywhere else they error, so a broken install never reports green.
The plugin, which decides per cell, and the pre-run component check, which warns once per
component, phrase both verdicts here.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from torchmatrix.json_records import JsonRecord, json_field

DEVICE_TYPES = ("cpu", "cuda")


@dataclass(frozen=True)
class OptionalWhere(JsonRecord):
    """Where a component may lack its packages: on these device types and torch versions (empty: any)."""

    devices: tuple[str, ...] = field(default=(), metadata=json_field(key="device"))
    torch: tuple[str, ...] = ()

    def applies(self, device_type: str, torch_version: str) -> bool:
        return (not self.devices or device_type in self.devices) and (not self.torch or torch_version in self.torch)


def is_optional_here(optional: dict[str, OptionalWhere], key: str, device_type: str, torch_version: str) -> bool:
    """Whether component `key` may lack its packages in this environment."""
    return key in optional and optional[key].applies(device_type, torch_version)


def error_line(key: str, needs: str, device_type: str) -> str:
    """Why a cell that uses `key` errors, and what to change; `needs` says what is missing."""
    return f"{needs}; {_fix(key, device_type)}"


def warning_line(key: str, needs: str, device_type: str, *, optional: bool) -> str:
    """The pre-run warning for a component whose package is missing: whether its cells will skip or error."""
    if optional:
        return f"{needs}: its cells will skip, as [optional] allows here"
    return f"{needs}: its cells will error; {_fix(key, device_type)}"


def _fix(key: str, device_type: str) -> str:
    return f'install it, or declare the component optional: [optional] {key} = {{ device = ["{device_type}"] }}'


def needs_package(key: str, import_path: str, package: str) -> str:
    """`optimizer_x = m:f needs 'pkg', which is not installed here`: a package the module imports."""
    return f"{key} = {import_path} needs {package!r}, which is not installed here"
