"""Optional dependencies and data (issue 48, items 2 and 7): a command that needs an extra that is not installed
says which and how to get it (exit 2), rich's absence leaves plain output, the simulators run on the data that
ships and name the data that may not ship (file, source, option); bench planner's short default and --full."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from pathlib import Path

import pytest

from mig_batch.cli import output
from mig_batch.cli.main import main
from mig_batch.cli.output import Literal, Table, TableConsole
from mig_batch.entry import EXTRA_MODULES, MissingExtraError, require_extra, run_guarded
from mig_batch.sim.data import DATA_DIR, PHILLY_SAMPLE

REPO = Path(__file__).resolve().parents[1]
SHARED_PHILLY = REPO.parent / "shared" / "data" / "philly" / "philly_runtime.csv"
PHILLY_SHA256 = "e99015baaea66833ebeac68d27c994aa13d83847f73b4a7c7dc71fe94b395247"  # shared/data/philly/README.md


# --- extras ---------------------------------------------------------------------------------------------------


def test_a_missing_extra_is_named_with_its_install_command(monkeypatch):
    monkeypatch.setitem(EXTRA_MODULES, "sim", ("mig_batch_no_such_module",))
    with pytest.raises(MissingExtraError, match=r"`mig-batch simulate` needs the sim extra \(mig_batch_no_such_module "
                       r"not installed\): pip install 'mig-batch\[sim\]'"):  # fmt: skip
        require_extra("sim", "mig-batch simulate")
    require_extra("controller", "mig-batchd")  # installed here: no error


@pytest.mark.parametrize("argv", [["simulate", "placement", "--runs", "1"], ["simulate", "flex", "--quick"],
                                  ["plan", "queue.yaml"], ["bench", "planner"]])  # fmt: skip
def test_each_sim_command_checks_its_extra_before_it_starts(monkeypatch, capsys, tmp_path, argv):
    monkeypatch.setitem(EXTRA_MODULES, "sim", ("mig_batch_no_such_module",))
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert f"`mig-batch {' '.join(argv[:1 if argv[0] == 'plan' else 2])}` needs the sim extra" in err, err
    assert "pip install 'mig-batch[sim]'" in err and not list(tmp_path.iterdir()), "it refused before any work"


@pytest.mark.parametrize(("module", "args", "extra"), [
    ("ortools", ["bench", "planner"], "sim"), ("numpy", ["simulate", "multi"], "sim"), ("numpy", [], "controller"),
    ("rich", [], "controller"),
])  # fmt: skip
def test_an_import_of_an_extras_module_that_fails_still_names_the_extra(capsys, module, args, extra):
    """A path no require_extra guards: the entry point's handler turns the ImportError into the extra's name."""

    def body(_: list[str]) -> int:
        raise ModuleNotFoundError(f"No module named '{module}'", name=module)

    prog = "mig-batch" if args else "mig-batchd"
    assert run_guarded(body, args, prog) == 2
    err = capsys.readouterr().err
    assert f"needs the {extra} extra ({module} not installed): pip install 'mig-batch[{extra}]'" in err, err
    assert "internal error" not in err


def test_an_import_error_of_no_extra_is_still_an_internal_error(capsys):
    def body(_: list[str]) -> int:
        raise ModuleNotFoundError("No module named 'mig_batch.nope'", name="mig_batch.nope")

    assert run_guarded(body, [], "mig-batch") == 2
    assert "internal error" in capsys.readouterr().err


# --- rich is optional -----------------------------------------------------------------------------------------


@pytest.fixture
def no_rich(monkeypatch):
    """This process as a node sees it: rich not installed (the lookup answers no; rich is never imported)."""
    monkeypatch.setattr(output, "_RICH", [False])


def test_without_rich_tables_and_text_print_plainly(no_rich, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # would make rich draw for a terminal: no rich, no terminal
    out = io.StringIO()
    console = TableConsole(file=out, width=200)
    table = Table(title="checks")
    table.add_column("check")
    table.add_column("detail")
    table.add_row("[bold]agent[/]", Literal("reason [x] kept"), style="red")
    table.add_row("store", "ok")
    console.print(table)
    console.print("[bold red]error:[/] a [link=x]link[/link] and a \\[literal]", highlight=False)
    console.print(Literal("mig-batch[controller]"))
    with console.status("working"):
        pass
    assert out.getvalue().splitlines() == [
        "# checks", "check  detail", "agent  reason [x] kept", "store  ok",
        "error: a link and a [literal]", "mig-batch[controller]",
    ]  # fmt: skip
    assert isinstance(console.rich, output.PlainConsole)


def test_with_rich_a_literal_keeps_its_brackets(capsys):
    console = TableConsole()
    console.print(Literal("mig-batch[sim]"))
    table = Table("a")
    table.add_row(Literal("[bold]x[/]"))
    console.print(table)
    assert capsys.readouterr().out.splitlines() == ["mig-batch[sim]", "a", "[bold]x[/]"]


# --- data that ships: the Philly sample -----------------------------------------------------------------------


def test_the_shipped_philly_sample_is_the_attributed_file_unchanged():
    assert hashlib.sha256(gzip.decompress(PHILLY_SAMPLE.read_bytes())).hexdigest() == PHILLY_SHA256
    notice = (DATA_DIR / "README.md").read_text()
    assert "CC-BY-4.0" in notice and "Jeon" in notice and "msr-fiddle/philly-traces" in notice
    assert PHILLY_SHA256 in notice


def test_simulate_flex_runs_on_the_shipped_sample_by_default(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("MIG_BATCH_DATA_DIR", raising=False)
    monkeypatch.chdir(tmp_path)  # no ../shared/data from here
    assert main(["simulate", "flex", "--quick", "--out", str(tmp_path / "a"), "--json"]) == 0
    shipped = json.loads((tmp_path / "a" / "flex.json").read_text())
    assert shipped["setup"]["runtime_sample"] == {"file": str(PHILLY_SAMPLE), "jobs": 83_154}
    assert json.loads(capsys.readouterr().out)["fig7"]["fm/dm"]["mean"] > 0
    if not SHARED_PHILLY.is_file():
        return
    # the same numbers as from the project's copy of the file
    monkeypatch.setenv("MIG_BATCH_DATA_DIR", str(SHARED_PHILLY.parents[1]))
    assert main(["simulate", "flex", "--quick", "--out", str(tmp_path / "b"), "--json"]) == 0
    copy = json.loads((tmp_path / "b" / "flex.json").read_text())
    assert copy["setup"].pop("runtime_sample")["file"] == str(SHARED_PHILLY)
    shipped["setup"].pop("runtime_sample")
    assert copy == shipped


def test_a_runtime_sample_that_is_not_text_is_refused(tmp_path, capsys):
    (tmp_path / "philly").mkdir()
    (tmp_path / "philly" / "philly_runtime.csv").write_bytes(b"runtime\n\xff\xfe\x00\x01\n")
    assert main(["simulate", "flex", "--quick", "--data-dir", str(tmp_path), "--out", str(tmp_path / "o")]) == 2
    assert "philly_runtime.csv" in capsys.readouterr().err


# --- data that may not ship: named with its source and option -------------------------------------------------


@pytest.mark.parametrize(("argv", "names", "source", "option"), [
    (["simulate", "placement", "--experiment", "grmu"], "openb_node_list_gpu_node.csv",
     "https://github.com/alibaba/clusterdata", "--trace-dir"),
    (["simulate", "placement", "--experiment", "robust", "--quick"], "openb_pod_list_default.csv",
     "https://github.com/alibaba/clusterdata", "--trace-dir"),
    (["simulate", "atomize", "--workload", "alibaba"], "openb_pod_list_default.csv",
     "https://github.com/alibaba/clusterdata", "--trace-dir"),
    (["bench", "planner", "--workloads", "rodinia-a100"], "g_A100.csv",
     "https://github.com/Jorgitou98/task-scheduling", "--rodinia-dir"),
    (["bench", "planner", "--full"], "g_A100.csv", "https://github.com/Jorgitou98/task-scheduling", "--rodinia-dir"),
])  # fmt: skip
def test_data_that_does_not_ship_is_named_with_its_source_and_option(tmp_path, capsys, monkeypatch, argv, names,
                                                                      source, option):  # fmt: skip
    for variable in ("MIG_BATCH_TRACE_DIR", "MIG_BATCH_RODINIA_DIR"):
        monkeypatch.setenv(variable, str(tmp_path / "nowhere"))
    out = ["--out", str(tmp_path / "out")] if argv[0] == "simulate" else []
    assert main([*argv, *out]) == 2
    err = capsys.readouterr().err
    assert names in err and source in err and option in err and str(tmp_path / "nowhere") in err, err
    assert "not ship" in err and "Traceback" not in err, err


# --- bench planner: short by default, --full on demand --------------------------------------------------------


def _planner_rows(capsys, argv: list[str]) -> dict:
    assert main(["bench", "planner", "--planners", "far,nomig", "--workloads", "widetimes", "--gap-batch", "0",
                 *argv, "--json"]) == 0  # fmt: skip
    return json.loads(capsys.readouterr().out)


def test_bench_planner_is_short_by_default_and_full_on_demand(capsys):
    short = _planner_rows(capsys, [])
    assert {r["batches"] for r in short["p_opt"]} == {1}  # one dataset of one batch of 14 tasks
    full = _planner_rows(capsys, ["--full", "--datasets", "1"])
    assert {r["batches"] for r in full["p_opt"]} == {100 // 14}  # --full: 100 tasks per dataset
    assert _planner_rows(capsys, ["--full", "--datasets", "1", "--tasks", "28"])["p_opt"][0]["batches"] == 2


def test_bench_planner_draws_a_progress_bar_on_a_terminal(monkeypatch):
    """The bar goes to the terminal while it runs (rich, transient): its description and count are drawn."""
    from mig_batch.cli import bench_commands

    screen = io.StringIO()
    monkeypatch.setattr(bench_commands, "console", TableConsole(file=screen, force_terminal=True, width=120))
    assert main(["bench", "planner", "--planners", "nomig", "--workloads", "widetimes,poorscaling",
                 "--gap-batch", "0"]) == 0  # fmt: skip
    drawn = screen.getvalue()
    assert "planners" in drawn and "2/2" in drawn, drawn
