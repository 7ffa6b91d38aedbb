"""`python -m torchmatrix sensitivity`: the cell cover, the registry's wrappers, the verdicts (caught,
missed, errored, n/a, skipped), and two real runs on one CPU cell: one where every chosen mutant
is caught (exit 0), and one where a mutant acts unseen (missed, exit 1) next to one the suite cannot
see because the run draws no random numbers (n/a, saying so)."""

from __future__ import annotations

import importlib
import json
import subprocess
import sys

import pytest
import torch
from torch.utils.checkpoint import checkpoint

from suites.recompute.grad_ckpt_findings import no_cache_reason
from torchmatrix.components.calling import accepts
from torchmatrix.env.devices import Environment
from torchmatrix.matrix.cells import Cell
from torchmatrix.matrix.config import Suite, load_matrix
from torchmatrix.matrix.plan import SuiteRun
from torchmatrix.messages.events import TestOutcome
from torchmatrix.reports import junit
from torchmatrix.sensitivity import mutants, mutated_components
from torchmatrix.sensitivity.command import (
    SensitivityError,
    chosen_mutants,
    covering_cells,
    judge,
    mutated,
    not_applicable,
)
from torchmatrix.sensitivity.mutants import (
    holds_inputs_across_calls,
    moments_cast_on_load,
    reshuffles_from_unsaved_seed,
)
from torchmatrix.sensitivity.registry import GENERIC_MUTANTS, INNER_COMPONENTS_VARIABLE
from torchmatrix.sensitivity.verdicts import raised_rank_lines, read_cells

from helpers.checkout import PROJECT_IS_THIS_CHECKOUT, REPO, checkout_env
from helpers.matrix_files import matrix_toml


def test_covering_cells_show_every_axis_value_once_at_least():
    cells = [Cell({"ws": ws, "fsdp": f, "opt": o}) for ws in (1, 2) for f in ("a", "b") for o in ("x", "y")]
    chosen = covering_cells(cells)
    assert len(chosen) == 2
    assert {(axis, value) for cell in chosen for axis, value in cell.items()} == {
        (axis, value) for cell in cells for axis, value in cell.items()
    }


def mutated_component(matrix, mutant_name: str, key: str, monkeypatch):
    """What a rank process imports for `key` of the matrix mutated by `mutant_name`."""
    (mutant,) = [mutant for mutant in GENERIC_MUTANTS if mutant.name == mutant_name]
    monkeypatch.setenv(INNER_COMPONENTS_VARIABLE, json.dumps(matrix.components))
    module_path, _, attribute = mutated(matrix, mutant).components[key].partition(":")
    return getattr(importlib.import_module(module_path), attribute)


def test_every_registry_entry_names_a_wrapper_of_the_mutants_module():
    torch_free = {name for name in vars(mutants) if not name.startswith("_")}
    assert [mutant.name for mutant in GENERIC_MUTANTS if mutant.wrapper not in torch_free] == []
    assert len({mutant.name for mutant in GENERIC_MUTANTS}) == len(GENERIC_MUTANTS)


def test_a_mutated_component_wraps_the_configured_one_with_the_entrys_arguments(monkeypatch):
    pytest.importorskip("torch")
    matrix = load_matrix(REPO / "matrix.toml")
    skips_rng = mutated_component(matrix, "skip_rng_on_load", "checkpointer", monkeypatch)
    assert skips_rng.inner == "torchmatrix.models.checkpoint:Checkpointer"
    assert skips_rng.reverted(0) == ("rng",) and skips_rng.__name__ == "SkipsRngOnLoad"
    assert mutated_component(matrix, "skip_rng_on_load", "checkpointer", monkeypatch) is skips_rng
    mutated_optimizers = mutated(matrix, mutants_named("moments_cast_to_param_dtype")).components
    assert mutated_optimizers["optimizer_adamw"].endswith(":moments_cast_to_param_dtype__optimizer_adamw")
    assert mutated_optimizers["model"] == matrix.components["model"]
    built = mutated_component(matrix, "moments_cast_to_param_dtype", "optimizer_adamw", monkeypatch)
    assert callable(built) and accepts(built, "named_parameters")


