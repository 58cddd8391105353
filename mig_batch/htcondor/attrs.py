"""The job and machine ClassAd attributes mig_batch uses on HTCondor, and the execute-node policy
that makes a pin binding.

Job attributes (protected: only a queue superuser, the controller's identity, may set them):

- ``MigBatchTag``: the managed-job tag, the same text as Slurm's AdminComment (``batch.tags``:
  ``mig-batch:v1;req=...;place=node/gpu/profile@start;node=...``), so both batch systems share one
  grammar and one parser. One string attribute, not one attribute per field: the node's report and
  the decision are rewritten together, and the seam carries one ``admin_tag``.
- ``MigBatchNode``: the node the controller pinned the job to. A separate attribute because ClassAd
  matching cannot cheaply read a field out of the tag; the startd's START compares it with its own
  ``MigBatchNodeName``, so the pin holds whatever the job's (user-editable) Requirements say.
- ``MigBatchStarts``: the job's ``NumJobStarts`` when pinned; START takes the job only while the two are equal, so
  a pin starts the job once (an owner's release of a job that ran, before the controller unpinned it, starts
  nothing).

Machine attributes: ``MigBatchNodeName`` (the node's name in mig_batch's config and decisions; several
startds on one host, as in the test pool, need distinct names) and ``MigBatchAgent`` (the node agent's
state, ``batch.tags.AgentTag``), published by a startd cron job that prints a node-local file the
agent writes: hooks and cron run as ``condor``, never root, so the agent writes and condor only reads.
The ``MigBatch`` prefix keeps clear of HTCondor's own attributes and of a site's.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence

from mig_batch.batch.system import MANAGED_PREFIX
from mig_batch.mig.models import GpuModel

TAG_ATTR = "MigBatchTag"
PIN_ATTR = "MigBatchNode"
NODE_NAME_ATTR = "MigBatchNodeName"
AGENT_ATTR = "MigBatchAgent"
TIME_LIMIT_ATTR = "AllowedExecuteDuration"  # HTCondor's own: the job is held when it runs longer (seconds)
# The job's start count (NumJobStarts) when the controller pinned it: a pin lets the job start once. Released by
# its owner after it ran (a chain's subjob held by its exit policy, a job its owner held), before mig-batchd's
# next pass unpins it, the job matches nothing until a new decision pins it again.
STARTS_ATTR = "MigBatchStarts"

# The startd runs an unmanaged job anywhere, a managed one only on the node it is pinned to, and once per pin.
START_POLICY = (f"(TARGET.{TAG_ATTR} =?= undefined) || "
                f"(TARGET.{PIN_ATTR} =?= MY.{NODE_NAME_ATTR} && (TARGET.{STARTS_ATTR} =?= undefined "
                f"|| TARGET.{STARTS_ATTR} =?= (TARGET.NumJobStarts ?: 0)))")  # fmt: skip
CRON_JOB = "MIGBATCH"  # the startd cron job publishing the agent's file


def execute_config(wrapper: str = "") -> str:
    """Startd config every mig_batch node shares: the pin policy, the cron job that publishes the
    agent's file (its path per node: :func:`node_config`) and, when given, the job wrapper that asks
    the node agent for the job's instance (it runs as the job's user, so the agent does the root work)."""
    return "\n".join([
        *([f"USER_JOB_WRAPPER = {wrapper}"] if wrapper else []),
        f"STARTD_ATTRS = $(STARTD_ATTRS) {NODE_NAME_ATTR}",
        f"START = ($(START)) && ({START_POLICY})",
        f"STARTD_CRON_JOBLIST = $(STARTD_CRON_JOBLIST) {CRON_JOB}",
        f"STARTD_CRON_{CRON_JOB}_EXECUTABLE = /bin/cat",
        f"STARTD_CRON_{CRON_JOB}_MODE = Periodic",
        f"STARTD_CRON_{CRON_JOB}_PERIOD = 5s",
        "",
    ])  # fmt: skip


def node_config(node: str, agent_file: str, prefix: str = "") -> str:
    """One node's name and the file its agent writes (a ClassAd line, see ``HTCondorBatch.set_node_tag``).
    ``prefix`` is a local-name prefix (``NODEB.``) for a second startd under one condor_master."""
    return f'{prefix}{NODE_NAME_ATTR} = "{node}"\n{prefix}STARTD_CRON_{CRON_JOB}_ARGS = {agent_file}\n'


# What a user writes in a submit file (+MigRequest = "20G"), and the tag field each becomes.
REQUEST_ATTRS = {"MigRequest": "req", "MigCompute": "compute", "MigModel": "model", "MigMoldable": "moldable"}
# A count after the request (1g.10gb:4) asks for that many instances on one node, one per rank (docs/flex.md). The
# agent serves any count of at least one, for a rigid request: not with MigMoldable (one instance of a size
# mig-batchd chooses). Whether a node holds that many is the controller's to say (it keeps the job held, naming why).
INSTANCES = ('(MigRequest is undefined || (!regexp(":0*$", MigRequest) && (MigMoldable is undefined '
             '|| !regexp(":[0-9]+$", MigRequest) || regexp(":0*1$", MigRequest))))')  # fmt: skip
SPEC = 'replaceall(":[0-9]*$", MigRequest, "")'  # the request without its count: 1g.10gb:4 -> 1g.10gb
SAFE_VALUE = "^[A-Za-z0-9.:,_-]+$"  # no ';' or '=': a value cannot add fields (a place=) to the tag

# A subjob chain (``migsub --atomize``, docs/htcondor.md "Subjob chains"): the user's attributes, and the tag field
# each becomes. The schedd's transform turns them into the tag's atomize fields, as job_submit.lua does on Slurm.
CHAIN_ATTRS = {"MigCheckpointDir": "ckpt", "MigSubjobMin": "smin", "MigSubjobMax": "smax", "MigDeadline": "deadline"}
CHAIN_DEFAULTS = {"MigSubjobMin": 60, "MigSubjobMax": 3600}  # as migsub's --subjob-min, --subjob-max
SAFE_DIR = "^/[A-Za-z0-9._/+-]*$"  # absolute; no ';', '=' or space: the folder cannot add fields to the tag
UP_DIR = "(^|/)[.][.](/|$)"  # a '..' component: the folder would name another than it seems
# A chain is one HTCondor job that runs each of its subjobs in turn: one that ends otherwise than with 0 (75:
# checkpointed, more to do; anything else: failed or killed) is held by this policy, with this reason and subcode
# (HoldReasonCode 3, JobPolicy), and stays in the queue until mig-batchd grants its next subjob.
CHAIN_HOLD_REASON = "mig-batch: subjob ended"
CHAIN_HOLD_SUBCODE = 75
JOB_POLICY_HOLD = 3  # HoldReasonCode of a hold by the job's policy expressions (OnExitHold)


def _tag_expression() -> str:
    """The ClassAd expression that builds the tag from the user's request attributes."""
    parts = [f'"{MANAGED_PREFIX}v1;req=", MigRequest']
    for attr, name in list(REQUEST_ATTRS.items())[1:]:
        parts.append(f'ifThenElse({attr} isnt undefined, strcat(";{name}=", {attr}), "")')
    chain = ['";atomize=1;ckpt=", MigCheckpointDir']
    for attr, default in CHAIN_DEFAULTS.items():
        chain.append(f'";{CHAIN_ATTRS[attr]}=", ifThenElse({attr} isnt undefined, {attr}, {default})')
    chain.append('ifThenElse(MigDeadline isnt undefined, strcat(";deadline=", MigDeadline), "")')
    parts.append(f'ifThenElse(MigCheckpointDir isnt undefined, strcat({", ".join(chain)}), "")')
    return f"strcat({', '.join(parts)})"


