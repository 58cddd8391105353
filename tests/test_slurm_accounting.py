"""MIG use in Slurm accounting, on a real local Slurm with slurmdbd over a private MariaDB.

mig-batchd sets gres:mig_slices:<memory slices> on each MIG job when it pins it; Slurm then counts the
slices in the job's TRES (scontrol, sacct) and enforces an association's GrpTRES limit on them.
"""

import time

import pytest
from harness.slurm_cluster import LocalCluster, MigTestbed, ensure_user, unprivileged

from mig_batch.cli.migsub_status import SQUEUE_FORMAT, parse_records, status_row

MISSING = LocalCluster.accounting_available()
USER = "mig-batch-carol"  # an ordinary user (Slurm 26.05 gives nobody, uid 65534, no association)
pytestmark = [pytest.mark.slow, pytest.mark.skipif(MISSING is not None, reason=str(MISSING))]


def test_slices_reach_sacct_and_a_grptres_limit_holds(tmp_path):
    bed = MigTestbed(tmp_path, nodes={"n1": ["A100-80GB", "A100-80GB"]}, slice_gres="mig_slices", accounting=True)
    with bed:
        run = bed.cluster.run
        run("sacctmgr", "-i", "modify", "account", "mig", "set", "GrpTRES=gres/mig_slices=7")
        user = ensure_user(USER)
        run("sacctmgr", "-i", "add", "user", USER, "Account=mig", "Cluster=migbatch", "DefaultAccount=mig")
        _, as_user, sbatch = unprivileged(bed, tmp_path, USER)  # an ordinary user's jobs, read by that user
        deadline = time.monotonic() + 30  # slurmdbd tells slurmctld of the new association in the background
        while f"UserName={USER}({user.pw_uid})" not in (known := run("scontrol", "show", "assoc_mgr", f"users={USER}",
                                                                     "flags=assoc").stdout):  # fmt: skip
            assert time.monotonic() < deadline, f"slurmctld never learned {USER}'s association: {known}"
            time.sleep(0.5)
        # 3g.40gb holds 4 of an A100-80GB's 8 memory slices: the second job would make 8 > 7
        jobs = [sbatch("--account=mig", "--gres=mig:3g.40gb", seconds=60) for _ in range(2)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            states = dict(line.split(maxsplit=1) for line in run("squeue", "-h", "-o", "%i %T:%r").stdout.splitlines())
            if states.get(jobs[0]) == "RUNNING:None" and states.get(jobs[1]) == "PENDING:AssocGrpGRES":
                break
            time.sleep(0.5)
        assert states == {jobs[0]: "RUNNING:None", jobs[1]: "PENDING:AssocGrpGRES"}, states
        queue = as_user("squeue", "-h", "-O", SQUEUE_FORMAT, "-j", jobs[1])
        assert queue.returncode == 0, queue.stderr
        rows = [status_row(*r) for r in parse_records(queue.stdout)]
        assert len(rows) == 1 and rows[0] is not None and rows[0]["slices"] is None, rows  # (no site config here)
        assert rows[0]["waits"].startswith("over a limit: ") and "(AssocGrpGRES)" in rows[0]["waits"], rows
        assert "gres/mig_slices=4" in run("scontrol", "show", "job", jobs[0]).stdout
        deadline = time.monotonic() + 15  # slurmctld sends the job's start to slurmdbd in the background
        while time.monotonic() < deadline:
            sacct = run("sacct", "-n", "-X", "-P", "-j", jobs[0], "-o", "JobID,AllocTRES").stdout
            if "gres/mig_slices" in sacct:
                break
            time.sleep(0.5)
        assert "gres/mig_slices=4" in sacct, sacct
        run("scancel", *jobs)