def test_an_attribute_that_names_no_mutant_or_no_configured_component_is_an_attribute_error(monkeypatch):
    monkeypatch.setenv(INNER_COMPONENTS_VARIABLE, json.dumps({"model": "torchmatrix.models.transformer:build_model"}))
    for attribute, says in (
        ("no_such_mutant__model", "expected <generic mutant>__<component key it wraps>"),
        ("skip_rng_on_load__checkpointer", "names no component 'checkpointer'"),
    ):
        with pytest.raises(AttributeError, match=says):
            getattr(mutated_components, attribute)


def test_the_2d_mesh_state_mutant_is_n_a_where_every_param_lies_on_a_1d_mesh(monkeypatch):
    pytest.importorskip("torch")
    matrix = load_matrix(REPO / "matrix.toml")
    mutant = mutants_named("state_replicated_on_2d_mesh")
    assert mutant.not_applicable(Cell({"world_size": 4, "fsdp": "fsdp2", "mesh": "hsdp"}), matrix) is None
    assert (
        mutant.not_applicable(Cell({"world_size": 4, "fsdp": "fsdp2"}), matrix)
        == "mesh=flat: every param's mesh is 1-D"
    )
    assert callable(mutated_component(matrix, mutant.name, "optimizer_adamw", monkeypatch))


def mutants_named(name: str):
    (mutant,) = [mutant for mutant in GENERIC_MUTANTS if mutant.name == name]
    return mutant


def test_the_optimizer_mutant_passes_parameter_names_on_only_to_a_factory_that_names_them():
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.zeros(2))
    named = [("norm.weight", param)]
    by_name = moments_cast_on_load("torchmatrix.models.optim:build_adamw_no_decay_on_norms")
    positional = moments_cast_on_load("torchmatrix.models.optim:build_adamw")
    assert accepts(by_name, "named_parameters")
    assert by_name([param], named_parameters=named, lr=1e-3).param_groups[-1]["weight_decay"] == 0.0
    assert positional([param], named_parameters=named, lr=1e-3).param_groups[0]["params"] == [param]


def build_container_keeping_fp32_state(params, *, lr, model):
    """A container built from the model, like torchtitan's OptimizersContainer, whose inner
    optimizer holds fp32 state after a load (the container's own `.state` stays empty)."""
    import torch

    class Container(torch.optim.Optimizer):
        def __init__(self):
            self.optimizers = [torch.optim.SGD(model.parameters(), lr=lr)]
            super().__init__(list(model.parameters()), {})

        def load_state_dict(self, state_dict):
            for param in model.parameters():
                self.optimizers[0].state[param] = {"momentum_buffer": torch.zeros(param.shape)}

    return Container()


def test_the_optimizer_mutant_passes_the_model_on_and_casts_a_containers_inner_state():
    torch = pytest.importorskip("torch")
    model = torch.nn.Linear(2, 2).to(torch.bfloat16)
    container = moments_cast_on_load(f"{__name__}:build_container_keeping_fp32_state")(
        list(model.parameters()), lr=1e-3, model=model
    )
    container.load_state_dict({})
    states = container.optimizers[0].state.values()
    assert [state["momentum_buffer"].dtype for state in states] == [torch.bfloat16, torch.bfloat16]
    positional = moments_cast_on_load("torchmatrix.models.optim:build_adamw")  # names no `model`: not given it
    assert positional(list(model.parameters()), lr=1e-3, model=model).param_groups[0]["lr"] == 1e-3


def test_unknown_mutant_is_a_one_line_error():
    with pytest.raises(SensitivityError, match="unknown nope; choose from skip_model_on_load"):
        chosen_mutants("skip_rng_on_load,nope")


RESUME = Suite("resume", "suites/test_resume.py", 240, ("world_size",))
CELL_A, CELL_B = Cell({"world_size": 1, "optimizer": "adamw"}), Cell({"world_size": 1, "optimizer": "te"})
UNKNOWN_DEVICE = Environment.without_torch("unknown")
TE_SKIP = "optimizer_te = torchmatrix.models.te_optim:build needs 'transformer_engine', which is not installed here"


