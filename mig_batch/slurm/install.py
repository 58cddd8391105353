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
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path

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

    lines = [f"MIG_LEAF_REQUESTS = {'true' if leaf_requests else 'false'}", "MIG_MODELS = {"]
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
                   leaf_requests: bool = False, slots_file: str = "") -> str:  # fmt: skip
    """The generated job_submit.lua; ``slots_file``: where it reads mig-batchd's prompt slots ("": it takes none)."""
    template = resource_path("plugins", "slurm", "job_submit.lua.in").read_text()
    text = template.replace("--@PROFILES@", profile_table(models, nodes, leaf_requests))
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


def install(dest: Path, python: str, config: str, job_dir: str, agent_socket: str, models: Iterable[GpuModel],
            nodes: Mapping[str, Sequence[str]] | None = None, slice_gres: str = "",
            leaf_requests: bool = False, hook_client_kind: str = "auto",
            slurm_bin: str = "", slots_file: str = "") -> tuple[list[Path], str]:  # fmt: skip
    """Write the hooks, job_submit.lua and the Slurm API helper into ``dest``: (the files written, which hook
    client the hooks are or run and why, and whether the helper was built). ``hook_client_kind``: ``direct``
    (the compiled client is the hooks), ``c`` (shell shims run it), ``python`` (shims run the Python
    client), or ``auto``: ``direct`` when it compiles and ``dest`` is on this host's own disk, ``c`` when it
    is on a file system other nodes may share, else ``python``."""
    if hook_client_kind not in HOOK_KINDS:
        raise ValueError(f"unknown hook client {hook_client_kind!r}; accepted: {', '.join(HOOK_KINDS)}")
    dest.mkdir(parents=True, exist_ok=True)
    written = []
    paths = {"socket": agent_socket, "config": config, "python": python, "job_dir": job_dir}
    binary, why = (None, "asked for the Python client") if hook_client_kind == "python" else \
        build_hook_client(dest, paths=paths)  # fmt: skip
    if binary is None and hook_client_kind in ("c", "direct"):
        raise ValueError(f"cannot build the C hook client: {why}; give --hook-client python or install a C compiler")
    fs = file_system_type(dest)
    shared = shared_file_system(fs)
    direct = binary is not None and (hook_client_kind == "direct" or (hook_client_kind == "auto" and not shared))
    python_hook = f"{python} -I -S {Path(hook_client.__file__).resolve()}"
    if direct:
        hook, which = str(binary), f"hook client: {binary} (C), installed as the Prolog, Epilog and TaskProlog"
        if shared:  # asked for: every node that runs these hooks must be able to run this binary
            which += f"; {dest} is on {fs}: on a node that cannot run it every job start fails"
    elif binary is not None:
        hook = str(binary)
        which = f"hook client: {binary} (C, run by shell shims: the Python one where it cannot run" + \
                (f"; {dest} is on {fs}, which other nodes may share)" if shared else ")")
    else:
        hook = python_hook
        which = f"hook client: the Python one ({why}); each Prolog and Epilog starts an interpreter (~10 ms)"
    written += [binary] if binary is not None else []
    values = {"@PYTHON@": python, "@CONFIG@": config, "@JOB_DIR@": job_dir, "@SOCKET@": agent_socket,
              "@HOOK@": hook, "@PY_HOOK@": python_hook}  # fmt: skip
    for name in SHIMS:
        path = dest / name
        if direct and name in DIRECT_HOOKS:
            _replace_with(path, lambda tmp: tmp.symlink_to(HOOK_BINARY))  # by name: the binary sees which hook
        else:
            text = resource_path("wrappers", f"{name}.in").read_text()
            for key, value in values.items():
                text = text.replace(key, value)
            _replace_with(path, functools.partial(_write_script, text=text))
        written.append(path)
    path = dest / "job_submit.lua"
    path.write_text(job_submit_lua(models, nodes, leaf_requests, slots_file))
    written.append(path)
    library, why_not = build_slurm_library(dest, slurm_bin=slurm_bin)
    if library is not None:
        written.append(library)
        which += (f"\nSlurm API helper: {library}; set `slurm_library: {library}` in the site config (on every "
                  "host that runs mig-batchd or the node agent) for per-job Slurm calls without a process")
    else:
        which += f"\nSlurm API helper not built ({why_not}); mig_batch uses Slurm's commands"
    if slice_gres and nodes:  # lines to merge by hand: they touch the site's own NodeName lines
        for name, text in zip(("slurm.conf.mig-batch", "gres.conf.mig-batch"),
                              slice_accounting_conf(nodes, slice_gres), strict=True):  # fmt: skip
            (dest / name).write_text(text)
            written.append(dest / name)
    return written, which


def _write_script(path: Path, text: str) -> None:
    path.write_text(text)
    path.chmod(0o755)


def _replace_with(path: Path, make: Callable[[Path], object]) -> None:
    """Make ``path`` anew beside it and move it in place: a hook starting meanwhile runs the old one or the new
    one, whole, and a link there (an earlier direct install) is replaced, not written through."""
    tmp = path.with_name(f".{path.name}.new")
    tmp.unlink(missing_ok=True)
    make(tmp)
    os.replace(tmp, path)
