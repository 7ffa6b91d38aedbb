"""The `optimizer_impl` axis: which implementation of its optimizer a cell runs (torch's for-loop,
foreach or fused kernels, or the step under `torch.compile`), handed to an `optimizer_<value>`
factory as `implementation=` where its signature names it. An absent axis is `default`: the
factory's own choice, as before the axis existed."""

from __future__ import annotations

IMPLEMENTATION_AXIS = "optimizer_impl"
DEFAULT_IMPLEMENTATION = "default"
COMPILED_STEP = "compiled"  # the step under torch.compile
IMPLEMENTATIONS = (DEFAULT_IMPLEMENTATION, "forloop", "foreach", "fused", COMPILED_STEP)
"""`default` leaves the choice to the factory; the others name one implementation each."""


class UnavailableImplementation(Exception):
    """A factory cannot build the implementation a cell asks for, here and for a reason it states
    (a factory that takes no `implementation`, fused kernels this torch lacks on this device): the
    cell's optimizer tests skip with that reason instead of running another implementation."""


def implementation_of(cell) -> str:
    """The cell's `optimizer_impl`, `default` where the matrix has no such axis."""
    return str(cell.get(IMPLEMENTATION_AXIS, DEFAULT_IMPLEMENTATION))


def implementation_not_named(factory, implementation: str) -> str:
    """Why a factory whose signature does not name `implementation` cannot run this cell."""
    name = f"{getattr(factory, '__module__', '?')}:{getattr(factory, '__qualname__', repr(factory))}"
    return (
        f"{IMPLEMENTATION_AXIS}={implementation}: the optimizer factory {name} takes no `implementation` keyword, so it "
        f'cannot be asked for one; add `implementation="default"` to its signature to run this axis'
    )
