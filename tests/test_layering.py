"""The import layering of mig_batch, read from the code: no import points to a higher layer, no two packages
import each other, and no module imports itself round a loop.

Every ``import`` and ``from ... import`` counts, wherever it is (top level, inside a function, under
``TYPE_CHECKING``): a lazy import is still a dependency. A unit is a package directly under mig_batch/
(``controller``) or a top-level module (``config``); the table below puts each unit in a layer, and a module
may import from its own layer and the layers below. A new package or top-level module must be given a layer
here (``test_every_unit_has_a_layer``).

Program entry points are the top of their program, whatever package holds them: a ``__main__.py`` and the
code under ``if __name__ == "__main__":`` run only as ``python -m ...`` (the generated hooks, the systemd
units and the test harness start them by these names) and nothing imports them, so they count as the
``programs`` layer and as units of their own.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "mig_batch"

# top to bottom; a module may import from its own layer and any layer below it
LAYERS: list[tuple[str, frozenset[str]]] = [
    # the command line (mig-batch, migsub) and the daemons' mains (cli/daemons.py: mig-batchd, the agents)
    ("programs", frozenset({"cli"})),
    # the controller's pass, and the benchmarks that drive it
    ("controller", frozenset({"controller", "bench"})),
    # what runs inside a job: the subjob helper and its runner (which submits the chain's next job)
    ("job side", frozenset({"subjob"})),
    # the one factory that builds the batch system, GPU backend and fence the site config names
    ("factory", frozenset({"factory"})),
    # the batch-system adapters, each with its node agent's service side
    ("adapters", frozenset({"slurm", "htcondor"})),
    # the node agent: batch-neutral, acting through the seam
    ("node", frozenset({"node"})),
    # the seam: the BatchSystem protocol, job tags and states; the controller's store, written in its terms
    ("seam", frozenset({"batch", "state"})),
    # pure core: MIG geometry, placement, planning, simulation, GPU backends, the site config, shared helpers
    ("core", frozenset({"mig", "placement", "atomize", "planner", "sim", "gpu", "config", "errors", "request",
                        "entry", "leaves", "resources", "safe_files", "yaml_text", "job_env", "__init__"})),
]  # fmt: skip
PROGRAMS = "programs"

# Known exceptions, each named and temporary: (importing module, imported module) -> why. Empty now.
ALLOWED: dict[tuple[str, str], str] = {}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module (``mig_batch.x.y``), or ``mig_batch.x.y:__main__`` for its main block
    target: str  # the imported module of mig_batch (the deepest one that exists)
    where: str  # file:line, for the message


def module_name(path: Path, package: Path = PACKAGE) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_main_block(node: ast.stmt) -> bool:
    """``if __name__ == "__main__":``"""
    test = node.test if isinstance(node, ast.If) else None
    return (isinstance(test, ast.Compare) and isinstance(test.left, ast.Name) and test.left.id == "__name__"
            and len(test.comparators) == 1 and isinstance(test.comparators[0], ast.Constant)
            and test.comparators[0].value == "__main__")  # fmt: skip


def _imported_names(node: ast.AST, module: str, is_package: bool) -> list[str]:
    """What an import statement loads: the module imported from, then the names that may be modules of its
    own (``from X import y`` loads the module ``X.y`` when there is one)."""
    if isinstance(node, ast.Import):
        return [""] + [alias.name for alias in node.names]
    if not isinstance(node, ast.ImportFrom):
        return []
    if node.level:  # relative: from the importing module's package, up level - 1 packages
        base = module.split(".") if is_package else module.split(".")[:-1]
        base = base[: len(base) - (node.level - 1)]
        stem = ".".join([*base, node.module] if node.module else base)
    else:
        stem = node.module or ""
    return [stem, *(f"{stem}.{alias.name}" for alias in node.names)]


def read_imports(package: Path = PACKAGE) -> tuple[set[str], list[Import]]:
    """Every module of the package and every import of one of them, function-level ones included."""
    files = sorted(package.rglob("*.py"))
    modules = {module_name(f, package) for f in files}
    imports: list[Import] = []
    for path in files:
        module = module_name(path, package)
        tree = ast.parse(path.read_text(), filename=str(path))
        main_blocks = [n for n in tree.body if _is_main_block(n)]
        in_main = {id(inner) for block in main_blocks for inner in ast.walk(block)}
        for node in ast.walk(tree):
            if not isinstance(node, ast.Import | ast.ImportFrom):
                continue
            names = _imported_names(node, module, path.name == "__init__.py")
            # the modules named (``from pkg import module``), else the one imported from
            targets = {n for n in names[1:] if n in modules} or {_deepest_module(names[0], modules)}
            source = f"{module}:__main__" if id(node) in in_main else module
            where = f"{path.relative_to(package.parent)}:{node.lineno}"
            imports += [Import(source, t, where) for t in sorted(targets) if t and t != module]
    return modules, imports


def _deepest_module(name: str, modules: set[str]) -> str:
    while name and name not in modules:
        name = name.rpartition(".")[0]
    return name


def unit_of(module: str) -> str:
    """The layer table's unit: the package under mig_batch, the top-level module, or the entry point itself."""
    if module.endswith(":__main__") or module.endswith(".__main__"):
        return module.removeprefix("mig_batch.")
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def layer_of(unit: str, layers: list[tuple[str, frozenset[str]]] = LAYERS) -> int:
    """The unit's layer, as an index from the top; KeyError for a unit the table does not place."""
    if unit.endswith("__main__"):
        return [name for name, _ in layers].index(PROGRAMS)
    for index, (_, units) in enumerate(layers):
        if unit in units:
            return index
    raise KeyError(unit)