def loader_failure(*rank_lines: str) -> TestOutcome:
    """A failed right-after-load check as the runner records it: the root cause headline as the
    message, pytest's text (the exception's lines marked E) and what re-running it alone showed."""
    listing = "".join(f"\nE         {line}" for line in rank_lines)
    text = (
        "cell = ws1-adamw\n\n    def test_state_restored_right_after_load(...):\n"
        '>       assert not problems, f"{cell.id}, {piece} right after load vs at save:\\n{listing}"\n'
        f"E       AssertionError: ws1-adamw, loader right after load vs at save:{listing}\n"
        "E       assert not {0: ['...']}\n\n"
        "suites/test_resume.py:112: AssertionError"
    )
    return TestOutcome(
        "resume",
        "test_state_restored_right_after_load[piece=loader]",
        "failed",
        message="AssertionError: ws1-adamw, loader right after load vs at save:",
        text=text,
        confirmation="fails alone",
        confirmation_note="failed: AssertionError: ws1-adamw, loader right after load vs at save:",
    )


def write_run(directory, outcomes_by_cell: dict) -> None:
    """The per-cell JUnit files a run writes, through the runner's own writer."""
    for cell, recorded in outcomes_by_cell.items():
        run = SuiteRun(RESUME, cell, (cell,))
        junit.write_cell(directory, "system", UNKNOWN_DEVICE, cell, [(run, outcome) for outcome in recorded])


def test_the_failure_names_what_differs_from_its_text_not_its_root_cause_headline(tmp_path):
    write_run(
        tmp_path,
        {
            CELL_A: [
                TestOutcome("resume", "test_losses_identical_after_resume", "passed"),
                loader_failure("rank 0: after load: loader would yield batch 0, saved at batch 2"),
                TestOutcome("resume", "test_state_restored_right_after_load[piece=rng]", "skipped", message="no RNG"),
            ]
        },
    )
    result = read_cells(tmp_path, "resume")[CELL_A.id]
    assert (result.ran, result.skip_reasons, result.skipped) == (2, ["no RNG"], None)
    (failure,) = result.failures
    assert failure.rank_lines == ("rank 0: after load: loader would yield batch 0, saved at batch 2",)
    assert failure.telling_line() == (
        "test_state_restored_right_after_load: rank 0: after load: loader would yield batch 0, saved at batch 2"
    )


def test_a_cell_the_unmutated_run_skips_reads_skipped_with_its_reason_never_missed(tmp_path):
    te_skipped = [TestOutcome("resume", "test_losses_identical_after_resume", "skipped", message=TE_SKIP)]
    write_run(tmp_path / "unmutated", {CELL_A: [loader_failure("rank 0: known")], CELL_B: te_skipped})
    baseline = read_cells(tmp_path / "unmutated", "resume")
    assert baseline[CELL_B.id].skipped == TE_SKIP
    write_run(tmp_path / "caught", {CELL_A: [loader_failure("rank 0: known", "rank 1: after load: new")]})
    write_run(tmp_path / "same", {CELL_A: [loader_failure("rank 0: known")]})
    mutant = chosen_mutants("skip_loader_on_load")[0]

    caught = judge(mutant, [CELL_A, CELL_B], baseline, tmp_path / "caught")
    assert (caught.caught_in, caught.missed_in, caught.skipped_in) == ([CELL_A.id], [], {CELL_B.id: TE_SKIP})
    assert caught.message == "test_state_restored_right_after_load: rank 1: after load: new"
    assert caught.result_text() == f"caught in 1 of 1 cells; skipped in {CELL_B.id} ({TE_SKIP})"
    assert not caught.missed

    same = judge(mutant, [CELL_A, CELL_B], baseline, tmp_path / "same", acted_in={CELL_A.id})
    assert not same.missed and list(same.not_applicable_in) == [CELL_A.id]
    assert same.not_applicable_in[CELL_A.id] == (
        "it failed only as the unmutated run fails (test_state_restored_right_after_load: rank 0: known), "
        "which hides whether the suite sees this mutant"
    )

    only_skipped = judge(mutant, [CELL_B], baseline, None)
    assert not only_skipped.missed and only_skipped.result_text() == f"skipped ({TE_SKIP})"