def _chain_expression() -> str:
    """True for a job that is no chain, or a well-formed one: a request of one instance, not moldable; an
    absolute checkpoint folder of safe characters; whole seconds, 0 < MigSubjobMin <= MigSubjobMax; a whole
    epoch for MigDeadline."""
    none = " && ".join(f"{a} is undefined" for a in CHAIN_ATTRS)
    whole = [f"({a} is undefined || (isInteger({a}) && {a} > 0))" for a in (*CHAIN_DEFAULTS, "MigDeadline")]
    low, high = (f"ifThenElse({a} isnt undefined, {a}, {d})" for a, d in CHAIN_DEFAULTS.items())
    return (f'(({none}) || (MigRequest isnt undefined && MigMoldable is undefined '
            f'&& (!regexp(":[0-9]*$", MigRequest) || regexp(":0*1$", MigRequest)) '
            f'&& isString(MigCheckpointDir) && regexp("{SAFE_DIR}", MigCheckpointDir) '
            f'&& !regexp("{UP_DIR}", MigCheckpointDir) && {" && ".join(whole)} '
            f"&& {low} <= {high}))")


def _fits_expression(models: Sequence[GpuModel]) -> str:
    """True when ``MigRequest`` could fit the largest MIG profile of ``models`` (memory forms 20G, 20GB,
    20GiB, 20000M, compute slices 3g, a profile name); other text passes here and is the controller's
    to refuse. Binary units for G/M/T as ``request.parse_memory``; decimal for GB/MB/TB."""
    mib = max(m.largest_profile.memory_mib for m in models)
    slices = max(m.largest_profile.compute_slices for m in models)
    # one alternation of the profile names ('.' and '+' in brackets: no backslashes through two parsers)
    names = "|".join(sorted({p.name for m in models for p in m.profiles})).replace(".", "[.]").replace("+", "[+]")
    number = f'real(replaceall("[^0-9.]", {SPEC}, ""))'
    clauses = [(f'regexp("^[0-9]+g$", {SPEC})', f"{number} <= {slices}"),  # lower-case g: compute slices
               (f'regexp("^[0-9]+g[.]", {SPEC})', f'regexp("^({names})$", toLower({SPEC}))')]
    for power, letter in enumerate("KMGT", start=1):  # as request.parse_memory: 3G and 3GiB binary, 3GB decimal
        for suffix, base in (("(iB)?", 1024), ("B", 1000)):
            scale = base**power / 2**20  # MiB per unit
            pattern = f'regexp("^[0-9.]+{letter}{suffix}$", {SPEC}, "i")'
            clauses.append((pattern, f"{number} * {scale!r} <= {mib}"))
    expression = "true"
    for condition, value in reversed(clauses):
        expression = f"ifThenElse({condition}, {value}, {expression})"
    return f"(MigRequest is undefined || {expression})"


