"""The tests a cell cannot run here, decided before they start: a component whose package is not
installed (an error that says what to install, or a skip where matrix.toml declares it optional) and an
optimizer factory that cannot build the cell's implementation."""

from __future__ import annotations

import functools
import importlib
from pathlib import Path

import pytest

from torchmatrix.components.calling import accepts
from torchmatrix.components.loading import load
from torchmatrix.components.optimizer_implementations import (
    DEFAULT_IMPLEMENTATION,
    implementation_not_named,
    implementation_of,
)
from torchmatrix.components.optional import error_line, is_optional_here, needs_package
from torchmatrix.components.protocol import required_names
from torchmatrix.env.component_requirements import uninstalled_here
from torchmatrix.ranks.plugin import PLAN_KEY


@pytest.fixture(autouse=True)
def _cells_whose_components_cannot_import(request):
    """A component this suite needs for this cell whose module needs a package that is not
    installed errors the test, saying what to change; where matrix.toml declares the component
    `[optional]` for this environment (TransformerEngine on a CPU box) the test skips instead."""
    plan = request.config.stash.get(PLAN_KEY, None)
    suite = plan.suite_of(request.node.path) if plan else None
    if suite is None or "cell" not in request.fixturenames:
        return
    cell = request.getfixturevalue("cell")
    optimizers = [str(cell["optimizer"])] if "optimizer" in cell else []
    # by file and by name: cross_version's read pass runs its own file under the suite's name
    names = [Path(plan.suites[suite].path).stem.removeprefix("test_"), suite]
    keys = list(required_names(names, optimizers))
    keys += [f"plain_state_{value}" for value in optimizers]
    uninstalled = uninstalled_here()
    device_type = plan.plan.device_type
    for key in keys:
        path = plan.plan.components.get(key)
        if key in uninstalled:
            needs = f"{key} needs {uninstalled[key]}"
        elif path and (missing := missing_package(path)):
            needs = needs_package(key, path, missing)
        else:
            continue
        if is_optional_here(plan.optional, key, device_type, plan.plan.torch):
            pytest.skip(needs)
        pytest.fail(error_line(key, needs, device_type), pytrace=False)


@pytest.fixture(autouse=True)
def _cells_whose_optimizer_takes_no_implementation(request, _cells_whose_components_cannot_import):
    """A cell whose `optimizer_impl` is not `default` skips the tests of a suite that builds its
    optimizer when the `optimizer_<value>` factory names no `implementation`: run, it would train
    the factory's own choice under another implementation's name."""
    plan = request.config.stash.get(PLAN_KEY, None)
    suite = plan.suite_of(request.node.path) if plan else None
    if suite is None or "cell" not in request.fixturenames:
        return
    cell = request.getfixturevalue("cell")
    implementation = implementation_of(cell)
    if implementation == DEFAULT_IMPLEMENTATION or "optimizer" not in cell:
        return
    key = f"optimizer_{cell['optimizer']}"
    suite_name = Path(plan.suites[suite].path).stem.removeprefix("test_")
    path = plan.plan.components.get(key)
    if path and key in required_names([suite_name], [str(cell["optimizer"])]):
        factory = load(path)
        if not accepts(factory, "implementation"):
            pytest.skip(implementation_not_named(factory, implementation))


@functools.cache
def missing_package(import_path: str) -> str | None:
    """The package a component's module needs but cannot import, if that is why it fails to import."""
    module = import_path.partition(":")[0]
    try:
        importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name and not (module == error.name or module.startswith(error.name + ".")):
            return error.name
    return None
