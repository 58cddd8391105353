"""What a site installs for Slurm: job_submit.lua with the profile table, and the Prolog, Epilog and
TaskProlog. They ask the node agent through the hook client, compiled from C when the host has a C
compiler: installed as the hooks themselves (``direct``: no shell starts per job), or run by shell shims
that fall back to the standard-library Python client where it cannot run (``c``, for a directory shared
between nodes that may differ); without a compiler, the shims run the Python client (``python``)."""

from __future__ import annotations

import functools
import json
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

from mig_batch.batch import site_files
from mig_batch.mig.models import GpuModel, get_model
from mig_batch.node import hook_client
from mig_batch.resources import resource_path

SHIMS = ("mig-batch-prolog", "mig-batch-epilog", "mig-batch-taskprolog", "mig-batch-subjob")
DIRECT_HOOKS = SHIMS[:3]  # what the compiled client can be itself (by the name it is run as)
HOOK_BINARY = "mig-batch-hook"
SLURM_LIBRARY = "libmig-batch-slurm.so"
HOOK_KINDS = ("auto", "direct", "c", "python")
# file systems a hook directory may be shared on between nodes of other kinds (another CPU architecture)
SHARED_FILE_SYSTEMS = ("nfs", "nfs4", "cifs", "smb3", "smbfs", "lustre", "gpfs", "beegfs", "ceph", "glusterfs",
                       "wekafs", "panfs", "gfs2", "ocfs2", "pvfs2", "orangefs", "cvfs", "afs", "9p", "virtiofs",
                       "fuse")  # fmt: skip


def hook_named(name: str) -> str | None:
    """Which hook the compiled client is when run as ``name`` with no arguments ("taskprolog", "prolog",
    "epilog"; None: none), as its ``hook_of`` decides: the word in the name, never Slurm's other hooks."""
    name = name.lower()
    if any(word in name for word in ("slurmctld", "taskepilog", "srun")):
        return None
    return next((hook for hook in ("taskprolog", "epilog", "prolog") if hook in name), None)


def c_string(text: str) -> str:
    """``text`` as a C string literal (a compiler ``-D`` value: paths compiled into the hook client)."""
    body = "".join(chr(b) if 0x20 <= b < 0x7F and chr(b) not in '"\\?' else f"\\{b:03o}" for b in os.fsencode(text))
    return f'"{body}"'


def build_hook_client(dest: Path, compiler: str | None = None,
                      paths: Mapping[str, str] | None = None) -> tuple[Path | None, str]:  # fmt: skip
    """Compile the C hook client into ``dest``: (its path, "") or (None, why not). ``paths`` (socket, config,
    python, job_dir) are compiled in: the binary can then be the hooks themselves. Linked statically where
    the C library allows (it starts faster and needs no shared library on the node)."""
    cc = compiler or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) on this host"
    source, binary = resource_path("plugins", "slurm", f"{HOOK_BINARY}.c"), dest / HOOK_BINARY
    building = dest / f".{HOOK_BINARY}.new"  # a Prolog starting meanwhile runs the old binary, whole
    defines = [f"-DHOOK_{key.upper()}={c_string(value)}" for key, value in (paths or {}).items()]
    proc = None
    for link in (["-static"], []):
        try:
            proc = subprocess.run([cc, "-O2", "-std=gnu11", *link, *defines, "-o", str(building), str(source)],
                                  capture_output=True, text=True, timeout=120)  # fmt: skip
        except (OSError, subprocess.TimeoutExpired) as exc:
            building.unlink(missing_ok=True)
            return None, f"{cc} failed: {exc}"
        if proc.returncode == 0:
            break
    if proc is None or proc.returncode != 0:
        building.unlink(missing_ok=True)
        return None, f"{cc} failed: {proc.stderr.strip()[-500:] if proc else ''}"
    building.chmod(0o755)
    os.replace(building, binary)
    return binary, ""