def resume_matrix(dropout: float, grad_ckpt_options: dict | None = None) -> str:
    """One ws1 cell of grad_ckpt (with these options) and resume with the reference components, at this dropout."""
    return matrix_toml(
        axes={"world_size": [1], "fsdp": ["none"], "attn": ["sdpa"], "optimizer": ["adamw"]},
        suites={
            "grad_ckpt": {
                "timeout": 120,
                "axes": ["world_size", "fsdp", "attn"],
                **({"options": grad_ckpt_options} if grad_ckpt_options else {}),
            },
            "resume": {
                "timeout": 240,
                "axes": ["world_size", "fsdp", "optimizer"],
                "options": {"steps": 5, "resume_step": 2, "dropout": dropout},
            },
        },
        components={
            "model": "torchmatrix.models.transformer:build_model",
            "parallelize": "torchmatrix.models.parallel:parallelize",
            "batch": "torchmatrix.models.transformer:make_batch",
            "optimizer_adamw": "torchmatrix.models.optim:build_adamw",
            "checkpointer": "torchmatrix.models.checkpoint:Checkpointer",
            "dataset": "torchmatrix.models.data:TokenDataset",
        },
    )


def sensitivity(
    tmp_path, dropout: float, mutants: str, grad_ckpt_options: dict | None = None
) -> tuple[subprocess.CompletedProcess, dict]:
    """Run the command on a one-cell matrix next to this checkout's suites; the process and sensitivity.json."""
    (tmp_path / "suites").symlink_to(REPO / "suites", target_is_directory=True)
    (tmp_path / "matrix.toml").write_text(resume_matrix(dropout, grad_ckpt_options) + PROJECT_IS_THIS_CHECKOUT)
    done = subprocess.run(
        [sys.executable, "-m", "torchmatrix", "sensitivity", "--config", str(tmp_path / "matrix.toml")]
        + ["--reports", str(tmp_path / "reports"), "--mutants", mutants],
        cwd=REPO,
        env=checkout_env(),
        capture_output=True,
        text=True,
        timeout=900,
    )
    written = list((tmp_path / "reports").glob("sensitivity-*/sensitivity.json"))
    return done, json.loads(written[0].read_text()) if written else {}


@pytest.mark.slow
def test_every_chosen_mutant_caught_exits_zero_with_the_table(tmp_path):
    chosen = [
        "skip_loader_on_load",
        "recompute_bumps_buffer",
        "recompute_reads_a_later_micro_batch",
        "generator_not_saved",
        "optimizer_counter_not_saved",
        "loader_shuffle_seed_not_saved",
    ]
    done, report = sensitivity(tmp_path, 0.1, ",".join(chosen))
    assert done.returncode == 0, done.stdout + done.stderr
    verdicts = {v["mutant"]: v for v in report["verdicts"]}
    assert all(verdicts[name]["caught_in"] == ["ws1-none-sdpa-adamw"] for name in chosen), verdicts
    said = {name: verdicts[name]["message"] for name in chosen}
    assert said["recompute_reads_a_later_micro_batch"].startswith(
        "test_micro_batches_before_one_backward_leave_gradients_unchanged: "
    ), said
    assert "after load: RNG stream model.mutant_generator differs from the saved one" in said["generator_not_saved"]
    assert "after load: optimizer attribute mutant_steps: is " in said["optimizer_counter_not_saved"], said
    assert "after load: the loader's batch 32 (the 31st after the load)" in said["loader_shuffle_seed_not_saved"], said
    assert "after load: loader would yield batch 0, saved at batch 2" in verdicts["skip_loader_on_load"]["message"]
    assert "buffer expert_layers.0.mutant_body_runs: 16 vs 8" in verdicts["recompute_bumps_buffer"]["message"]
    assert (
        "| `skip_loader_on_load` | checkpointer leaves the loader at its first batch | resume | caught in 1 of 1 cells |"
        in done.stdout
    )


