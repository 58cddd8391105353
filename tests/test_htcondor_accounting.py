"""MIG slice accounting on HTCondor without a pool: the config install writes, the expressions the schedd makes
each job's request and limits from (evaluated by the ClassAd library), and the pin's count. The pool's own
behaviour (condor_userprio, the concurrency limit's reason) is tests/test_htcondor_accounting_e2e.py's."""

import types

import pytest

from mig_batch.batch.system import Pin
from mig_batch.htcondor import accounting
from mig_batch.htcondor.install import install
from mig_batch.mig.models import get_model


def test_a_node_counts_the_memory_slices_of_its_gpus():
    assert accounting.node_slices([get_model("A100-80GB"), get_model("A100-80GB")]) == 16
    assert accounting.node_slices([get_model("A30")]) == 4
    lines = accounting.execute_config({"n2": [get_model("A30")], "n1": [get_model("H100-80GB")]}).splitlines()
    assert lines == ["MIG_BATCH_SLICES_n1 = 8", "MIG_BATCH_SLICES_n2 = 4",
                     "MACHINE_RESOURCE_MigSlices = $(MIG_BATCH_SLICES_$(HOSTNAME):0)",
                     "SLOT_WEIGHT = ifThenElse(MigSlices > 0, MigSlices, Cpus)"]  # fmt: skip


def test_the_schedd_protects_the_count_and_makes_the_request_and_limits_from_it():
    text = accounting.schedd_config()
    protected = next(line for line in text.splitlines() if line.startswith("PROTECTED_JOB_ATTRS"))
    assert protected.split()[3:] == ["MigBatchSlices", "RequestMigSlices", "ConcurrencyLimits"]
    assert "   DELETE MigBatchSlices\n" in text  # what an owner wrote at submission is dropped
    assert "   RENAME ConcurrencyLimits MigBatchOwnLimits\n" in text  # the owner's limits kept


@pytest.mark.parametrize(("job", "slices", "limits"), [
    ({}, 0, None),  # not mig_batch's, or not pinned yet: no slices, no limits
    ({"MigBatchOwnLimits": "license_x"}, 0, "license_x"),
    ({"MigBatchSlices": 4}, 4, "mig_slices.alice:4"),
    ({"MigBatchSlices": 8, "MigBatchOwnLimits": "license_x,db:2"}, 8, "license_x,db:2,mig_slices.alice:8"),
])  # fmt: skip
def test_the_request_and_limits_evaluate_from_the_pins_count(job, slices, limits):
    classad2 = pytest.importorskip("classad2")
    ad = classad2.ClassAd({"Owner": "alice", **job})
    ad["RequestMigSlices"] = classad2.ExprTree(f"{accounting.SLICES_ATTR} ?: 0")
    ad["ConcurrencyLimits"] = classad2.ExprTree(accounting.LIMITS)
    assert ad.eval("RequestMigSlices") == slices
    value = ad.eval("ConcurrencyLimits")
    assert (None if isinstance(value, classad2.Value) else value) == limits


def test_install_adds_accounting_for_the_sites_nodes(tmp_path):
    models = [get_model("A100-80GB")]
    args = (models, "mig-batch@pool", [], "/usr/bin/python3", "/run/a.sock", "/run/a.ad")
    install(tmp_path / "with", *args, nodes={"gpu1": ["A100-80GB", "A100-80GB"]})
    install(tmp_path / "without", *args)
    execute = (tmp_path / "with" / "mig-batch-execute.conf").read_text()
    assert "MIG_BATCH_SLICES_gpu1 = 16\n" in execute and "\nSLOT_WEIGHT = " in execute
    assert "JOB_TRANSFORM_MigBatchSlices @=end" in (tmp_path / "with" / "mig-batch-schedd.conf").read_text()
    assert "MigSlices" not in (tmp_path / "without" / "mig-batch-execute.conf").read_text()
    assert "MigBatchSlices" not in (tmp_path / "without" / "mig-batch-schedd.conf").read_text()


def test_the_pin_writes_the_slices_before_the_node():
    from mig_batch.htcondor.adapter import HTCondorBatch

    edits: list[tuple[str, str]] = []
    schedd = types.SimpleNamespace(edit=lambda constraint, attr, value: edits.append((attr, value)),
                                   query=lambda constraint, projection: [{"NumJobStarts": 0}],
                                   act=lambda action, job, reason: {"TotalSuccess": 1}, reschedule=lambda: None)
    batch = HTCondorBatch.__new__(HTCondorBatch)  # no bindings needed: a stand-in schedd
    batch.htcondor = types.SimpleNamespace(JobAction=types.SimpleNamespace(Release="release"),
                                           HTCondorException=RuntimeError)  # fmt: skip
    batch.classad = types.SimpleNamespace(quote=lambda text: f'"{text}"', ClassAdException=ValueError, Value=type(None))
    batch._schedd = schedd
    assert batch.pin_and_release([Pin("7.0", "n1", "mig-batch:v1;req=40G;place=n1/0/3g.40gb@4", None, 4),
                                  Pin("8.0", "n1", "mig-batch:v1;req=1g", None, 0)]) == {}  # fmt: skip
    assert [attr for attr, _ in edits] == ["MigBatchStarts", "MigBatchTag", "MigBatchSlices", "MigBatchNode",
                                           "MigBatchStarts", "MigBatchTag", "MigBatchNode"]  # fmt: skip
    assert edits[2] == ("MigBatchSlices", "4")