def build_slurm_library(dest: Path, compiler: str | None = None, slurm_bin: str = "") -> tuple[Path | None, str]:
    """Compile the Slurm API helper (:mod:`mig_batch.slurm.native`) into ``dest`` against this host's slurm.h
    and libslurm: (its path, "") or (None, why not). ``slurm_bin``: where Slurm's commands are, when Slurm
    is installed under its own prefix (its include/ and lib/ are searched first)."""
    cc = compiler or shutil.which("cc") or shutil.which("gcc")
    if cc is None:
        return None, "no C compiler (cc) on this host"
    flags = []
    if slurm_bin:
        prefix = Path(slurm_bin).parent
        flags = [f"-I{prefix / 'include'}", f"-L{prefix / 'lib'}", f"-Wl,-rpath,{prefix / 'lib'}"]
    source, library = resource_path("plugins", "slurm", "mig-batch-slurm.c"), dest / SLURM_LIBRARY
    building = dest / f".{SLURM_LIBRARY}.new"  # a process loading it meanwhile gets the old one, whole
    try:
        # --no-undefined: a libslurm that no longer exports a name the library calls fails here, not at load
        proc = subprocess.run([cc, "-O2", "-std=gnu11", "-shared", "-fPIC", "-Wl,--no-undefined", *flags, "-o",
                               str(building), str(source), "-lslurm"], capture_output=True, text=True,
                              timeout=120)  # fmt: skip
    except (OSError, subprocess.TimeoutExpired) as exc:
        building.unlink(missing_ok=True)
        return None, f"{cc} failed: {exc}"
    if proc.returncode != 0:
        building.unlink(missing_ok=True)
        if "slurm/slurm.h" in proc.stderr:
            return None, "no slurm/slurm.h: install Slurm's headers (Debian: libslurm-dev, RHEL: slurm-devel)"
        return None, f"{cc} failed: {proc.stderr.strip()[-500:]}"
    building.chmod(0o755)
    os.replace(building, library)
    return library, ""


_OCTAL_ESCAPE = re.compile(r"\\([0-7]{3})")  # how mountinfo writes a blank, tab, newline or backslash


def file_system_type(path: Path, mountinfo: str = "/proc/self/mountinfo") -> str:
    """The type of the file system ``path`` is on: the mount with the longest mount point that holds it, the
    last one mounted there ("" when unknown)."""
    target, best, kind = str(Path(path).resolve()), "", ""
    try:
        with open(mountinfo, encoding="utf-8", errors="surrogateescape") as f:
            for line in f:
                fields, _, rest = line.partition(" - ")
                mount = _OCTAL_ESCAPE.sub(lambda m: chr(int(m[1], 8)), fields.split()[4])
                if (target == mount or target.startswith(mount.rstrip("/") + "/")) and len(mount) >= len(best):
                    best, kind = mount, rest.split()[0]
    except (OSError, IndexError):
        return ""
    return kind


def shared_file_system(kind: str) -> bool:
    """Whether a file system of this type (:func:`file_system_type`) may be shared with other nodes (a
    network or FUSE one)."""
    return kind in SHARED_FILE_SYSTEMS or kind.startswith("fuse.")


