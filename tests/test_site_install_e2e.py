"""`mig-batch slurm install` into a Slurm config folder with the site's own job_submit.lua, on the real local
Slurm (tests/harness/slurm_cluster.py): the plain install refuses, --dry-run shows the diff, --force keeps the
site's file and adds the two lines that load mig_batch's rules; slurmctld then runs both on submitted jobs
(the site's mark and refusal, ours: held, placed by mig-batchd, run on a MIG instance); uninstall puts the
folder back byte for byte."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest
from harness.slurm_cluster import LocalCluster, MigTestbed

from mig_batch.cli.main import main
from mig_batch.state import Store

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(LocalCluster.available() is not None, reason=str(LocalCluster.available())),
]

SITE_RULE = """-- the site's own submit policy
function slurm_job_submit(job_desc, part_list, submit_uid)
	if job_desc.name == "forbidden" then
		slurm.log_user("site: jobs may not be called forbidden")
		return slurm.ERROR
	end
	if job_desc.comment == nil then
		job_desc.comment = "site-checked"
	end
	return slurm.SUCCESS
end

function slurm_job_modify(job_desc, job_rec, part_list, modify_uid)
	return slurm.SUCCESS
end

return slurm.SUCCESS
"""


def snapshot(folder: Path) -> dict[str, tuple]:
    out = {}
    for path in sorted(folder.iterdir()):
        st = os.lstat(path)
        if stat.S_ISLNK(st.st_mode):
            out[path.name] = ("link", os.readlink(path))
        elif stat.S_ISREG(st.st_mode):
            out[path.name] = ("file", stat.S_IMODE(st.st_mode), path.read_bytes())
        else:
            out[path.name] = ("other", stat.S_IMODE(st.st_mode))
    return out


def cli(capsys, *args) -> tuple[int, str, str]:
    code = main([str(a) for a in args])
    out = capsys.readouterr()
    return code, out.out, out.err


def test_the_sites_job_submit_lua_and_ours_both_act_in_slurmctld(tmp_path_factory, capsys):
    root = tmp_path_factory.mktemp("sitebed")
    bed = MigTestbed(root, nodes={"n1": ["A100-80GB"]})
    bed.start()
    try:
        etc = root / "etc"
        # the site as it was before mig_batch: its own job_submit.lua, no mig_batch file (the harness's own
        # install taken back with uninstall, which this also checks)
        assert cli(capsys, "slurm", "uninstall", etc)[0] == 0
        assert not (etc / "job_submit.lua").exists() and not (etc / "mig-batch-prolog").exists()
        (etc / "job_submit.lua").write_text(SITE_RULE)
        before = snapshot(etc)
        install = ["slurm", "install", etc, "--config", bed.config_path, "--python", bed.node_python]

        code, out, err = cli(capsys, *install)
        assert code == 2 and snapshot(etc) == before, err
        assert str(etc / "job_submit.lua") in err and "--force" in err and "--dry-run" in err
        code, out, err = cli(capsys, *install, "--dry-run")
        assert code == 0 and snapshot(etc) == before, err
        assert "--- a/job_submit.lua\n+++ b/job_submit.lua\n" in out and f'+dofile("{etc}/mig-batch-submit.lua")' in out
        code, out, err = cli(capsys, *install, "--force")
        assert code == 0, err
        assert (etc / "job_submit.lua.mig-batch-old~").read_text() == SITE_RULE
        bed.cluster.run("scontrol", "reconfigure")
        time.sleep(1)

        refused = bed.cluster.run("sbatch", "-J", "forbidden", "--gres=mig:1g.10gb", "--wrap", "true", check=False)
        assert refused.returncode != 0 and "site: jobs may not be called forbidden" in refused.stderr
        too_big = bed.cluster.run("sbatch", "--gres=mig:500G", "--wrap", "true", check=False)
        assert too_big.returncode != 0 and "7g.80gb" in too_big.stderr  # the site passes it, ours refuses it
        out_dir = root / "out"
        out_dir.mkdir()
        job = bed.cluster.run("sbatch", "--parsable", "--gres=mig:1g.10gb", f"--output={out_dir}/%j.out", "--wrap",
                              'echo "cvd=$CUDA_VISIBLE_DEVICES"').stdout.strip()  # fmt: skip
        plain = bed.cluster.run("sbatch", "--parsable", f"--output={out_dir}/%j.out", "--wrap", "true").stdout.strip()
        shown = bed.cluster.run("scontrol", "show", "job", job).stdout
        assert "Comment=site-checked" in shown, shown  # the site's rule acted
        assert "AdminComment=mig-batch:v1;req=1g.10gb" in shown, shown  # and ours
        assert "Comment=site-checked" in bed.cluster.run("scontrol", "show", "job", plain).stdout
        store = Store(bed.store_path)
        deadline = time.monotonic() + 180
        while time.monotonic() < deadline:
            queued = bed.cluster.run("squeue", "-h", "-o", "%i").stdout.split()
            decision = store.decision(job)
            if job not in queued and plain not in queued and decision is not None and decision.state == "ended":
                break
            time.sleep(0.5)
        else:
            raise AssertionError(f"job {job} did not end: {bed.cluster.run('squeue').stdout}")
        assert (out_dir / f"{job}.out").read_text().startswith("cvd=MIG-"), (out_dir / f"{job}.out").read_text()

        code, out, err = cli(capsys, "slurm", "uninstall", etc)
        assert code == 0, err
        assert snapshot(etc) == before
    finally:
        bed.stop()