@pytest.mark.slow
def test_a_mutant_that_acted_unseen_is_missed_and_one_that_could_not_be_seen_is_n_a(tmp_path):
    """The list a layer's modules append to, named in `ignored_attributes`, is left out of the
    module-attribute check: the mutant's hook ran in a recompute and nothing failed, so it is missed.
    Without dropout no RNG stream advances and the rng check skips: the RNG load skip is n/a, saying so."""
    ignored = {"ignored_attributes": ["mutant_aux_losses"]}
    done, report = sensitivity(tmp_path, 0.0, "recompute_appends_to_attribute,skip_rng_on_load", ignored)
    assert done.returncode == 1, done.stdout + done.stderr
    verdicts = {v["mutant"]: v for v in report["verdicts"]}
    appended = verdicts["recompute_appends_to_attribute"]
    assert appended["caught_in"] == [] and appended["missed_in"] == ["ws1-none-sdpa-adamw"], appended
    rng = verdicts["skip_rng_on_load"]
    assert rng["missed_in"] == [] and list(rng["not_applicable_in"]) == ["ws1-none-sdpa-adamw"], rng
    assert rng["not_applicable_in"]["ws1-none-sdpa-adamw"].startswith(
        "test_state_restored_right_after_load[piece=rng] skipped on the unmutated components: training advanced no RNG stream"
    )
    assert "missed recompute_appends_to_attribute (in ws1-none-sdpa-adamw)" in done.stderr


CELL_WS2 = Cell({"world_size": 2, "optimizer": "adamw"})


def test_a_mutant_missed_in_one_cell_is_missed_though_caught_in_another(tmp_path):
    write_run(tmp_path / "unmutated", {CELL_A: [], CELL_WS2: []})
    write_run(tmp_path / "mutant", {CELL_A: [loader_failure("rank 0: after load: new")], CELL_WS2: []})
    verdict = judge(
        chosen_mutants("skip_loader_on_load")[0], [CELL_A, CELL_WS2], {}, tmp_path / "mutant", acted_in={CELL_WS2.id}
    )
    assert (verdict.caught_in, verdict.missed_in) == ([CELL_A.id], [CELL_WS2.id])
    assert verdict.missed and verdict.result_text() == f"caught in 1 of 2 cells; **missed in {CELL_WS2.id}**"


def test_a_pass_where_the_mutant_never_acted_is_n_a_saying_what_did_not_happen_never_missed(tmp_path):
    write_run(tmp_path / "unmutated", {CELL_A: [], CELL_WS2: []})
    write_run(tmp_path / "mutant", {CELL_A: [], CELL_WS2: []})
    mutant = chosen_mutants("recompute_bumps_buffer")[0]
    verdict = judge(mutant, [CELL_A, CELL_WS2], {}, tmp_path / "mutant", acted_in={CELL_WS2.id})
    assert verdict.missed_in == [CELL_WS2.id]
    assert verdict.not_applicable_in == {
        CELL_A.id: "the hook never ran inside a checkpointed region (no module of a decoder layer ran during backward)"
    }
    never = judge(mutant, [CELL_A], {}, tmp_path / "mutant")
    assert not never.missed and never.result_text() == f"n/a ({mutant.idle})"
    assert chosen_mutants("skip_loader_on_load")[0].idle == (
        "its load skip removed nothing: the unmutated load left the loader position as a fresh build has it"
    )


def test_a_skipped_test_is_known_by_its_parameters_so_one_piece_of_resume_can_watch_a_mutant(tmp_path):
    skipped = TestOutcome(
        "resume", "test_state_restored_right_after_load[piece=rng]", "skipped", message="no RNG stream"
    )
    write_run(tmp_path, {CELL_A: [skipped, TestOutcome("resume", "test_losses_identical_after_resume", "passed")]})
    before = read_cells(tmp_path, "resume")[CELL_A.id]
    rng, loader = chosen_mutants("skip_rng_on_load,skip_loader_on_load")
    assert rng.unseen_in(before) == (
        "test_state_restored_right_after_load[piece=rng] skipped on the unmutated components: no RNG stream"
    )
    assert loader.unseen_in(before) is None