def profile_table(models: Iterable[GpuModel], nodes: Mapping[str, Sequence[str]] | None = None,
                  leaf_requests: bool = False) -> str:  # fmt: skip
    """The Lua tables: each model's profiles (with how many fit one GPU, for jobs over several instances)
    and its Flex-MIG leaves (``leaf_one`` for a job of one, ``leaf`` for more: mig_batch.leaves' rule, read
    by job_submit.lua for the site's finer requests); when the site's inventory is known, each node's GPU
    models; and whether the site allows requests over leaves (``flex.leaf_requests``)."""
    from mig_batch.leaves import leaf_profiles
    from mig_batch.mig.tables import tables_for
    from mig_batch.placement.multi import max_per_gpu
    from mig_batch.request import ROUND_UP_RULE

    lines = [f"MIG_LEAF_REQUESTS = {'true' if leaf_requests else 'false'}",
             f"MIG_ROUND_UP = {ROUND_UP_RULE['factor']!r}  -- a profile over this times the memory asked is told",
             "MIG_MODELS = {"]  # fmt: skip
    for model in sorted(models, key=lambda m: m.name):
        one, many = leaf_profiles(model)
        lines.append(f'\t["{model.name}"] = {{ compute_slices = {model.compute_slices}, leaf_one = "{one.name}", '
                     f'leaf = "{many.name}", profiles = {{')  # fmt: skip
        for p in model.base_profiles:
            per_gpu = max_per_gpu(tables_for(model.name), p.name)
            lines.append(f'\t\t{{ name = "{p.name}", memory_mib = {p.memory_mib}, compute = {p.compute_slices}, '
                         f"slices = {p.memory_slices}, per_gpu = {per_gpu} }},")  # fmt: skip
        lines.append("\t} },")
    lines.append("}")
    lines.append("MIG_NODES = {")
    for node, gpus in sorted((nodes or {}).items()):
        lines.append(f'\t["{node}"] = {{ {", ".join(f"{chr(34)}{get_model(m).name}{chr(34)}" for m in gpus)} }},')
    lines.append("}")
    return "\n".join(lines)


def job_submit_lua(models: Iterable[GpuModel], nodes: Mapping[str, Sequence[str]] | None = None,
                   leaf_requests: bool = False, slots_file: str = "", slice_gres: str = "") -> str:  # fmt: skip
    """The generated job_submit.lua; ``slots_file``: where it reads mig-batchd's prompt slots ("": it takes none);
    ``slice_gres``: the GRES mig-batchd counts slices in (no job may ask for it)."""
    template = resource_path("plugins", "slurm", "job_submit.lua.in").read_text()
    text = template.replace("--@PROFILES@", profile_table(models, nodes, leaf_requests))
    text = text.replace("nil --@SLICE_GRES@", lua_string(slice_gres) + " --" if slice_gres else "nil --")
    return text.replace("nil --@SLOTS_FILE@", json.dumps(slots_file) if slots_file else "nil")


def node_slices(nodes: Mapping[str, Sequence[str]]) -> dict[str, int]:
    """Each node's MIG memory slices (8 per A100/H100, 4 per A30): its count of the slice GRES."""
    return {node: sum(get_model(m).memory_slices for m in models) for node, models in nodes.items()}


def slice_accounting_conf(nodes: Mapping[str, Sequence[str]], gres: str) -> tuple[str, str]:
    """(slurm.conf lines, gres.conf lines) that make Slurm count each MIG job's memory slices as ``gres``."""
    counts = node_slices(nodes)
    slurm = [
        f"# mig_batch slice accounting: mig-batchd sets gres:{gres}:<memory slices> on each MIG job it pins.",
        "# Merge into slurm.conf (GresTypes keeps the site's other types; the Gres= goes on each node's line).",
        f"GresTypes=mig,{gres}",
        f"AccountingStorageTRES=gres/{gres}  # needs slurmdbd; then sacct, fair-share and GrpTRES see it",
        "AccountingStorageEnforce=associations,limits,qos,safe  # so that GrpTRES=gres/... limits hold",
        *(f"# NodeName={node} ... Gres={gres}:{n}" for node, n in sorted(counts.items())),
    ]
    gres_lines = ["# mig_batch slice accounting: append to gres.conf (a count, no device file)"]
    gres_lines += [f"NodeName={node} Name={gres} Count={n}" for node, n in sorted(counts.items())]
    return "\n".join(slurm) + "\n", "\n".join(gres_lines) + "\n"