def upward_imports(imports: Iterable[Import], layers: list[tuple[str, frozenset[str]]] = LAYERS,
                   allowed: Mapping[tuple[str, str], str] = ALLOWED) -> list[str]:  # fmt: skip
    """Each import that points to a higher layer, in words."""
    found = []
    for imp in imports:
        if imp.target == "mig_batch" or not imp.target.startswith("mig_batch."):
            continue
        source, target = unit_of(imp.source), unit_of(imp.target)
        here, there = layer_of(source, layers), layer_of(target, layers)
        if there < here and (imp.source, imp.target) not in allowed:
            found.append(f"{imp.where}: {imp.source} imports {imp.target}: layer {layers[here][0]!r} ({source}) "
                         f"may not import from the higher layer {layers[there][0]!r} ({target})")  # fmt: skip
    return found


def cycles(edges: Mapping[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one node (Tarjan's algorithm, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in sorted(edges):
        if root in index:
            continue
        work = [(root, iter(sorted(edges.get(root, ()))))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = len(index)
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges.get(child, ())))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def cycle_text(component: list[str], imports: Iterable[Import], key=lambda name: name) -> str:
    """A cycle and the imports that make it, for the failure message."""
    members = set(component)
    links = sorted({f"  {imp.where}: {imp.source} imports {imp.target}" for imp in imports
                    if key(imp.source) in members and key(imp.target) in members
                    and key(imp.source) != key(imp.target)})  # fmt: skip
    return " <-> ".join(component) + "\n" + "\n".join(links)


def _graph(imports: Iterable[Import], key=lambda name: name) -> dict[str, set[str]]:
    edges: dict[str, set[str]] = {}
    for imp in imports:
        if imp.target.startswith("mig_batch.") and (imp.source, imp.target) not in ALLOWED:
            source, target = key(imp.source), key(imp.target)
            if source != target:
                edges.setdefault(source, set()).add(target)
    return edges


MODULES, IMPORTS = read_imports()


def test_every_unit_has_a_layer():
    placed = set().union(*(units for _, units in LAYERS))
    units = {unit_of(m) for m in MODULES if not m.endswith(".__main__")}
    assert units <= placed, f"give these a layer in tests/test_layering.py LAYERS: {sorted(units - placed)}"
    assert not placed - units, f"LAYERS names what mig_batch does not have: {sorted(placed - units)}"
    counts = [unit for _, units in LAYERS for unit in units]
    assert len(counts) == len(set(counts)), "a unit is in two layers"


def test_no_import_goes_up():
    found = upward_imports(IMPORTS)
    assert not found, "imports that point up the layers:\n" + "\n".join(found)


def test_no_two_packages_import_each_other():
    found = cycles(_graph(IMPORTS, unit_of))
    assert not found, "packages that import each other:\n" + "\n".join(cycle_text(c, IMPORTS, unit_of)
                                                                       for c in found)  # fmt: skip


def test_no_module_imports_itself_round_a_loop():
    found = cycles(_graph(IMPORTS))
    assert not found, "modules that import each other:\n" + "\n".join(cycle_text(c, IMPORTS) for c in found)


def test_the_allowances_are_still_needed():
    used = {(imp.source, imp.target) for imp in IMPORTS}
    assert not set(ALLOWED) - used, f"drop these from ALLOWED, the code no longer does them: {set(ALLOWED) - used}"


def test_the_check_sees_an_upward_import_a_cycle_and_a_main_block(tmp_path):
    """The checks above on a small package of their own: each must fail where it should."""
    root = tmp_path / "mig_batch"
    for name, text in {
        "__init__.py": "",
        "config.py": "def f():\n    from mig_batch.cli import tool  # upward, inside a function\n",
        "cli/__init__.py": "",
        "cli/tool.py": "import mig_batch.config\nfrom . import other\n",
        "cli/other.py": "from mig_batch.cli.tool import x\n",
        "node/__init__.py": "",
        "node/run.py": "if __name__ == '__main__':\n    from mig_batch.cli import tool\n",
    }.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    layers = [("programs", frozenset({"cli"})), ("node", frozenset({"node"})),
              ("core", frozenset({"config", "__init__"}))]  # fmt: skip
    modules, imports = read_imports(root)
    assert modules == {"mig_batch", "mig_batch.config", "mig_batch.cli", "mig_batch.cli.tool", "mig_batch.cli.other",
                       "mig_batch.node", "mig_batch.node.run"}  # fmt: skip
    found = upward_imports(imports, layers, allowed={})
    assert len(found) == 1 and "mig_batch/config.py:2: mig_batch.config imports mig_batch.cli.tool" in found[0], found
    assert cycles(_graph(imports, unit_of)) == [["cli", "config"]]
    assert cycles(_graph(imports)) == [["mig_batch.cli.other", "mig_batch.cli.tool", "mig_batch.config"]]
    assert Import("mig_batch.node.run:__main__", "mig_batch.cli.tool", "mig_batch/node/run.py:2") in imports


# The controller is phases over one snapshot, a room per concern (docs/architecture.md): no room grows into a hall.
ROOM_MAX_LINES = 400
METHOD_MAX_LINES = 60


def test_the_controller_rooms_and_their_methods_stay_small():
    too_long = []
    for path in sorted((PACKAGE / "controller").glob("*.py")):
        source = path.read_text()
        if len(source.splitlines()) > ROOM_MAX_LINES:
            too_long.append(f"{path.name}: {len(source.splitlines())} lines (at most {ROOM_MAX_LINES})")
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > METHOD_MAX_LINES:
                    where = f"{path.name}:{node.lineno} {node.name}"
                    too_long.append(f"{where}: {lines} lines (at most {METHOD_MAX_LINES})")
    assert not too_long, "split these into rooms or phases of their own:\n" + "\n".join(too_long)