def test_a_cell_where_the_mutant_cannot_differ_is_n_a_never_missed():
    matrix = load_matrix(REPO / "matrix.toml")
    cells = {cell.id: cell for cell in matrix.cells()}
    ws1 = cells["ws1-none-flat-sdpa-adamw-default-none-none-none"]
    ws2 = cells["ws2-fsdp2-flat-sdpa-precision_aware-default-none-none-none"]
    rank_zero, cast = chosen_mutants("restore_on_rank_zero_only,moments_cast_to_param_dtype")
    assert not_applicable(rank_zero, [ws1, ws2], matrix) == {ws1.id: "one rank: rank 0 is every rank"}
    assert not_applicable(cast, [ws1, ws2], matrix) == {
        ws1.id: "resume gives optimizer adamw fp32 params: casting fp32 state to them changes nothing"
    }
    verdict = judge(rank_zero, [ws1], {}, None, {ws1.id: "one rank: rank 0 is every rank"})
    assert (verdict.missed, verdict.not_applicable_in) == (False, {ws1.id: "one rank: rank 0 is every rank"})
    assert verdict.result_text() == "n/a (one rank: rank 0 is every rank)"


def test_a_cell_where_the_only_test_that_sees_the_mutant_skipped_unmutated_is_n_a_never_missed(tmp_path):
    no_cache = no_cache_reason((False, False))
    cell = Cell({"world_size": 1, "fsdp": "none", "attn": "sdpa"})
    grad_ckpt = Suite("grad_ckpt", "suites/test_grad_ckpt.py", 120, ("world_size",))
    recorded = [
        TestOutcome("grad_ckpt", "test_checkpointing_leaves_loss_and_gradients_unchanged[dropout=0.0]", "passed"),
        TestOutcome(
            "grad_ckpt", "test_recompute_reruns_layers_and_rewrites_cache_identically", "skipped", message=no_cache
        ),
    ]
    junit.write_cell(
        tmp_path, "system", UNKNOWN_DEVICE, cell, [(SuiteRun(grad_ckpt, cell, (cell,)), o) for o in recorded]
    )
    baseline = read_cells(tmp_path, "grad_ckpt")
    counter, buffer = chosen_mutants("recompute_bumps_cache_counter,recompute_bumps_buffer")

    verdict = judge(counter, [cell], baseline, None)
    reason = (
        f"test_recompute_reruns_layers_and_rewrites_cache_identically skipped on the unmutated components: {no_cache}"
    )
    assert (verdict.missed, verdict.not_applicable_in) == (False, {cell.id: reason})
    assert buffer.unseen_in(baseline[cell.id]) is None


def crash_in_mutant(test: str) -> TestOutcome:
    """A rank that raised inside the mutant's wrapper, as the runner records the failed test."""
    text = (
        "E   RankFailure: cell ws1-adamw: ---- rank 0 traceback ----\n"
        "E   Traceback (most recent call last):\n"
        'E     File "/x/torchmatrix/sensitivity/mutants.py", line 40, in put_back\n'
        "E       self.optimizer.load_state_dict(saved)\n"
        "E   KeyError: 'param_groups'"
    )
    return TestOutcome("resume", test, "failed", message="KeyError: 'param_groups'", text=text)


