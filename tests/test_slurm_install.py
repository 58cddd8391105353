"""`mig-batch slurm install`'s choices: which hook client, the paths compiled into it, the file system
the hooks are on, and the names the compiled client answers to."""

import shutil
import subprocess
import sys

import pytest

from mig_batch.mig.models import get_model
from mig_batch.slurm import install as installing

needs_cc = pytest.mark.skipif(shutil.which("cc") is None, reason="no C compiler")


@needs_cc
def test_a_path_compiled_in_comes_out_byte_for_byte(tmp_path):
    """Paths with quotes, backslashes, trigraph-like text, blanks and non-UTF-8 bytes survive -D."""
    import os

    paths = ['/a b/"q"\\x/??=/é', os.fsdecode(b"/raw\xff\x01dir"), "/plain/agent.sock"]
    source = tmp_path / "p.c"
    source.write_text('#include <stdio.h>\nint main(void) { fputs(P, stdout); return 0; }\n')
    for path in paths:
        exe = tmp_path / "p"
        subprocess.run(["cc", f"-DP={installing.c_string(path)}", "-o", str(exe), str(source)], check=True)
        assert subprocess.run([str(exe)], capture_output=True, check=True).stdout == os.fsencode(path)


def test_the_file_system_is_that_of_the_longest_and_last_mount_holding_the_path(tmp_path):
    mountinfo = tmp_path / "mountinfo"
    mountinfo.write_text(
        "21 1 8:1 / / rw,relatime - ext4 /dev/vda rw\n"
        "30 21 0:40 / /etc/slurm rw - nfs4 srv:/slurm rw\n"
        "31 30 0:41 / /etc/slurm rw - ext4 /dev/vdb rw\n"  # mounted over it later: this one counts
        "32 21 0:42 / /mnt/my\\040share rw - wekafs w rw\n"
        "33 21 0:43 / /mnt/fused rw - fuse.sshfs host:/x rw\n"
    )
    kind = installing.file_system_type
    assert kind(tmp_path / "nowhere", str(mountinfo)) == "ext4"
    assert kind("/etc/slurm/x", str(mountinfo)) == "ext4"
    assert kind("/etc/slurmx", str(mountinfo)) == "ext4"  # not under /etc/slurm
    assert kind("/mnt/my share/etc", str(mountinfo)) == "wekafs"
    assert kind("/mnt/fused", str(mountinfo)) == "fuse.sshfs"
    assert kind("/x", str(tmp_path / "missing")) == ""


@needs_cc
@pytest.mark.parametrize("shared", [False, True])
def test_auto_installs_the_client_as_the_hooks_on_a_local_disk_and_shims_on_a_shared_one(tmp_path, monkeypatch,
                                                                                         shared):  # fmt: skip
    monkeypatch.setattr(installing, "file_system_type", lambda path: "nfs4" if shared else "ext4")
    dest = tmp_path / "etc"
    _, which = installing.install(dest, sys.executable, "/etc/c.yaml", "/run/jobs", "/run/s",
                                  [get_model("A100-80GB")])  # fmt: skip
    prolog = dest / "mig-batch-prolog"
    assert prolog.is_symlink() != shared
    assert ("installed as the Prolog" in which) != shared
    assert ("on nfs4, which other nodes may share" in which) == shared
    if shared:
        assert f"{dest / 'mig-batch-hook'} prolog" in prolog.read_text()


@needs_cc
def test_the_compiled_client_is_the_hook_its_name_holds_as_hook_named_says(tmp_path):
    """Run with no arguments under each name: the slow path (no agent) shows which hook it ran as; the
    Python rule doctor uses says the same. Slurm's other hooks and unknown names do nothing."""
    calls, python = tmp_path / "calls", tmp_path / "python"
    python.write_text(f'#!/bin/sh\necho "$4" >> {calls}\n')  # python -I -m mig_batch.slurm.hooks HOOK
    python.chmod(0o755)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    (jobs / "5").write_text("export CUDA_VISIBLE_DEVICES=MIG-a\n")
    dest = tmp_path / "etc"
    installing.install(dest, str(python), "/etc/c.yaml", str(jobs), str(tmp_path / "no-agent.sock"),
                       [get_model("A100-80GB")], hook_client_kind="direct")  # fmt: skip
    names = ["mig-batch-prolog", "50-mig-prolog", "Epilog.mig", "mig-batch-taskprolog", "TaskEpilog",
             "prolog-slurmctld", "srun-prolog", "mig-batch-hook", "odd"]  # fmt: skip
    for name in names:
        link = tmp_path / "d" / name
        link.parent.mkdir(exist_ok=True)
        link.symlink_to(dest / "mig-batch-hook")
        calls.unlink(missing_ok=True)
        out = subprocess.run([str(link)], env={"SLURM_JOB_ID": "5"}, capture_output=True, text=True, timeout=30)
        assert out.returncode == 0, name
        ran = calls.read_text().strip() if calls.exists() else ("taskprolog" if "MIG-a" in out.stdout else None)
        assert ran == installing.hook_named(name), name
    assert [installing.hook_named(n) for n in names[:4]] == ["prolog", "prolog", "epilog", "taskprolog"]