SUBMIT_MODULE = "mig-batch-submit.lua"  # mig_batch's submit logic, which job_submit.lua loads
INSTALLER = "mig-batch slurm install"
_LUA_MARK = 'local PREFIX = "mig-batch:"'  # in the submit logic (and in a job_submit.lua of a release before it)
_LOADER_COMMENT = "-- mig_batch's MIG jobs (docs/slurm.md, Install): keep this line after the site's own functions"


def lua_string(text: str) -> str:
    """``text`` as a Lua 5.1 string literal (every byte outside printable ASCII as a decimal escape)."""
    body = "".join(chr(b) if 0x20 <= b < 0x7F and chr(b) not in '"\\' else f"\\{b}" for b in os.fsencode(text))
    return f'"{body}"'


def loader_lines(module: Path) -> str:
    """The two lines a site's job_submit.lua ends with (before a final ``return``) to run mig_batch's rules."""
    return f"{_LOADER_COMMENT}\ndofile({lua_string(str(module))})\n"


def plain_job_submit(module: Path) -> str:
    """job_submit.lua for a site that has none: the two lines, and room for the site's own rules above them."""
    return ("-- job_submit.lua written by `mig-batch slurm install` for a site that had none. Slurm runs this file;\n"
            "-- a site rule goes above the two lines below, as function slurm_job_submit(job_desc, part_list,\n"
            "-- submit_uid) and slurm_job_modify(job_desc, job_rec, part_list, modify_uid): they run first, then\n"
            "-- mig_batch's (a job they refuse goes no further).\n\n"
            f"{loader_lines(module)}\nreturn slurm.SUCCESS\n")  # fmt: skip


def calls_module(text: str, module: Path) -> bool:
    """Whether a job_submit.lua loads the submit logic at ``module`` (the line :func:`loader_lines` writes)."""
    line = f"dofile({lua_string(str(module))})"
    return any(raw.strip() == line for raw in text.splitlines())


def with_loader(current: bytes | None, module: Path) -> bytes:
    """What job_submit.lua should hold: the site's file as it is when it loads ``module`` already; else the
    site's file with the two lines added at its end (before a final top-level ``return``, which Lua wants last);
    the plain file when there is none, or when it is a job_submit.lua of a release before the module (it
    holds mig_batch's rules itself: loaded again they would undo its tags)."""
    if current is None:
        return plain_job_submit(module).encode()
    text = current.decode("utf-8", errors="surrogateescape")
    if _LUA_MARK in text and "function slurm_job_submit" in text:
        return plain_job_submit(module).encode()
    if calls_module(text, module):
        return current
    lines = text.splitlines(keepends=True)
    if lines and not lines[-1].endswith("\n"):
        lines[-1] += "\n"
    at = len(lines)
    for n in range(len(lines) - 1, -1, -1):  # the last statement: a top-level return goes after the two lines
        stripped = lines[n].strip()
        if not stripped or stripped.startswith("--"):
            continue
        if re.match(r"return\b", lines[n]):
            at = n
        break
    added = ("\n" if at and lines[at - 1].strip() else "") + loader_lines(module)
    return "".join([*lines[:at], added, *(["\n"] if at < len(lines) else []), *lines[at:]]).encode(
        "utf-8", errors="surrogateescape")


_SITE_DEFINES = re.compile(r"^\s*(?:function\s+(slurm_job_submit|slurm_job_modify)\b"
                           r"|(slurm_job_submit|slurm_job_modify)\s*=[^=])")  # fmt: skip


def loader_misplaced(text: str) -> str:
    """Why a site's job_submit.lua would not run mig_batch's rules though it loads them ("" when it would):
    a site function defined after the ``dofile`` line replaces the one the module put in its place."""
    lines = text.splitlines()
    at = next((n for n, line in enumerate(lines) if re.fullmatch(r'\s*dofile\("[^"\\]*"\)\s*', line)
               and line.strip().endswith(f'/{SUBMIT_MODULE}")')), None)  # fmt: skip
    if at is None:
        return ""
    for n, line in enumerate(lines[at + 1:], start=at + 2):
        found = _SITE_DEFINES.match(line)
        if found:
            return (f"line {n} defines {found.group(1) or found.group(2)} after the line that loads "
                    f"{SUBMIT_MODULE} (line {at + 1}): mig_batch's rules never run; move the two lines below it")
    return ""