def test_a_mutant_that_crashed_itself_is_errored_not_caught(tmp_path):
    write_run(tmp_path / "unmutated", {CELL_A: []})
    follow_up = TestOutcome(
        "resume", "test_losses_identical_after_resume", "failed", message="the training runs failed earlier"
    )
    write_run(tmp_path / "mutant", {CELL_A: [crash_in_mutant("test_rebuilt_run_starts_from_other_weights"), follow_up]})
    verdict = judge(chosen_mutants("skip_optimizer_on_load")[0], [CELL_A], {}, tmp_path / "mutant")
    assert (verdict.caught_in, verdict.errored_in, verdict.missed) == ([], [CELL_A.id], False)
    assert verdict.errored and verdict.error == "test_rebuilt_run_starts_from_other_weights: KeyError: 'param_groups'"
    assert verdict.result_text() == f"**errored in {CELL_A.id}** (the mutant crashed)"
    assert read_cells(tmp_path / "mutant", "resume")[CELL_A.id].failures[0].crashed is False, (
        "without the mutant's sources named, a failure is no crash"
    )


def test_the_across_ranks_line_of_a_partial_restore_is_read_with_the_per_rank_lines():
    text = (
        "E       AssertionError: c, parameters:\nE         across ranks: after load: x\nE         rank 1: after load: y"
    )
    assert raised_rank_lines(text) == ("across ranks: after load: x", "rank 1: after load: y")


def test_a_mutant_that_cannot_act_on_the_stack_is_n_a_with_its_reason(tmp_path):
    write_run(tmp_path / "mutant", {CELL_A: []})
    mutant = chosen_mutants("recompute_bumps_buffer")[0]
    reason = "Block has no submodule with parameters of its own to hook"
    verdict = judge(mutant, [CELL_A], {}, tmp_path / "mutant", cannot_act={CELL_A.id: reason})
    assert not verdict.missed and not verdict.errored and verdict.not_applicable_in == {CELL_A.id: reason}


class AttentionLayer(torch.nn.Module):
    """A layer whose self-attention passes one tensor as query, key and value (the "query is key" fast path)."""

    def __init__(self):
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(8, 2, batch_first=True)

    def forward(self, hidden):
        return checkpoint(lambda x: self.attention(x, x, x, need_weights=False)[0], hidden, use_reentrant=False)


class AttentionModel(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.layers = torch.nn.ModuleList([AttentionLayer()])

    def decoder_layers(self):
        return list(self.layers)

    def forward(self, hidden):
        for layer in self.layers:
            hidden = layer(hidden)
        return hidden.square().mean()


def build_attention_model(cell, **keywords):
    torch.manual_seed(0)
    return AttentionModel()


def test_the_held_input_mutant_keeps_query_is_key_and_recomputes_on_the_later_micro_batch():
    """Two micro-batches forward, one backward: the mutant's recompute of the first reads the second's
    input, passed as query, key and value alike, so torch's checkpoint sees the same ops and the gradient moves."""
    micro_batches = [torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(seed)) for seed in (1, 2)]

    def gradient(model):
        sum(model(batch) for batch in micro_batches).backward()
        return model.layers[0].attention.in_proj_weight.grad

    mutated = holds_inputs_across_calls(f"{__name__}:build_attention_model")({})
    assert not torch.equal(gradient(mutated), gradient(build_attention_model({})))


class UnsizedDataset:
    """A dataset without `len()` whose loader yields dict batches of token ids and a float mask."""

    def __init__(self, path):
        self.path = path

    def loader(self, *, batch_size, rank, world_size):
        return UnsizedLoader()


class UnsizedLoader:
    def __init__(self):
        self.position = 0

    def __next__(self):
        self.position += 1
        return {"tokens": torch.arange(6).reshape(2, 3), "mask": torch.ones(2, 3)}

    def state_dict(self):
        return {"position": self.position}

    def load_state_dict(self, state):
        self.position = state["position"]


def test_the_reshuffling_loader_needs_no_len_and_relabels_the_token_ids_of_any_batch():
    torch.manual_seed(0)
    loader = reshuffles_from_unsaved_seed(f"{__name__}:UnsizedDataset")("unused").loader(
        batch_size=2, rank=0, world_size=1
    )
    first, second = next(loader), next(loader)
    assert torch.equal(first["tokens"], torch.arange(6).reshape(2, 3))
    assert sorted(second["tokens"].flatten().tolist()) == list(range(6))
    assert not torch.equal(second["tokens"], first["tokens"]) and torch.equal(second["mask"], first["mask"])
