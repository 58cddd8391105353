"""Installing files into a site's own folder (``mig-batch slurm install``, ``mig-batch htcondor install``) the
way dpkg treats a conffile: nothing the site has is replaced unasked, what it had is kept, and an uninstall
puts it back byte for byte.

- A file whose name is free is written. A file there that this install wrote before and that nobody has
  changed since (its sha256 is the one in the manifest) is replaced. A file there that is the same as the
  new one is left alone. Any other file there is the site's: the install refuses (:class:`SiteFileConflict`,
  exit 2) unless ``force``, and then keeps it beside under ``NAME.mig-batch-old~`` (a hard link made before
  the new file is renamed over the name: the name is never missing, and the kept file is the same inode,
  mode, owner and time). The ``~`` ends the name so that HTCondor's config.d, which reads every file but
  those its LOCAL_CONFIG_DIR_EXCLUDE_REGEXP names (``~`` ends one of them), never reads a kept file.
- ``dry_run`` writes nothing and gives a unified diff of every file against what is there.
- The manifest (``.mig-batch-manifest.json`` in the folder, a dot file: HTCondor skips it too) records each
  file: its sha256 (or its link target), its mode, and what was there before (nothing, the same file, or
  the site's file and the name it is kept under). A reinstall keeps the first install's "before".
- :func:`uninstall` removes what the install wrote and renames each kept file back; a file of ours that
  was changed since is not removed without ``force`` (then it is kept as ``NAME.mig-batch-changed~``).

Symlinks are never followed: a name is read with ``lstat``/``readlink`` or opened ``O_NOFOLLOW``, and files
are written through :func:`mig_batch.safe_files.write_file` (a fresh file renamed over the name).
"""

from __future__ import annotations

import datetime
import difflib
import hashlib
import json
import os
import stat
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mig_batch.errors import MigBatchError
from mig_batch.safe_files import write_file

MANIFEST = ".mig-batch-manifest.json"
KEPT_SUFFIX = ".mig-batch-old~"  # the site's file this install replaced (with --force)
CHANGED_SUFFIX = ".mig-batch-changed~"  # a file of ours changed after the install, set aside by uninstall --force
MANIFEST_FORMAT = 1
MAX_MANIFEST_BYTES = 1 << 20
MAX_DIFF_BYTES = 4 << 20  # a larger file there is compared by its sha256 only


class SiteFileConflict(MigBatchError, ValueError):
    """A file of the site's stands where the install would write (or an uninstall would remove) one."""


@dataclass(frozen=True)
class Wanted:
    """One file the install puts at ``name`` in the folder: ``data`` with ``mode``, or a symlink to ``link``.
    ``for_current``: the data as a function of what is there (bytes, or None when nothing is), for a file
    the install adds to rather than replaces (the site's job_submit.lua)."""

    name: str
    data: bytes = b""
    mode: int = 0o644
    link: str | None = None
    binary: bool = False
    for_current: Callable[[bytes | None], bytes] | None = None


@dataclass(frozen=True)
class Present:
    """What is at a name now: ``kind`` missing, file, link or other (a directory, a socket, ...)."""

    kind: str
    data: bytes | None = None
    link: str | None = None
    sha256: str = ""
    mode: int = 0