def submit_logic_of(job_submit: Path) -> Path | None:
    """The file holding mig_batch's rules for a job_submit.lua: itself (a release before the module, or `gen-lua`
    put in its place), the module its loader line names, or None."""
    try:
        text = job_submit.read_text(errors="replace")
    except OSError:
        return None
    if _LUA_MARK in text:
        return job_submit
    for line in text.splitlines():
        found = re.fullmatch(r'\s*dofile\("([^"\\]*)"\)\s*', line)
        if found and found.group(1).endswith("/" + SUBMIT_MODULE):
            return Path(found.group(1))
    return None


def install(dest: Path, python: str, config: str, job_dir: str, agent_socket: str, models: Iterable[GpuModel],
            nodes: Mapping[str, Sequence[str]] | None = None, slice_gres: str = "",
            leaf_requests: bool = False, hook_client_kind: str = "auto",
            slurm_bin: str = "", slots_file: str = "", *, force: bool = False,
            dry_run: bool = False, report: site_files.Report | None = None) -> tuple[list[Path], str]:  # fmt: skip
    """Install the hooks, mig_batch's submit logic (``mig-batch-submit.lua``), job_submit.lua and the Slurm API
    helper into ``dest``: (the files installed, which hook client the hooks are or run and why, and whether
    the helper was built). ``hook_client_kind``: ``direct`` (the compiled client is the hooks), ``c`` (shell
    shims run it), ``python`` (shims run the Python client), or ``auto``: ``direct`` when it compiles and
    ``dest`` is on this host's own disk, ``c`` when it is on a file system other nodes may share, else
    ``python``. A file of the site's is never replaced without ``force`` (:mod:`mig_batch.batch.site_files`);
    ``dry_run`` writes nothing and puts the diffs in ``report`` (filled in with what was done, when given)."""
    if hook_client_kind not in HOOK_KINDS:
        raise ValueError(f"unknown hook client {hook_client_kind!r}; accepted: {', '.join(HOOK_KINDS)}")
    with tempfile.TemporaryDirectory(prefix="mig-batch-install-") as staging_dir:
        staging = Path(staging_dir)
        wanted, which = _wanted(dest, staging, python, config, job_dir, agent_socket, models, nodes, slice_gres,
                                leaf_requests, hook_client_kind, slurm_bin, slots_file)  # fmt: skip
        done = site_files.install_files(dest, wanted, force=force, dry_run=dry_run, installer=INSTALLER)
    if report is not None:
        report.lines[:], report.diffs[:], report.paths[:] = done.lines, done.diffs, done.paths
    return done.paths, which


def uninstall(dest: Path, *, force: bool = False, dry_run: bool = False) -> site_files.Report:
    """Remove what `mig-batch slurm install` put into ``dest`` and put back the site's files it replaced."""
    report = site_files.uninstall_files(dest, force=force, dry_run=dry_run, installer=INSTALLER)
    job_submit = dest / "job_submit.lua"
    if not dry_run and job_submit.is_file() and calls_module(job_submit.read_text(errors="replace"),
                                                             dest / SUBMIT_MODULE):  # fmt: skip
        report.lines.append(f"note: {job_submit} (the site's own, left as it was) still loads {dest / SUBMIT_MODULE}, "
                            "which is gone: remove its two mig_batch lines and run `scontrol reconfigure`, or every "
                            "submission fails")  # fmt: skip
    return report


