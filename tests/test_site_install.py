"""`mig-batch slurm install` / `htcondor install` into a folder the site already keeps files in: --dry-run
shows the diff, a plain install refuses, --force keeps the site's file beside ours, the site's rule and ours
both act (job_submit.lua in lupa; the HTCondor policy through the bindings' config and ClassAd evaluation),
and uninstall puts the folder back byte for byte. The real-Slurm run of the same is in
tests/test_site_install_e2e.py."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from mig_batch.batch import site_files
from mig_batch.cli.main import main
from mig_batch.mig.models import get_model
from mig_batch.slurm import install as slurm_installing

REPO = Path(__file__).resolve().parents[1]
NO_VAL, NO_VAL16 = 4294967294, 65534

SITE_RULE = """-- the site's own submit policy
function slurm_job_submit(job_desc, part_list, submit_uid)
	if job_desc.name == "forbidden" then
		slurm.log_user("site: jobs may not be called forbidden")
		return slurm.ERROR
	end
	if job_desc.comment == nil then
		job_desc.comment = "site:checked"
	end
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	if job_desc.name == "renamed-forbidden" then
		return slurm.ERROR
	end
	return slurm.SUCCESS
end

return slurm.SUCCESS
"""


def snapshot(folder: Path) -> dict[str, tuple]:
    """Every name in ``folder`` with its kind, mode and bytes (or link target): what 'byte for byte' compares."""
    out = {}
    for path in sorted(folder.iterdir()):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            out[path.name] = ("link", os.readlink(path))
        else:
            out[path.name] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes(), st.st_mtime_ns)
    return out


def site_config(tmp_path: Path) -> Path:
    config = tmp_path / "mig-batch.yaml"
    config.write_text("nodes:\n  n1: [A100-80GB]\n  n2: [A100-80GB]\n")
    return config


def cli(capsys, *args: str) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def slurm_args(etc: Path, config: Path) -> list[str]:
    return ["slurm", "install", str(etc), "--config", str(config), "--python", sys.executable, "--hook-client",
            "python"]  # fmt: skip


def lua_runtime(lupa, job_submit: Path):
    """slurmctld's Lua with the site's job_submit.lua loaded from its folder, as Slurm loads it."""
    lua = lupa.LuaRuntime(unpack_returned_tuples=True)
    lua.execute("slurm = { SUCCESS = 0, ERROR = -1, log_info = function(f, ...) INFO = string.format(f, ...) end, "
                "log_user = function(f, ...) LOGGED = string.format(f, ...) end }")
    lua.globals().dofile(str(job_submit))
    return lua


def submit(lua, **fields):
    job = lua.table_from({"ntasks_per_node": NO_VAL16, "num_tasks": 1, "min_nodes": NO_VAL, **fields})
    return lua.globals().slurm_job_submit(job, None, 1000), job


def test_slurm_install_into_a_folder_with_the_sites_job_submit_lua(tmp_path, capsys):
    lupa = pytest.importorskip("lupa")
    etc, config = tmp_path / "etc", site_config(tmp_path)
    etc.mkdir()
    (etc / "job_submit.lua").write_text(SITE_RULE)
    (etc / "slurm.conf").write_text("ClusterName=c\n")
    (etc / "site-prolog.sh").write_text("#!/bin/sh\nexit 0\n")
    (etc / "mig-batch-prolog").symlink_to("site-prolog.sh")  # the site's own file under one of our names
    before = snapshot(etc)

    code, out, err = cli(capsys, *slurm_args(etc, config))
    assert code == 2 and snapshot(etc) == before, err
    assert f"{etc / 'job_submit.lua'}" in err and f"{etc / 'mig-batch-prolog'}" in err
    assert "--force" in err and "--dry-run" in err and "job_submit.lua.mig-batch-old~" in err
    assert "Traceback" not in err

    code, out, err = cli(capsys, *slurm_args(etc, config), "--dry-run")
    assert code == 0 and snapshot(etc) == before, err
    module = etc / slurm_installing.SUBMIT_MODULE
    assert "--- a/job_submit.lua\n+++ b/job_submit.lua\n" in out
    assert f'+dofile("{module}")\n' in out and " return slurm.SUCCESS\n" in out  # the site's lines kept, ours added
    assert "--- a/mig-batch-prolog\n+++ b/mig-batch-prolog\n@@ -1 +1,12 @@\n-symbolic link -> site-prolog.sh\n" in out
    assert f"+++ b/{slurm_installing.SUBMIT_MODULE}" in out and "would replace" in out and "dry run" in out

    code, out, err = cli(capsys, *slurm_args(etc, config), "--force")
    assert code == 0, err
    kept = etc / "job_submit.lua.mig-batch-old~"
    assert kept.read_text() == SITE_RULE and os.readlink(etc / "mig-batch-prolog.mig-batch-old~") == "site-prolog.sh"
    assert f"kept as {kept}" in out
    job_submit = (etc / "job_submit.lua").read_text()
    assert job_submit.startswith(SITE_RULE[: SITE_RULE.index("return slurm.SUCCESS")])  # the site's rule, as it was
    assert job_submit.rstrip().endswith(f'dofile("{module}")\n\nreturn slurm.SUCCESS'.rstrip())
    manifest = json.loads((etc / site_files.MANIFEST).read_text())
    assert manifest["files"]["job_submit.lua"]["before"]["kept"] == kept.name
    assert manifest["files"][slurm_installing.SUBMIT_MODULE]["before"] is None

    # both rules act on one job: the site's first (its mark, its refusal), then ours (tag, hold, GRES removed)
    lua = lua_runtime(lupa, etc / "job_submit.lua")
    rc, job = submit(lua, tres_per_node="gres/mig:1g.10gb", script="#!/bin/sh", environment=lua.table_from({}))
    assert rc == 0 and job.comment == "site:checked", lua.globals().LOGGED
    assert job.admin_comment == "mig-batch:v1;req=1g.10gb" and job.priority == 0 and job.tres_per_node == ""
    rc, job = submit(lua, name="forbidden", tres_per_node="gres/mig:1g.10gb")
    assert rc == -1 and lua.globals().LOGGED == "site: jobs may not be called forbidden"
    rc, job = submit(lua, tres_per_node="gres/mig:900G")  # the site's rule passes it, ours refuses it
    assert rc == -1 and "no MIG profile has 900.0 GiB" in lua.globals().LOGGED
    rc, job = submit(lua, admin_comment="mig-batch:v1;req=7g.80gb;place=n1/0/7g.80gb@0")  # no forged tag
    assert rc == 0 and job.admin_comment is None and job.comment == "site:checked"
    held = lua.table_from({"admin_comment": "mig-batch:v1;req=1g.10gb", "priority": 0, "job_id": 7})
    modify = lua.globals().slurm_job_modify
    assert modify(lua.table_from({"priority": 100}), held, None, 1000) == 2042  # ours: the owner cannot release it
    assert modify(lua.table_from({"name": "renamed-forbidden"}), held, None, 0) == -1  # the site's modify rule
    assert modify(lua.table_from({"name": "fine"}), held, None, 1000) == 0

    # installed again: nothing of the site's in the way any more, nothing to force
    code, out, err = cli(capsys, *slurm_args(etc, config))
    assert code == 0 and f"unchanged {etc / 'job_submit.lua'}" in out, err

    code, out, err = cli(capsys, "slurm", "uninstall", str(etc))
    assert code == 0, err
    assert snapshot(etc) == before  # names, modes, bytes, link targets and times: the site's files themselves


def test_a_site_without_job_submit_lua_gets_the_plain_one_and_uninstall_leaves_the_folder_empty(tmp_path, capsys):
    lupa = pytest.importorskip("lupa")
    etc, config = tmp_path / "etc", site_config(tmp_path)
    code, out, err = cli(capsys, *slurm_args(etc, config))
    assert code == 0, err
    text = (etc / "job_submit.lua").read_text()
    assert text == slurm_installing.plain_job_submit(etc / slurm_installing.SUBMIT_MODULE)
    lua = lua_runtime(lupa, etc / "job_submit.lua")
    rc, job = submit(lua, tres_per_node="gres/mig:3g.40gb")
    assert rc == 0 and job.admin_comment == "mig-batch:v1;req=3g.40gb" and job.comment is None
    code, out, err = cli(capsys, "slurm", "uninstall", str(etc))
    assert code == 0 and not etc.exists(), out  # the install made the folder: gone again


def test_a_site_file_that_already_loads_the_module_stays_the_sites(tmp_path, capsys):
    """The documented way: the site adds the two lines itself; install then needs no --force and never
    writes its file, and uninstall leaves it (saying that it still loads the module)."""
    etc, config = tmp_path / "etc", site_config(tmp_path)
    etc.mkdir()
    module = etc / slurm_installing.SUBMIT_MODULE
    site = SITE_RULE[: SITE_RULE.rindex("return slurm.SUCCESS")] + slurm_installing.loader_lines(module) + \
        "return slurm.SUCCESS\n"  # fmt: skip
    (etc / "job_submit.lua").write_text(site)
    code, out, err = cli(capsys, *slurm_args(etc, config))
    assert code == 0 and f"unchanged {etc / 'job_submit.lua'}" in out, err
    assert json.loads((etc / site_files.MANIFEST).read_text())["files"]["job_submit.lua"]["written"] is False
    code, out, err = cli(capsys, "slurm", "uninstall", str(etc))
    assert code == 0 and (etc / "job_submit.lua").read_text() == site
    assert "still loads" in out and sorted(p.name for p in etc.iterdir()) == ["job_submit.lua"]


def test_an_upgrade_replaces_our_own_files_without_force_and_keeps_the_first_before(tmp_path, capsys):
    etc, config = tmp_path / "etc", site_config(tmp_path)
    etc.mkdir()
    (etc / "job_submit.lua").write_text(SITE_RULE)
    before = snapshot(etc)
    assert cli(capsys, *slurm_args(etc, config), "--force")[0] == 0
    config.write_text("nodes:\n  n1: [H100-80GB]\n")  # another inventory: the module's table changes
    code, out, err = cli(capsys, *slurm_args(etc, config))
    assert code == 0 and f"replaced {etc / slurm_installing.SUBMIT_MODULE}" in out, err
    assert '["H100-80GB"]' in (etc / slurm_installing.SUBMIT_MODULE).read_text()
    assert cli(capsys, "slurm", "uninstall", str(etc))[0] == 0
    assert snapshot(etc) == before


def test_uninstall_refuses_a_file_changed_since_the_install_unless_forced(tmp_path, capsys):
    etc, config = tmp_path / "etc", site_config(tmp_path)
    assert cli(capsys, *slurm_args(etc, config))[0] == 0
    subjob = etc / "mig-batch-subjob"
    subjob.write_text(subjob.read_text() + "# a local change\n")
    files = snapshot(etc)
    code, _, err = cli(capsys, "slurm", "uninstall", str(etc))
    assert code == 2 and str(subjob) in err and "--force" in err and snapshot(etc) == files
    code, _out, err = cli(capsys, "slurm", "uninstall", str(etc), "--force")
    assert code == 0, err
    assert [p.name for p in etc.iterdir()] == ["mig-batch-subjob.mig-batch-changed~"]
    assert "# a local change" in (etc / "mig-batch-subjob.mig-batch-changed~").read_text()


def test_what_job_submit_lua_becomes():
    module = Path("/etc/slurm") / slurm_installing.SUBMIT_MODULE
    loader = slurm_installing.loader_lines(module)
    with_loader = slurm_installing.with_loader
    # a final top-level return stays last (Lua wants it so); trailing comments stay after it
    text = "x = 1\nreturn slurm.SUCCESS\n-- end\n"
    assert with_loader(text.encode(), module).decode() == f"x = 1\n\n{loader}\nreturn slurm.SUCCESS\n-- end\n"
    # no return, no final newline: appended
    assert with_loader(b"x = 1", module).decode() == f"x = 1\n\n{loader}"
    # already loads the module: as it is
    done = f"x = 1\n{loader}return slurm.SUCCESS\n".encode()
    assert with_loader(done, module) == done
    # a job_submit.lua of a release before the module holds our rules itself: replaced by the plain one
    old = slurm_installing.job_submit_lua([get_model("A100-80GB")]).replace(
        "local function mig_job_submit", "function slurm_job_submit")  # fmt: skip
    assert with_loader(old.encode(), module).decode() == slurm_installing.plain_job_submit(module)
    assert with_loader(None, module).decode() == slurm_installing.plain_job_submit(module)
    assert slurm_installing.lua_string('/a "b"\\é') == r'"/a \34b\34\92\195\169"'


def test_the_module_loaded_twice_runs_the_sites_rule_and_ours_once(tmp_path):
    lupa = pytest.importorskip("lupa")
    module = tmp_path / slurm_installing.SUBMIT_MODULE
    module.write_text(slurm_installing.job_submit_lua([get_model("A100-80GB")]))
    site = tmp_path / "job_submit.lua"
    site.write_text(SITE_RULE[: SITE_RULE.rindex("return slurm.SUCCESS")] + slurm_installing.loader_lines(module) * 2)
    lua = lua_runtime(lupa, site)
    rc, job = submit(lua, tres_per_node="gres/mig:1g.10gb")
    assert rc == 0 and job.admin_comment == "mig-batch:v1;req=1g.10gb" and job.comment == "site:checked"


def test_the_install_never_writes_through_a_link_or_over_a_directory(tmp_path, capsys):
    etc, config = tmp_path / "etc", site_config(tmp_path)
    etc.mkdir()
    (etc / "site-prolog.sh").write_text("#!/bin/sh\nexit 0\n")
    (etc / "mig-batch-prolog").symlink_to("site-prolog.sh")  # a link of the site's under one of our names
    (etc / "mig-batch-subjob").mkdir()
    code, _out, err = cli(capsys, *slurm_args(etc, config), "--force")
    assert code == 2 and "mig-batch-subjob is not a file" in err
    (etc / "mig-batch-subjob").rmdir()
    before = snapshot(etc)
    assert cli(capsys, *slurm_args(etc, config), "--force")[0] == 0
    assert (etc / "site-prolog.sh").read_text() == "#!/bin/sh\nexit 0\n" and not (etc / "mig-batch-prolog").is_symlink()
    assert os.readlink(etc / "mig-batch-prolog.mig-batch-old~") == "site-prolog.sh"
    assert cli(capsys, "slurm", "uninstall", str(etc))[0] == 0
    assert snapshot(etc) == before


def test_a_symlinked_job_submit_lua_is_refused_even_with_force_until_it_loads_the_module(tmp_path, capsys):
    """--force over a link used to replace it with the plain file (the site's rules gone from what Slurm runs):
    refused, saying which two lines to add to the file it points at; once they are there the link is the site's,
    left as it is by install and uninstall."""
    etc, config = tmp_path / "etc", site_config(tmp_path)
    etc.mkdir()
    elsewhere = tmp_path / "site-submit.lua"
    elsewhere.write_text(SITE_RULE)
    (etc / "job_submit.lua").symlink_to(elsewhere)
    module = etc / slurm_installing.SUBMIT_MODULE
    before = snapshot(etc)
    for extra in ("--force", "--dry-run", ""):
        code, _out, err = cli(capsys, *slurm_args(etc, config), *([extra] if extra else []))
        assert code == 2 and snapshot(etc) == before and elsewhere.read_text() == SITE_RULE, err
        assert f"{etc / 'job_submit.lua'} is a symbolic link to {elsewhere}" in err
        assert f'dofile("{module}")' in err and "by hand" in err and "Traceback" not in err
    site = SITE_RULE[: SITE_RULE.rindex("return slurm.SUCCESS")] + slurm_installing.loader_lines(module) + \
        "return slurm.SUCCESS\n"  # fmt: skip
    elsewhere.write_text(site)  # the two lines added by hand, in the file the link points at
    code, out, err = cli(capsys, *slurm_args(etc, config))
    assert code == 0 and f"unchanged {etc / 'job_submit.lua'}" in out, err
    assert os.readlink(etc / "job_submit.lua") == str(elsewhere) and elsewhere.read_text() == site
    assert json.loads((etc / site_files.MANIFEST).read_text())["files"]["job_submit.lua"]["written"] is False
    assert cli(capsys, "slurm", "uninstall", str(etc))[0] == 0
    assert snapshot(etc) == before and elsewhere.read_text() == site


@pytest.mark.skipif(os.geteuid() != 0, reason="chown to another user needs root")
def test_job_submit_lua_rewritten_with_the_loader_keeps_the_sites_mode_and_owner(tmp_path, capsys):
    etc, config = tmp_path / "etc", site_config(tmp_path)
    etc.mkdir()
    job_submit = etc / "job_submit.lua"
    job_submit.write_text(SITE_RULE)
    os.chown(job_submit, 4321, 8765)
    job_submit.chmod(0o640)
    before = snapshot(etc)
    assert cli(capsys, *slurm_args(etc, config), "--force")[0] == 0
    st = os.lstat(job_submit)
    assert (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid) == (0o640, 4321, 8765)
    assert 'dofile("' in job_submit.read_text()
    code, out, err = cli(capsys, *slurm_args(etc, config))  # installed again: nothing to do, its mode stays
    assert code == 0 and f"unchanged {job_submit}" in out, err
    assert cli(capsys, "slurm", "uninstall", str(etc))[0] == 0
    assert snapshot(etc) == before
    st = os.lstat(job_submit)
    assert (st.st_uid, st.st_gid) == (4321, 8765)


def forged(etc: Path, files: dict) -> None:
    etc.mkdir(exist_ok=True)
    (etc / site_files.MANIFEST).write_text(json.dumps({"format": site_files.MANIFEST_FORMAT, "files": files}))
    (etc / site_files.MANIFEST).chmod(0o644)


@pytest.mark.parametrize("files, why", [
    ({"{victim}/important": {"sha256": "{sha}", "before": None}}, "not a name in the folder"),
    ({"../victim/important": {"sha256": "{sha}", "before": None}}, "not a name in the folder"),
    ({"..": {"sha256": "{sha}", "before": None}}, "not a name in the folder"),
    ({".": {"sha256": "{sha}", "before": None}}, "not a name in the folder"),
    ({"": {"sha256": "{sha}", "before": None}}, "not a name in the folder"),
    ({site_files.MANIFEST: {"sha256": "{sha}", "before": None}}, "not a name in the folder"),
    ({"new_file": {"sha256": "{newsha}", "before": {"kept": "../evil"}}}, "not a name the install keeps"),
    ({"new_file": {"sha256": "{newsha}", "before": {"kept": "{victim}/important"}}}, "not a name the install keeps"),
    ({"new_file": {"sha256": "{newsha}", "before": {"kept": "evil"}}}, "not a name the install keeps"),
    ({"new_file": {"sha256": "{newsha}", "before": {"kept": "new_file.mig-batch-old~/../../evil"}}},
     "not a name the install keeps"),
    ({"new_file": {"sha256": "{newsha}", "changed_kept": "../evil", "before": None}}, "not a name the install keeps"),
    ({"new_file": ["not", "a", "record"]}, "not a record"),
    ({"new_file": {"sha256": "{newsha}", "before": "../evil"}}, "not a record"),
])  # fmt: skip
def test_a_forged_manifest_never_reaches_outside_the_folder(tmp_path, capsys, files, why):
    """A manifest naming a path outside the folder (absolute, ``..``) or a kept file the install never writes: both
    install and uninstall refuse it before touching anything (they used to remove the victim's file and rename the
    attacker's over another)."""
    etc, config, victim = tmp_path / "etc", site_config(tmp_path), tmp_path / "victim"
    victim.mkdir()
    (victim / "important").write_text("the victim's\n")
    (tmp_path / "evil").write_text("the attacker's\n")
    sha = site_files.sha256(b"the victim's\n")
    text = json.dumps(files).replace("{victim}", str(victim)).replace("{sha}", sha)
    text = text.replace("{newsha}", site_files.sha256(b"x\n"))  # new_file is ours as far as the manifest says
    forged(etc, json.loads(text))
    (etc / "new_file").write_text("x\n")
    before, outside = snapshot(etc), (snapshot(victim), (tmp_path / "evil").read_text())
    for args in (["slurm", "uninstall", str(etc)], ["slurm", "uninstall", str(etc), "--force"],
                 ["htcondor", "uninstall", str(etc)], [*slurm_args(etc, config), "--force"]):  # fmt: skip
        code, _out, err = cli(capsys, *args)
        assert code == 2 and why in err and "Traceback" not in err, (args, err)
        assert snapshot(etc) == before and (snapshot(victim), (tmp_path / "evil").read_text()) == outside


def test_the_manifest_and_the_folder_must_be_writable_by_root_alone(tmp_path, capsys):
    etc, config = tmp_path / "etc", site_config(tmp_path)
    assert cli(capsys, *slurm_args(etc, config))[0] == 0
    manifest = etc / site_files.MANIFEST
    files = snapshot(etc)
    manifest.chmod(0o666)  # anyone could have written it
    for args in (slurm_args(etc, config), ["slurm", "uninstall", str(etc)]):
        code, _out, err = cli(capsys, *args)
        assert code == 2 and f"{manifest} is writable by group or others" in err and "Traceback" not in err, err
    manifest.chmod(0o644)
    if os.geteuid() == 0:
        os.chown(manifest, 4321, 4321)  # another user's
        for args in (slurm_args(etc, config), ["slurm", "uninstall", str(etc)]):
            code, _out, err = cli(capsys, *args)
            assert code == 2 and f"{manifest} is owned by uid 4321" in err, err
        os.chown(manifest, os.geteuid(), os.getegid())
    etc.chmod(0o777)  # another user could put a manifest (or anything) there
    for args in (slurm_args(etc, config), ["slurm", "uninstall", str(etc)], ["htcondor", "uninstall", str(etc)]):
        code, _out, err = cli(capsys, *args)
        assert code == 2 and "writable by group or others" in err and str(etc) in err, err
    etc.chmod(0o755)
    link = tmp_path / "etc-link"
    link.symlink_to(etc)
    code, _out, err = cli(capsys, "slurm", "uninstall", str(link))
    assert code == 2 and "symbolic link" in err, err
    assert snapshot(etc) == files  # nothing was touched
    assert cli(capsys, "slurm", "uninstall", str(etc))[0] == 0 and not etc.exists()


def test_uninstall_refuses_up_front_when_a_kept_file_is_gone(tmp_path, capsys):
    etc, config = tmp_path / "etc", site_config(tmp_path)
    etc.mkdir()
    (etc / "job_submit.lua").write_text(SITE_RULE)
    (etc / "mig-batch-subjob").write_text("the site's\n")
    assert cli(capsys, *slurm_args(etc, config), "--force")[0] == 0
    kept = [etc / "job_submit.lua.mig-batch-old~", etc / "mig-batch-subjob.mig-batch-old~"]
    for path in kept:
        os.rename(path, tmp_path / path.name)
    files = snapshot(etc)
    code, _out, err = cli(capsys, "slurm", "uninstall", str(etc))
    assert code == 2 and all(str(path) in err for path in kept) and snapshot(etc) == files, err
    assert "nothing was removed" in err
    for path in kept:
        os.rename(tmp_path / path.name, path)
    assert cli(capsys, "slurm", "uninstall", str(etc))[0] == 0
    assert sorted(p.name for p in etc.iterdir()) == ["job_submit.lua", "mig-batch-subjob"]


def test_an_uninstall_that_fails_half_way_is_finished_by_the_next(tmp_path, capsys, monkeypatch):
    """Each entry undone is dropped from the manifest at once: an uninstall stopped after some (an error, a crash)
    is finished by running it again, and one stopped between renaming a kept file back and recording it sees the
    site's file back in place and goes on."""
    etc, config = tmp_path / "etc", site_config(tmp_path)
    etc.mkdir()
    (etc / "job_submit.lua").write_text(SITE_RULE)
    (etc / "mig-batch-subjob").write_text("the site's\n")
    before = snapshot(etc)
    assert cli(capsys, *slurm_args(etc, config), "--force")[0] == 0
    real, calls = site_files._remove_one, []

    def failing(*args, **kwargs):
        calls.append(args[1])
        if len(calls) == 3:
            raise OSError(5, "Input/output error")
        return real(*args, **kwargs)

    monkeypatch.setattr(site_files, "_remove_one", failing)
    with pytest.raises(OSError):
        site_files.uninstall_files(etc)
    monkeypatch.setattr(site_files, "_remove_one", real)
    left = json.loads((etc / site_files.MANIFEST).read_text())["files"]
    assert calls[0] == "job_submit.lua" and not set(calls[:2]) & set(left) and calls[2] in left
    assert (etc / "job_submit.lua").read_text() == SITE_RULE
    code, _out, err = cli(capsys, "slurm", "uninstall", str(etc))
    assert code == 0, err
    assert snapshot(etc) == before

    # stopped right after renaming the kept job_submit.lua back, before the manifest said so
    assert cli(capsys, *slurm_args(etc, config), "--force")[0] == 0
    os.replace(etc / "job_submit.lua.mig-batch-old~", etc / "job_submit.lua")
    code, _out, err = cli(capsys, "slurm", "uninstall", str(etc))
    assert code == 0, err
    assert snapshot(etc) == before


def test_a_broken_manifest_is_refused_by_name(tmp_path, capsys):
    etc, config = tmp_path / "etc", site_config(tmp_path)
    etc.mkdir()
    (etc / site_files.MANIFEST).write_bytes(b"\xff\x00 not json")
    for args in (slurm_args(etc, config), ["slurm", "uninstall", str(etc)]):
        code, _out, err = cli(capsys, *args)
        assert code == 2 and "not a mig_batch install manifest" in err and "Traceback" not in err


# --- HTCondor ----------------------------------------------------------------------------------------------------

SITE_CONDOR = """# the site's own schedd policy
SUBMIT_REQUIREMENT_NAMES = $(SUBMIT_REQUIREMENT_NAMES) SiteProject
SUBMIT_REQUIREMENT_SiteProject = ProjectName isnt undefined
SUBMIT_REQUIREMENT_SiteProject_REASON = "site: give +ProjectName"
"""
OLD_OURS = "# a hand-made mig_batch policy of an earlier day\nQUEUE_SUPER_USERS = $(QUEUE_SUPER_USERS), mig\n"


def htcondor_args(dest: Path, config: Path) -> list[str]:
    return ["htcondor", "install", str(dest), "--config", str(config)]


def condor_policy(config_dir: Path, tmp_path: Path, jobs: list[dict]) -> dict:
    """The schedd's submit requirements as HTCondor reads ``config_dir`` (a config.d), each evaluated on each of
    ``jobs``: {"names": [...], "results": [[(name, passes), ...] per job], "exclude": regexp}."""
    (tmp_path / "condor_config").write_text(f"LOCAL_CONFIG_DIR = {config_dir}\n")
    script = """
import json, sys, htcondor2, classad2
names = htcondor2.param["SUBMIT_REQUIREMENT_NAMES"].split()
results = []
for job in json.loads(sys.argv[1]):
    ad = classad2.ClassAd(job)
    results.append([(n, bool(classad2.ExprTree(htcondor2.param["SUBMIT_REQUIREMENT_" + n]).eval(ad))) for n in names])
print(json.dumps({"names": names, "results": results,
                  "exclude": htcondor2.param["LOCAL_CONFIG_DIR_EXCLUDE_REGEXP"],
                  "super": htcondor2.param.get("QUEUE_SUPER_USERS", "")}))
"""
    env = {**os.environ, "CONDOR_CONFIG": str(tmp_path / "condor_config")}
    out = subprocess.run([sys.executable, "-c", script, json.dumps(jobs)], env=env, capture_output=True, text=True,
                         timeout=120)  # fmt: skip
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout)


def test_htcondor_install_into_a_folder_with_the_sites_files(tmp_path, capsys):
    pytest.importorskip("htcondor2")
    dest, config = tmp_path / "config.d", tmp_path / "mig-batch.yaml"
    config.write_text("batch_system: htcondor\nnodes:\n  n1: [A100-80GB]\n")
    dest.mkdir()
    (dest / "00-site.conf").write_text(SITE_CONDOR)
    (dest / "mig-batch-schedd.conf").write_text(OLD_OURS)  # the site's own file under our name
    before = snapshot(dest)

    code, out, err = cli(capsys, *htcondor_args(dest, config))
    assert code == 2 and snapshot(dest) == before, err
    assert str(dest / "mig-batch-schedd.conf") in err and "--force" in err and "--dry-run" in err
    code, out, err = cli(capsys, *htcondor_args(dest, config), "--dry-run")
    assert code == 0 and snapshot(dest) == before
    assert "--- a/mig-batch-schedd.conf\n+++ b/mig-batch-schedd.conf\n" in out
    assert "-QUEUE_SUPER_USERS = $(QUEUE_SUPER_USERS), mig\n" in out and "+SUBMIT_REQUIREMENT_NAMES" in out
    assert "--- /dev/null\n+++ b/mig-batch-job-wrapper\n" in out

    code, out, err = cli(capsys, *htcondor_args(dest, config), "--force")
    assert code == 0, err
    kept = dest / "mig-batch-schedd.conf.mig-batch-old~"
    assert kept.read_text() == OLD_OURS

    # HTCondor reading a config.d with the site's file, ours and the kept one: both policies, never the kept file
    conf_d = tmp_path / "condor.d"
    conf_d.mkdir()
    for name in ("00-site.conf", "mig-batch-schedd.conf", kept.name, site_files.MANIFEST):
        os.link(dest / name, conf_d / name)
    jobs = [{"ProjectName": "p", "MigRequest": "20G"}, {"MigRequest": "20G"},
            {"ProjectName": "p", "MigRequest": "500G"}, {"ProjectName": "p"}]  # fmt: skip
    policy = condor_policy(conf_d, tmp_path, jobs)
    assert "SiteProject" in policy["names"] and "MigBatchFits" in policy["names"]
    passes = [dict(result) for result in policy["results"]]
    assert all(passes[0].values())
    assert not passes[1]["SiteProject"] and passes[1]["MigBatchFits"]  # the site's rule refuses it
    assert passes[2]["SiteProject"] and not passes[2]["MigBatchFits"]  # ours refuses it
    assert all(passes[3].values())
    assert ", mig\n" not in policy["super"] and "mig-batch@" in policy["super"]  # the kept file is not read
    import re

    assert re.match(policy["exclude"], kept.name) and re.match(policy["exclude"], site_files.MANIFEST)

    code, out, err = cli(capsys, "htcondor", "uninstall", str(dest))
    assert code == 0, err
    assert snapshot(dest) == before


def test_an_install_that_fails_half_way_records_what_it_wrote(tmp_path, capsys):
    """A write that fails (here a file size limit below the submit module's size, as a full disk would) stops
    the install: what it wrote is in the manifest (so a second install replaces it without --force), the
    site's job_submit.lua is untouched and not kept; the next install finishes and uninstall puts the folder
    back."""
    etc, config = tmp_path / "etc", site_config(tmp_path)
    etc.mkdir()
    (etc / "job_submit.lua").write_text(SITE_RULE)
    before = snapshot(etc)
    script = (
        "import resource, signal, sys\n"
        "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
        "resource.setrlimit(resource.RLIMIT_FSIZE, (20000, 20000))\n"
        "from mig_batch.cli.main import main\n"
        f"sys.exit(main({[*slurm_args(etc, config), '--force']!r}))\n"
    )
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, cwd=REPO)
    assert out.returncode == 2 and "Traceback" not in out.stderr, out.stderr
    recorded = json.loads((etc / site_files.MANIFEST).read_text())["files"]
    assert "mig-batch-prolog" in recorded and slurm_installing.SUBMIT_MODULE not in recorded
    assert (etc / "job_submit.lua").read_text() == SITE_RULE and not (etc / "job_submit.lua.mig-batch-old~").exists()
    assert not (etc / slurm_installing.SUBMIT_MODULE).exists()
    (etc / "mig-batch-prolog").chmod(0o700)  # ours still: a second install gives it its mode back, no --force
    code, _, err = cli(capsys, *slurm_args(etc, config))
    assert code == 2 and str(etc / "job_submit.lua") in err and str(etc / "mig-batch-prolog") not in err
    assert cli(capsys, *slurm_args(etc, config), "--force")[0] == 0
    assert stat.S_IMODE((etc / "mig-batch-prolog").stat().st_mode) == 0o755
    assert cli(capsys, "slurm", "uninstall", str(etc))[0] == 0
    assert snapshot(etc) == before


def test_doctor_follows_job_submit_lua_to_the_module_and_names_lines_put_too_early(tmp_path, capsys):
    from mig_batch.cli.ops_commands import check_job_submit

    etc, config = tmp_path / "etc", site_config(tmp_path)
    assert cli(capsys, *slurm_args(etc, config))[0] == 0
    show = f"JobSubmitPlugins        = lua\nSLURM_CONF              = {etc}/slurm.conf\n"
    check = check_job_submit(show)
    assert check.ok and f"loads mig_batch's {etc / slurm_installing.SUBMIT_MODULE}" in check.detail
    module = etc / slurm_installing.SUBMIT_MODULE
    # the site's functions defined after the two lines replace ours: named, with the line numbers
    (etc / "job_submit.lua").write_text(slurm_installing.loader_lines(module) + SITE_RULE)
    check = check_job_submit(show)
    assert not check.ok and "line 4 defines slurm_job_submit after the line that loads" in check.detail, check
    (etc / "job_submit.lua").write_text(SITE_RULE)  # the site's file without the two lines
    check = check_job_submit(show)
    assert not check.ok and "neither is mig_batch's nor loads" in check.detail and "two lines" in check.fix
