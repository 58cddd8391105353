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
are written through :func:`mig_batch.safe_files.write_file` (a fresh file renamed over the name). A file the
install adds to (``for_current``: the site's job_submit.lua) is rewritten with the site's mode, owner and group;
when it is a symlink the install refuses, even with ``force``, unless the file it points at already holds what
would be added (it is then the site's, left as it is).

The folder and its manifest are trusted only as far as no other user can write them: the folder must pass
:func:`mig_batch.safe_files.untrusted_dir` and the manifest be owned by this process's user and not writable
by group or others; every name in the manifest must be one name in the folder, and a kept name one the install
writes (``NAME.mig-batch-old~``, ``NAME.mig-batch-old.N~``, or ``-changed``). Anything else is refused before
a file is touched. An uninstall drops each entry from the manifest as soon as it is undone, and checks first
that every kept file is there: one stopped half way is finished by running it again.
"""

from __future__ import annotations

import contextlib
import datetime
import difflib
import hashlib
import json
import os
import re
import stat
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from mig_batch.errors import MigBatchError
from mig_batch.safe_files import untrusted_dir, write_file

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
    the install adds to rather than replaces (the site's job_submit.lua): rewritten with the mode and owner
    of the site's file; ``for_current(b"")`` is what it adds (told to the site when the name is a symlink)."""

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
    uid: int = -1
    gid: int = -1


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
    return Present("file", data=data, sha256=sha256(data), mode=stat.S_IMODE(st.st_mode), uid=st.st_uid,
                   gid=st.st_gid)  # fmt: skip


def _same(now: Present, data: bytes | None, link: str | None) -> bool:
    if link is not None:
        return now.kind == "link" and now.link == link
    return now.kind == "file" and now.data == data


def _matches_record(now: Present, record: dict[str, Any]) -> bool:
    """Whether the file at a name is still the one the manifest says the install wrote there."""
    if record.get("link") is not None:
        return now.kind == "link" and now.link == record["link"]
    return now.kind == "file" and now.sha256 == record.get("sha256")


def _not_manifest(path: Path, why: str) -> SiteFileConflict:
    return SiteFileConflict(f"{path} is not a mig_batch install manifest ({why}); move it away and install again")


def read_manifest(dest: Path) -> dict[str, Any] | None:
    """The folder's manifest (None when it has none); a file there that is no manifest, one another user
    could have written, or one naming a file outside the folder is refused (exit 2)."""
    path = dest / MANIFEST
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise _not_manifest(path, f"a plain JSON file under 1 MiB; {exc.strerror or exc}") from None
    with os.fdopen(fd, "rb") as f:
        st = os.fstat(f.fileno())
        if not stat.S_ISREG(st.st_mode) or st.st_size > MAX_MANIFEST_BYTES:
            raise _not_manifest(path, "a plain JSON file under 1 MiB")
        me = os.geteuid()
        if st.st_uid != me:
            raise SiteFileConflict(f"{path} is owned by uid {st.st_uid}, not by uid {me} that installs: another user "
                                   "may have written it; nothing was done. Check it, then chown it (or move it away "
                                   "and install again)")  # fmt: skip
        if st.st_mode & 0o022:
            raise SiteFileConflict(f"{path} is writable by group or others (mode {stat.S_IMODE(st.st_mode):04o}): "
                                   "another user may have written it; nothing was done. Check it, then chmod "
                                   "go-w it (or move it away and install again)")  # fmt: skip
        data = f.read(MAX_MANIFEST_BYTES + 1)
    if len(data) > MAX_MANIFEST_BYTES:
        raise _not_manifest(path, "a plain JSON file under 1 MiB")
    try:
        manifest = json.loads(data.decode())
    except (UnicodeDecodeError, ValueError) as exc:
        raise _not_manifest(path, f"{type(exc).__name__}: not JSON text") from None
    if not isinstance(manifest, dict) or manifest.get("format") != MANIFEST_FORMAT or \
            not isinstance(manifest.get("files"), dict):  # fmt: skip
        raise _not_manifest(path, f"of format {MANIFEST_FORMAT}, an object with format and files")
    for name, record in manifest["files"].items():
        _check_entry(path, name, record)
    return manifest


def one_name(name: object) -> bool:
    """Whether ``name`` is one name in the folder (no ``/``, not ``.``, ``..`` or the manifest's)."""
    return isinstance(name, str) and name not in ("", ".", "..", MANIFEST) and "/" not in name and "\0" not in name \
        and name == Path(name).name  # fmt: skip


def kept_name_of(name: str, kept: object) -> bool:
    """Whether ``kept`` is a name the install (or uninstall) keeps a file at ``name`` under."""
    pattern = re.escape(name) + r"\.mig-batch-(?:old|changed)(?:\.[1-9][0-9]{0,2})?~"
    return isinstance(kept, str) and re.fullmatch(pattern, kept) is not None


def _check_entry(path: Path, name: object, record: object) -> None:
    """Refuse a manifest entry the install could not have written: a name outside the folder, a kept name
    not of the install's pattern, fields of the wrong type."""
    if not one_name(name):
        raise _not_manifest(path, f"its entry {name!r} is not a name in the folder")
    assert isinstance(name, str)
    before = record.get("before") if isinstance(record, dict) else None
    fields = {"written": bool, "sha256": str, "link": str, "changed_kept": str}  # each may be missing, or null
    if not isinstance(record, dict) or not isinstance(before, dict | None) or \
            not all(isinstance(record.get(k), kind | None) for k, kind in fields.items()) or \
            not all(isinstance((before or {}).get(k), str | None) for k in ("sha256", "link", "kept")):  # fmt: skip
        raise _not_manifest(path, f"its entry {name!r} is not a record of a file")
    for kept in ((before or {}).get("kept"), record.get("changed_kept")):
        if kept is not None and not kept_name_of(name, kept):
            raise _not_manifest(path, f"{kept!r}, kept for {name!r}, is not a name the install keeps a file "
                                      f"under ({name}{KEPT_SUFFIX})")  # fmt: skip


def check_folder(dest: Path) -> None:
    """Refuse (exit 2) a folder another user could write to (or one above it: :func:`untrusted_dir`); for one
    not made yet, the folder it would be made in."""
    at = Path(os.path.abspath(dest))
    while not os.path.lexists(at) and at != at.parent:
        at = at.parent
    why = untrusted_dir(at)
    if why:
        raise SiteFileConflict(f"{dest}: {why}; another user could forge what the install records or keeps there, "
                               "so nothing was done (install into a folder only root can write to)")  # fmt: skip


def _linked_site_file(path: Path, want: Wanted, link: str) -> bytes:
    """The bytes of the file a symlink at a name the install adds to points at, when it already holds what
    the install would add (it then stays the site's as it is); else refused, saying what to add by hand."""
    assert want.for_current is not None
    data = None
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)  # followed to read it only: never written
    except OSError:
        fd = -1
    if fd >= 0:
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if stat.S_ISREG(st.st_mode) and st.st_size <= MAX_DIFF_BYTES:
                data = f.read(MAX_DIFF_BYTES + 1)
    if data is not None and want.for_current(data) == data:
        return data
    lines = want.for_current(b"").decode(errors="replace")
    raise SiteFileConflict(f"{path} is a symbolic link to {link}: the install adds lines to the site's file and "
                           "neither writes through a link nor (even with --force) replaces it with a file of its "
                           f"own, which would drop the site's rules; nothing was written. Add these lines by hand "
                           f"to the file it points at ({os.path.realpath(path)}), at its end (before a final "
                           f"`return`), then install again:\n{lines}")  # fmt: skip


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
    check_folder(dest)
    manifest = read_manifest(dest) if dest.is_dir() else None
    old = dict(manifest["files"]) if manifest else {}
    created = bool(manifest.get("created_dest", False)) if manifest else not dest.exists()
    report: Report = Report()
    records: dict[str, dict[str, Any]] = {}
    conflicts: list[str] = []
    # (file, what is there, its data, its mode, its owner (None: this process's), what to do)
    plan: list[tuple[Wanted, Present, bytes, int, tuple[int, int] | None, str]] = []
    for want in wanted:
        now = present(dest / want.name)
        if now.kind == "other":
            raise SiteFileConflict(f"{dest / want.name} is not a file (mode {now.mode:o}); move it away, then install "
                                   "again (--force does not replace a directory or a device)")  # fmt: skip
        record = old.get(want.name)
        ours = record is not None and record.get("written", True) and _matches_record(now, record)
        mode, owner = want.mode, None
        if want.for_current is not None and now.kind == "file":  # the site's file, added to: its mode and owner
            mode, owner = now.mode, (now.uid, now.gid)
        linked = want.for_current is not None and now.kind == "link"  # the site's link: left as it is, or refused
        if linked:
            data = _linked_site_file(dest / want.name, want, now.link or "")
        elif want.for_current is not None:
            data = want.for_current(now.data if now.kind == "file" else None)
        else:
            data = want.data
        if linked or (_same(now, data, want.link) and not (ours and want.link is None and now.mode != mode)):
            action = "same"  # the site's file with other permissions stays as it is; ours gets its mode back
        elif now.kind == "missing":
            action = "new"
        elif ours:
            action = "ours"
        else:
            action = "site"
            conflicts.append(want.name)
        plan.append((want, now, data, mode, owner, action))
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
        for want, now, data, mode, owner, action in plan:
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
                _put(path, data, mode, want.link, owner)
            if action != "same" or record.get("written", True):
                record.setdefault("written", True)
            record.update({"sha256": sha256(data) if want.link is None else "", "link": want.link,
                           "mode": f"{mode:04o}"})  # fmt: skip
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


def _put(path: Path, data: bytes, mode: int, link: str | None, owner: tuple[int, int] | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    if link is None and owner is None:
        write_file(path, data, mode)
        return
    if link is None and owner is not None:  # as write_file, the owner and group set on the new file before its mode
        fd, fresh = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(data)
                os.fchown(f.fileno(), *owner)
                os.fchmod(f.fileno(), mode)
            os.replace(fresh, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(fresh)
            raise
        return
    assert link is not None
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
    if kept and _restored(dest, name, record):
        report.lines.append(f"left {path}: the site's file is back already (an uninstall stopped after putting it "
                            "back)")  # fmt: skip
        return report
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


def _restored(dest: Path, name: str, record: dict[str, Any]) -> bool:
    """Whether an entry's kept file was renamed back already (by an uninstall stopped before it recorded so):
    the kept name is free and the name holds the site's file as the install found it."""
    before = record.get("before") or {}
    if not before.get("kept") or present(dest / before["kept"]).kind != "missing":
        return False
    now = present(dest / name)
    if before.get("link") is not None:
        return now.kind == "link" and now.link == before["link"]
    return now.kind == "file" and bool(before.get("sha256")) and now.sha256 == before["sha256"]


def uninstall_files(dest: Path, *, force: bool = False, dry_run: bool = False,
                    installer: str = "mig-batch install") -> Report:  # fmt: skip
    """Remove what the install recorded in ``dest``'s manifest and put back what the site had there; each entry
    undone is dropped from the manifest at once (an uninstall stopped half way is finished by the next)."""
    dest = Path(dest)
    check_folder(dest)
    manifest = read_manifest(dest) if dest.is_dir() else None
    if manifest is None:
        raise SiteFileConflict(f"{dest / MANIFEST} does not exist: `{installer}` recorded no install in {dest} (give "
                               "the folder that was installed into; an install by a release before the manifest "
                               "is removed by hand)")  # fmt: skip
    files: dict[str, dict[str, Any]] = manifest["files"]
    gone: list[str] = []
    for name, record in files.items():  # refuse before touching anything
        if not record.get("written", True):
            continue
        kept = (record.get("before") or {}).get("kept")
        if kept and present(dest / kept).kind == "missing":
            if not _restored(dest, name, record):
                gone.append(f"{dest / kept} (the site's {name})")
            continue
        now = present(dest / name)
        if now.kind != "missing" and not _matches_record(now, record) and not force:
            raise SiteFileConflict(f"{dest / name} was changed after `install` wrote it; nothing was removed. Move "
                                   f"it away or give --force (it is then kept as {name}{CHANGED_SUFFIX})")  # fmt: skip
    if gone:
        raise SiteFileConflict(f"{', '.join(gone)}: the site's file{'s' if len(gone) > 1 else ''} before the install "
                               f"{'are' if len(gone) > 1 else 'is'} gone; nothing was removed. Put "
                               f"{'them' if len(gone) > 1 else 'it'} back, or move the manifest {dest / MANIFEST} away "
                               "and remove mig_batch's files by hand")  # fmt: skip
    report, left = Report(), dict(files)
    for name, record in files.items():
        report.lines.extend(_remove_one(dest, name, record, force=force, dry_run=dry_run).lines)
        del left[name]
        if not dry_run and left:  # what is still to undo, as a rerun will read it
            write_file(dest / MANIFEST, json.dumps({**manifest, "files": left}, indent=1, sort_keys=True) + "\n",
                       0o644)  # fmt: skip
    if not dry_run:
        (dest / MANIFEST).unlink()
        report.lines.append(f"removed {dest / MANIFEST}")
        if manifest.get("created_dest") and not any(dest.iterdir()):
            dest.rmdir()  # the install made the folder: gone again, as it was
            report.lines.append(f"removed {dest} (the install had made it)")
    return report
