"""Which world each component is built in: the default process group a factory sees when the suites
call it (`dist.get_world_size()`, `dist.get_rank()`, what a trainer's own setup builds its mesh
over), written down once beside the protocol (components/protocol.py), so a stack that sizes itself
by its world (Fabric's `devices`) knows that parallel_equivalence's reference is one rank alone."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class World:
    """One kind of world the suites build components in."""

    name: str
    ranks: str
    cell: str
    built_there: str


WORLDS: tuple[World, ...] = (
    World(
        name="the cell's",
        ranks="every rank of the cell: the default group has the cell's `world_size` ranks",
        cell="the cell as it is",
        built_there="every component, in every suite, unless a row below says otherwise",
    ),
    World(
        name="the single-process reference's",
        ranks=(
            "one rank, in a rank pool of its own whose default group is that rank alone (where the run cannot start "
            "one, the cell's ranks, and `reference_world` says so: a division by the world's size twice is then not caught)"
        ),
        cell='the cell with `fsdp = "none"`, `mesh = "flat"`, `world_size = 1`, uncompiled and unpipelined',
        built_there=(
            "parallel_equivalence's reference: `parallelize`, `optimizer_<value>`, `training_step`, `clip_grad_norm` "
            "and `batch` (`model` gets the cell as it is, so it may size the model by it)"
        ),
    ),
    World(
        name="a reshard side's world of its own",
        ranks="that side's ranks (W or W/2 of a cell of W), in a rank pool whose default group is exactly those ranks",
        cell="the cell with that side's `world_size` and mesh",
        built_there=(
            "dtensor_optim's reshard where `parallelize` takes no `mesh` or the bound checkpointer neither "
            "`process_group` nor `mesh`: every component of each side (`reshard_worlds` names this path)"
        ),
    ),
    World(
        name="a reshard side's sub-world",
        ranks=(
            "the cell's world stays the default group; the side's first N ranks get a group and a 1-D mesh of their "
            "own, passed as `mesh` and `process_group`"
        ),
        cell="the cell as it is",
        built_there="dtensor_optim's reshard where `parallelize` takes `mesh` and the bound checkpointer takes either",
    ),
)


def markdown_table() -> str:
    """The worlds as docs/reference/components.md shows them."""
    rows = ["| world | its ranks (the default process group) | the `cell` the components get | built there |"]
    rows.append("|---|---|---|---|")
    rows += [f"| {w.name} | {w.ranks} | {w.cell} | {w.built_there} |" for w in WORLDS]
    return "\n".join(rows)