def _wanted(dest: Path, staging: Path, python: str, config: str, job_dir: str, agent_socket: str,
            models: Iterable[GpuModel], nodes: Mapping[str, Sequence[str]] | None, slice_gres: str,
            leaf_requests: bool, hook_client_kind: str, slurm_bin: str,
            slots_file: str) -> tuple[list[site_files.Wanted], str]:  # fmt: skip
    """Every file the install puts into ``dest``, built (the compiled ones) in ``staging``; and the hook
    client's note."""
    wanted: list[site_files.Wanted] = []
    paths = {"socket": agent_socket, "config": config, "python": python, "job_dir": job_dir}
    built, why = (None, "asked for the Python client") if hook_client_kind == "python" else \
        build_hook_client(staging, paths=paths)  # fmt: skip
    if built is None and hook_client_kind in ("c", "direct"):
        raise ValueError(f"cannot build the C hook client: {why}; give --hook-client python or install a C compiler")
    fs = file_system_type(dest if dest.exists() else dest.parent)
    shared = shared_file_system(fs)
    direct = built is not None and (hook_client_kind == "direct" or (hook_client_kind == "auto" and not shared))
    python_hook = f"{python} -I -S {Path(hook_client.__file__).resolve()}"
    binary = dest / HOOK_BINARY
    if direct:
        hook, which = str(binary), f"hook client: {binary} (C), installed as the Prolog, Epilog and TaskProlog"
        if shared:  # asked for: every node that runs these hooks must be able to run this binary
            which += f"; {dest} is on {fs}: on a node that cannot run it every job start fails"
    elif built is not None:
        hook = str(binary)
        which = f"hook client: {binary} (C, run by shell shims: the Python one where it cannot run" + \
                (f"; {dest} is on {fs}, which other nodes may share)" if shared else ")")
    else:
        hook = python_hook
        which = f"hook client: the Python one ({why}); each Prolog and Epilog starts an interpreter (~10 ms)"
    if built is not None:
        wanted.append(site_files.Wanted(HOOK_BINARY, _read_built(built), 0o755, binary=True))
    values = {"@PYTHON@": python, "@CONFIG@": config, "@JOB_DIR@": job_dir, "@SOCKET@": agent_socket,
              "@HOOK@": hook, "@PY_HOOK@": python_hook}  # fmt: skip
    for name in SHIMS:
        if direct and name in DIRECT_HOOKS:  # by name: the binary sees which hook it is
            wanted.append(site_files.Wanted(name, link=HOOK_BINARY, mode=0o777))
            continue
        text = resource_path("wrappers", f"{name}.in").read_text()
        for key, value in values.items():
            text = text.replace(key, value)
        wanted.append(site_files.Wanted(name, text.encode(), 0o755))
    module = dest / SUBMIT_MODULE
    submit_rules = job_submit_lua(models, nodes, leaf_requests, slots_file, slice_gres)
    wanted.append(site_files.Wanted(SUBMIT_MODULE, submit_rules.encode()))
    wanted.append(site_files.Wanted("job_submit.lua", for_current=functools.partial(with_loader, module=module)))
    library, why_not = build_slurm_library(staging, slurm_bin=slurm_bin)
    if library is not None:
        wanted.append(site_files.Wanted(SLURM_LIBRARY, _read_built(library), 0o755, binary=True))
        which += (f"\nSlurm API helper: {dest / SLURM_LIBRARY}; set `slurm_library: {dest / SLURM_LIBRARY}` in the "
                  "site config (on every host that runs mig-batchd or the node agent) for per-job Slurm calls "
                  "without a process")  # fmt: skip
    else:
        which += f"\nSlurm API helper not built ({why_not}); mig_batch uses Slurm's commands"
    if slice_gres and nodes:  # lines to merge by hand: they touch the site's own NodeName lines
        for name, text in zip(("slurm.conf.mig-batch", "gres.conf.mig-batch"),
                              slice_accounting_conf(nodes, slice_gres), strict=True):  # fmt: skip
            wanted.append(site_files.Wanted(name, text.encode()))
    return wanted, which


def _read_built(path: Path) -> bytes:
    return path.read_bytes()