def chain_description(description: dict[str, str], checkpoint_dir: str, min_s: float, max_s: float,
                      deadline: float | None) -> dict[str, str]:  # fmt: skip
    """``description`` (migsub's submit description) with a subjob chain's attributes: whole seconds (the schedd
    takes only those), the durations rounded up so that 0 < min <= max holds as it did. ValueError naming what a
    ``#CONDOR`` line already set, and the folder when the schedd would refuse it."""
    ours = {a.lower() for a in CHAIN_ATTRS}
    taken = [k for k in description if k.lower().removeprefix("my.").removeprefix("+") in ours]
    if taken:
        raise ValueError(f"{taken[0]} is migsub's to write for --atomize (from --checkpoint-dir, --subjob-min, "
                         "--subjob-max, --deadline)")  # fmt: skip
    if not re.fullmatch(SAFE_DIR.strip("^$"), checkpoint_dir) or re.search(UP_DIR, checkpoint_dir):
        raise ValueError(f"the checkpoint directory {checkpoint_dir!r} must be absolute, without '..', and hold only "
                         "letters, digits and . _ / + - on HTCondor")  # fmt: skip
    values = {"MigCheckpointDir": checkpoint_dir, "MigSubjobMin": math.ceil(min_s), "MigSubjobMax": math.ceil(max_s)}
    if deadline is not None:
        values["MigDeadline"] = math.ceil(deadline)
    return {**description, **{f"MY.{attr}": json.dumps(value) for attr, value in values.items()}}


def largest_profile_text(models: Sequence[GpuModel]) -> str:
    """``7g.80gb on A100-80GB (81920 MiB, 7 compute slices)``: what an impossible request is told."""
    model = max(models, key=lambda m: (m.largest_profile.memory_mib, m.largest_profile.compute_slices))
    p = model.largest_profile
    return f"{p.name} on {model.name} ({p.memory_mib} MiB, {p.compute_slices} compute slices)"