@dataclass
class Report:
    """What an install or uninstall did (or, dry, would do): one line per file, and the diffs."""

    lines: list[str] = field(default_factory=list)
    diffs: list[str] = field(default_factory=list)
    paths: list[Path] = field(default_factory=list)  # the files installed (written or already as wanted)


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def present(path: Path) -> Present:
    """What is at ``path``, never following a symlink."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return Present("missing")
    if stat.S_ISLNK(st.st_mode):
        return Present("link", link=os.readlink(path))
    if not stat.S_ISREG(st.st_mode):
        return Present("other", mode=stat.S_IMODE(st.st_mode))
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    with os.fdopen(fd, "rb") as f:
        data = f.read()
    return Present("file", data=data, sha256=sha256(data), mode=stat.S_IMODE(st.st_mode))


def _same(now: Present, data: bytes | None, link: str | None) -> bool:
    if link is not None:
        return now.kind == "link" and now.link == link
    return now.kind == "file" and now.data == data


def _matches_record(now: Present, record: dict[str, Any]) -> bool:
    """Whether the file at a name is still the one the manifest says the install wrote there."""
    if record.get("link") is not None:
        return now.kind == "link" and now.link == record["link"]
    return now.kind == "file" and now.sha256 == record.get("sha256")


def read_manifest(dest: Path) -> dict[str, Any] | None:
    """The folder's manifest (None when it has none); a file there that is no manifest is refused (exit 2)."""
    path = dest / MANIFEST
    now = present(path)
    if now.kind == "missing":
        return None
    if now.kind != "file" or now.data is None or len(now.data) > MAX_MANIFEST_BYTES:
        raise SiteFileConflict(f"{path} is not a mig_batch install manifest (a plain JSON file under 1 MiB); move it "
                               "away and install again")  # fmt: skip
    try:
        manifest = json.loads(now.data.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise SiteFileConflict(f"{path} is not a mig_batch install manifest ({type(exc).__name__}: not JSON text); "
                               "move it away and install again") from None  # fmt: skip
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT or \
            not isinstance(manifest.get("files"), dict):  # fmt: skip
        raise SiteFileConflict(f"{path} is not a mig_batch install manifest of format {MANIFEST_FORMAT} (an object "
                               "with format and files); move it away and install again")  # fmt: skip
    return manifest


def _kept_name(dest: Path, name: str, suffix: str) -> str:
    """A free name beside ``name`` for the file set aside: ``NAME<suffix>``, else ``NAME.N<suffix>``."""
    base = suffix[:-1] if suffix.endswith("~") else suffix
    for n in range(1000):
        kept = f"{name}{suffix}" if n == 0 else f"{name}{base}.{n}~"
        if present(dest / kept).kind == "missing":
            return kept
    raise SiteFileConflict(f"{dest}: no free name to keep {name} under ({name}{suffix} .. .999 are taken)")


def _diff(name: str, now: Present, data: bytes | None, link: str | None, binary: bool) -> str:
    """A unified diff of what is at ``name`` (a/) against what the install writes (b/)."""
    def show(kind: str, body: bytes | None, target: str | None) -> tuple[list[str], bool]:
        if kind == "link":
            return [f"symbolic link -> {target}\n"], False
        if kind == "missing":
            return [], False
        if body is None or binary or b"\0" in body[:8192] or len(body) > MAX_DIFF_BYTES:
            return [f"binary file, {len(body or b'')} bytes, sha256 {sha256(body or b'')}\n"], True
        try:
            return body.decode().splitlines(keepends=True), False
        except UnicodeDecodeError:
            return [f"binary file, {len(body)} bytes, sha256 {sha256(body)}\n"], True

    old, _ = show(now.kind, now.data, now.link) if now.kind != "other" else ([f"not a file (mode {now.mode:o})\n"],
                                                                              True)  # fmt: skip
    new, _ = show("link" if link is not None else "file", data, link)
    text = "".join(difflib.unified_diff(old, new, f"a/{name}" if now.kind != "missing" else "/dev/null",
                                        f"b/{name}"))  # fmt: skip
    return text if text.endswith("\n") or not text else text + "\n\\ No newline at end of file\n"


def install_files(dest: Path, wanted: Sequence[Wanted], *, force: bool = False, dry_run: bool = False,
                  installer: str = "mig-batch install") -> Report:  # fmt: skip
    """Put ``wanted`` into ``dest`` as the module's text says; raise :class:`SiteFileConflict` (nothing
    written) when a site's file stands in the way and ``force`` is not given."""
    from mig_batch import version

    dest = Path(dest)
    manifest = read_manifest(dest) if dest.is_dir() else None
    old = dict(manifest["files"]) if manifest else {}
    created = bool(manifest.get("created_dest", False)) if manifest else not dest.exists()
    report: Report = Report()
    records: dict[str, dict[str, Any]] = {}
    conflicts: list[str] = []
    plan: list[tuple[Wanted, Present, bytes, str]] = []  # (file, what is there, its data, what to do)
    for want in wanted:
        now = present(dest / want.name)
        data = want.for_current(now.data if now.kind == "file" else None) if want.for_current else want.data
        record = old.get(want.name)
        ours = record is not None and record.get("written", True) and _matches_record(now, record)
        if now.kind == "other":
            raise SiteFileConflict(f"{dest / want.name} is not a file (mode {now.mode:o}); move it away, then install "
                                   "again (--force does not replace a directory or a device)")  # fmt: skip
        if _same(now, data, want.link) and not (ours and want.link is None and now.mode != want.mode):
            action = "same"  # the site's file with other permissions stays as it is; ours gets its mode back
        elif now.kind == "missing":
            action = "new"
        elif ours:
            action = "ours"
        else:
            action = "site"
            conflicts.append(want.name)
        plan.append((want, now, data, action))
        if dry_run and action != "same":
            report.diffs.append(_diff(want.name, now, data, want.link, want.binary))
    if conflicts and not force and not dry_run:
        names = ", ".join(str(dest / n) for n in conflicts)
        raise SiteFileConflict(
            f"{names}: the site's own file (not one this install wrote) differs from what `{installer}` writes; "
            f"nothing was written. Give --dry-run to see the differences, or --force to replace it and keep the "
            f"site's file beside it as {', '.join(_kept_name(dest, n, KEPT_SUFFIX) for n in conflicts)} "
            "(`uninstall` puts it back)")  # fmt: skip
    gone: set[str] = set()
    try:
        for want, now, data, action in plan:
            path = dest / want.name
            record = dict(old.get(want.name) or {})
            before = record.get("before") if record else None
            if action == "same":
                verb = "unchanged"
                if not record:  # the site's own file, already what we would write: it stays the site's
                    record = {"written": False, "before": {"sha256": now.sha256, "link": now.link, "kept": None}}
            elif action == "new":
                verb = "would write" if dry_run else "wrote"
                record = {"before": before if record.get("written", True) else None}
            elif action == "ours":
                verb = "would replace" if dry_run else "replaced"
                record = {"before": before}
            else:
                kept = _kept_name(dest, want.name, KEPT_SUFFIX)
                verb = ("would replace (the site's own file: needs --force, which keeps it as "
                        f"{kept})" if dry_run and not force
                        else f"would replace (the site's own file, kept as {kept})" if dry_run
                        else f"replaced (the site's own file, kept as {dest / kept})")  # fmt: skip
                if not dry_run:
                    os.link(path, dest / kept, follow_symlinks=False)  # the same inode: byte for byte, mode, owner
                changed_ours = record and record.get("written", True)  # ours once, changed since: keep the first before
                record = {"before": before if changed_ours else {"sha256": now.sha256, "link": now.link, "kept": kept}}
                if changed_ours:
                    record["changed_kept"] = kept
            if action != "same" and not dry_run:
                _put(path, data, want.mode, want.link)
            if action != "same" or record.get("written", True):
                record.setdefault("written", True)
            record.update({"sha256": sha256(data) if want.link is None else "", "link": want.link,
                           "mode": f"{want.mode:04o}"})  # fmt: skip
            records[want.name] = record
            word, _, note = verb.partition(" (")
            report.lines.append(f"{word} {path}" + (f" ({note}" if note else ""))
            report.paths.append(path)
        for name, record in old.items():  # what an earlier install wrote and this one does not
            if name in records:
                continue
            if record.get("written", True) and present(dest / name).kind != "missing" and \
                    not _matches_record(present(dest / name), record):  # fmt: skip
                report.lines.append(f"left {dest / name}: no longer installed, but changed after an earlier "
                                    "install wrote it (`uninstall --force` sets it aside)")  # fmt: skip
                records[name] = record
                continue
            report.lines.extend(_remove_one(dest, name, record, force=False, dry_run=dry_run).lines)
            gone.add(name)
    finally:  # what was done is recorded, also when a write failed half way (a full disk): never a file unowned
        if not dry_run:
            unfinished = {name: record for name, record in old.items() if name not in records and name not in gone}
            if dest.is_dir() or records:
                dest.mkdir(parents=True, exist_ok=True)
                write_file(dest / MANIFEST, json.dumps({
                    "format": MANIFEST_FORMAT, "installer": installer, "version": version(),
                    "written_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                    "files": {**unfinished, **records}, "created_dest": created,
                }, indent=1, sort_keys=True) + "\n", 0o644)  # fmt: skip
    if not dry_run:
        report.lines.append(f"recorded the install in {dest / MANIFEST}")
    return report


def _put(path: Path, data: bytes, mode: int, link: str | None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if link is None:
        write_file(path, data, mode)
        return
    tmp = path.with_name(f".{path.name}.new")
    tmp.unlink(missing_ok=True)
    tmp.symlink_to(link)
    os.replace(tmp, path)  # a link there is replaced, never written through


def _remove_one(dest: Path, name: str, record: dict[str, Any], *, force: bool, dry_run: bool) -> Report:
    """Undo one manifest entry: remove the file the install wrote and put back what was there."""
    report, path = Report(), dest / name
    before = record.get("before") or None
    now = present(path)
    if not record.get("written", True):
        report.lines.append(f"left {path} as it was (the site's own file)")
        return report
    kept = before.get("kept") if before else None
    if now.kind != "missing" and not _matches_record(now, record):
        if not force:
            raise SiteFileConflict(f"{path} was changed after `install` wrote it; nothing was removed. Move it away "
                                   f"or give --force (it is then kept as {name}{CHANGED_SUFFIX})")  # fmt: skip
        aside = _kept_name(dest, name, CHANGED_SUFFIX)
        if not dry_run:
            os.link(path, dest / aside, follow_symlinks=False)
        report.lines.append(f"{'would keep' if dry_run else 'kept'} the changed {path} as {dest / aside}")
    if kept:
        source = dest / kept
        if present(source).kind == "missing":
            raise SiteFileConflict(f"{source} (the site's {name} before the install) is gone; put it back or move the "
                                   f"manifest {dest / MANIFEST} away")  # fmt: skip
        if not dry_run:
            os.replace(source, path)  # renamed back: the same inode, byte for byte
        report.lines.append(f"{'would put back' if dry_run else 'put back'} the site's {path} (from {kept})")
    elif now.kind != "missing":
        if not dry_run:
            path.unlink()
        report.lines.append(f"{'would remove' if dry_run else 'removed'} {path}")
    if record.get("changed_kept") and present(dest / record["changed_kept"]).kind != "missing":
        report.lines.append(f"note: {dest / record['changed_kept']} holds a version changed after an earlier install")
    return report


def uninstall_files(dest: Path, *, force: bool = False, dry_run: bool = False,
                    installer: str = "mig-batch install") -> Report:  # fmt: skip
    """Remove what the install recorded in ``dest``'s manifest and put back what the site had there."""
    dest = Path(dest)
    manifest = read_manifest(dest) if dest.is_dir() else None
    if manifest is None:
        raise SiteFileConflict(f"{dest / MANIFEST} does not exist: `{installer}` recorded no install in {dest} (give "
                               "the folder that was installed into; an install by a release before the manifest "
                               "is removed by hand)")  # fmt: skip
    files: dict[str, dict[str, Any]] = manifest["files"]
    for name, record in files.items():  # refuse before touching anything
        now = present(dest / name)
        if record.get("written", True) and now.kind != "missing" and not _matches_record(now, record) and not force:
            raise SiteFileConflict(f"{dest / name} was changed after `install` wrote it; nothing was removed. Move "
                                   f"it away or give --force (it is then kept as {name}{CHANGED_SUFFIX})")  # fmt: skip
    report = Report()
    for name, record in files.items():
        report.lines.extend(_remove_one(dest, name, record, force=force, dry_run=dry_run).lines)
    if not dry_run:
        (dest / MANIFEST).unlink()
        report.lines.append(f"removed {dest / MANIFEST}")
        if manifest.get("created_dest") and not any(dest.iterdir()):
            dest.rmdir()  # the install made the folder: gone again, as it was
            report.lines.append(f"removed {dest} (the install had made it)")
    return report