def schedd_config(controller: str, models: Sequence[GpuModel] = (), agents: Sequence[str] = ()) -> str:
    """Schedd config: the controller's identity (and the node agents', which write their reports into
    the tag) are queue superusers (on 25.x each also needs a schedd user record, ``condor_qusers -add``)
    and only they may change the placement attributes. The owner may still set them at submission
    (observed), so a job transform drops both from every new job and builds the tag from the request
    attributes; a submit requirement refuses values that could add fields to the tag, and, given the
    site's ``models``, one refuses a request larger than their largest profile, naming it."""
    checks = " && ".join(f'({a} is undefined || regexp("{SAFE_VALUE}", {a}))' for a in REQUEST_ATTRS)
    fits: list[str] = []
    if models:
        names = ", ".join(sorted(m.name for m in models))
        fits = [
            "SUBMIT_REQUIREMENT_NAMES = $(SUBMIT_REQUIREMENT_NAMES) MigBatchFits",
            f"SUBMIT_REQUIREMENT_MigBatchFits = {_fits_expression(models)}",
            f'SUBMIT_REQUIREMENT_MigBatchFits_REASON = strcat("MigRequest ", MigRequest, " fits no MIG profile of '
            f'{names}; the largest is {largest_profile_text(models)}")',
        ]
    superusers = ", ".join(dict.fromkeys([controller, *agents]))
    return "\n".join([
        f"QUEUE_SUPER_USERS = $(QUEUE_SUPER_USERS), {superusers}",
        # and the subjob's limits: its window's backstop and the hold that ends each subjob
        f"PROTECTED_JOB_ATTRS = $(PROTECTED_JOB_ATTRS) {TAG_ATTR} {PIN_ATTR} {STARTS_ATTR} {TIME_LIMIT_ATTR} "
        "OnExitHold OnExitHoldReason OnExitHoldSubCode",
        "JOB_TRANSFORM_NAMES = $(JOB_TRANSFORM_NAMES) MigBatchClear MigBatchTag MigBatchChain",
        "JOB_TRANSFORM_MigBatchClear @=end",
        # the request and chain attributes as the values they have now, before anything below changes the ad: an
        # expression could read one way to the submit requirements and another to the tag's transform (it may
        # test the tag deleted next; a hostile review wrote ;chain= into a tag that way)
        *(f"   EVALSET {a} {a}" for a in (*REQUEST_ATTRS, *CHAIN_ATTRS)),
        f"   DELETE {TAG_ATTR}",
        f"   DELETE {PIN_ATTR}",
        f"   DELETE {STARTS_ATTR}",
        "@end",
        "JOB_TRANSFORM_MigBatchTag @=end",
        "   REQUIREMENTS MigRequest isnt undefined",
        f"   EVALSET {TAG_ATTR} {_tag_expression()}",
        "@end",
        "JOB_TRANSFORM_MigBatchChain @=end",  # a chain's subjob that did not finish it stays queued, held
        "   REQUIREMENTS MigCheckpointDir isnt undefined",
        "   SET OnExitHold (ExitBySignal =?= true) || (ExitCode =!= 0)",
        f'   SET OnExitHoldReason "{CHAIN_HOLD_REASON}"',
        f"   SET OnExitHoldSubCode {CHAIN_HOLD_SUBCODE}",
        "@end",
        "SUBMIT_REQUIREMENT_NAMES = $(SUBMIT_REQUIREMENT_NAMES) MigBatchRequest",
        f"SUBMIT_REQUIREMENT_MigBatchRequest = {checks}",
        f'SUBMIT_REQUIREMENT_MigBatchRequest_REASON = "{", ".join(REQUEST_ATTRS)} may hold only letters, '
        'digits and . : , _ -"',
        "SUBMIT_REQUIREMENT_NAMES = $(SUBMIT_REQUIREMENT_NAMES) MigBatchChain",
        f"SUBMIT_REQUIREMENT_MigBatchChain = {_chain_expression()}",
        f'SUBMIT_REQUIREMENT_MigBatchChain_REASON = "a subjob chain ({", ".join(CHAIN_ATTRS)}) needs MigRequest of one '
        'instance, not MigMoldable; an absolute MigCheckpointDir of letters, digits and . _ / + -; whole seconds '
        '0 < MigSubjobMin <= MigSubjobMax (defaults 60, 3600); MigDeadline in whole epoch seconds"',
        # condor_submit -i: the job is an sshd, whose sessions get the job's environment from the starter, not
        # the wrapper's binding (CUDA_VISIBLE_DEVICES, the fence's device access): refused rather than half bound
        "SUBMIT_REQUIREMENT_NAMES = $(SUBMIT_REQUIREMENT_NAMES) MigBatchBatchOnly",
        "SUBMIT_REQUIREMENT_MigBatchBatchOnly = MigRequest is undefined || InteractiveJob =!= true",
        'SUBMIT_REQUIREMENT_MigBatchBatchOnly_REASON = "a MIG job (MigRequest) cannot be interactive (condor_submit '
        '-i): submit it as a batch job (docs/htcondor.md, Limits)"',
        "SUBMIT_REQUIREMENT_NAMES = $(SUBMIT_REQUIREMENT_NAMES) MigBatchInstances",
        f"SUBMIT_REQUIREMENT_MigBatchInstances = {INSTANCES}",
        'SUBMIT_REQUIREMENT_MigBatchInstances_REASON = strcat("MigRequest ", MigRequest, ": give at least one '
        'instance (1g.10gb:4 is four on one node); a moldable job (MigMoldable) gets one")',
        *fits,
        "",
    ])  # fmt: skip
