"""Slurm Prolog / Epilog on the node: create the job's MIG instance, destroy it afterwards.

Both always exit 0: a failing Prolog drains the node and a failing Epilog too, so problems are
recorded as events (and, in the prolog, as a ``requeue`` request the controller carries out) instead.
The placement comes from the state store, written by the controller; nothing a user can set is read.
If the decided spot is taken (stale decision), the prolog places by MFI among this node's GPUs,
from the GPUs' real instances, and records that it did. The job's ``CUDA_VISIBLE_DEVICES`` goes into
``<job_dir>/<job id>`` for the TaskProlog (``export NAME=value`` lines).

Run as ``python -m mig_batch.slurm.hooks prolog|epilog`` (the shims in wrappers/ do, with PATH set).
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Mapping
from pathlib import Path

from mig_batch.config import SiteConfig, load_config, open_backend
from mig_batch.controller.tags import parse_tag, profiles_by_model
from mig_batch.gpu.base import GpuBackend, InsufficientResources, InUse, NotFound
from mig_batch.placement.base import Placement, PlacementRequest
from mig_batch.placement.cluster import Cluster, Gpu
from mig_batch.placement.policies import make_policy
from mig_batch.state import Decision, InstanceRecord, Store
from mig_batch.subjob import ENV_DEADLINE, ENV_MARGIN


def _job_file(config: SiteConfig, job: str) -> Path:
    return config.job_dir / job


def _write_job_file(config: SiteConfig, job: str, lines: list[str]) -> None:
    config.job_dir.mkdir(parents=True, exist_ok=True)
    path = _job_file(config, job)
    tmp = path.with_suffix(".tmp")
    tmp.write_text("".join(f"{line}\n" for line in lines))
    tmp.chmod(0o644)
    os.replace(tmp, path)


def node_view(backend: GpuBackend, node: str) -> Cluster:
    """This node's GPUs with their real instances, for a local placement."""
    gpus = backend.gpus()
    view = Cluster([Gpu(g.index, node, g.index, g.model) for g in gpus])
    for g in gpus:
        for inst in backend.instances(g.index):
            view.allocate(g.index, f"gi{g.index}.{inst.gi_id}", inst.profile, inst.start)
    return view


def place_locally(backend: GpuBackend, node: str, decision: Decision, policy: str = "mfi") -> Placement | None:
    """Where on this node the job fits by ``policy``: the decided profile on GPUs of the decided model
    (a moldable job keeps its chosen size), the request's translation on the others."""
    view = node_view(backend, node)
    models = {g.model for g in view.gpus}
    profiles = profiles_by_model(parse_tag(decision.request), models)
    profiles = {} if isinstance(profiles, str) else profiles
    if decision.model in models:
        profiles[decision.model] = decision.profile
    if not profiles:
        return None
    decision = make_policy(policy).decide(view, PlacementRequest("job", profiles))
    return decision if isinstance(decision, Placement) else None


def _subjob_exports(config: SiteConfig, store: Store, job: str) -> list[str]:
    """A chain's subjob starts now: its deadline (the granted window from now) for the runner."""
    sub = store.start_subjob(job)
    if sub is None or sub.deadline is None:
        return []
    margin = min(config.atomize.checkpoint_margin_s, sub.window_s / 4)  # short windows still do work
    return [f"export {ENV_DEADLINE}={sub.deadline:.3f}", f"export {ENV_MARGIN}={margin:.3f}",
            f"export MIG_BATCH_SUBJOB={sub.run}"]  # fmt: skip


def prolog(config: SiteConfig, env: Mapping[str, str]) -> None:
    job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    store = Store(config.state)
    try:
        decision = store.decision(job)
        if decision is None or decision.state not in ("decided", "released", "running"):
            return  # not a managed job
        backend = open_backend(config, node)
        existing = store.instance(job)
        if existing is not None and existing.node == node and backend.find(existing.uuid) is not None:
            _write_job_file(config, job, [f"export CUDA_VISIBLE_DEVICES={existing.uuid}",
                                          *_subjob_exports(config, store, job)])  # fmt: skip
            return  # the prolog ran before for this job (e.g. a requeue on the same node)
        gpu, profile, start = decision.gpu, decision.profile, decision.start
        try:
            if decision.node != node:
                raise InsufficientResources(f"decided for {decision.node}, running on {node}")
            inst = backend.create(gpu, profile, start)
        except InsufficientResources as exc:
            local = place_locally(backend, node, decision, config.policy)
            if local is None:
                store.set_state(job, "requeue", node=node, reason=f"decided spot taken ({exc}); nothing fits on {node}")
                _write_job_file(config, job, ["export CUDA_VISIBLE_DEVICES=NoDevFiles"])
                return
            inst = backend.create(local.gpu_index, local.profile, local.start)
            store.event(job, "prolog-replaced", node=node, decided=f"{decision.gpu}/{profile}@{start}",
                        placed=f"{local.gpu_index}/{local.profile}@{local.start}", reason=str(exc))  # fmt: skip
        store.record_instance(InstanceRecord(job, node, inst.gpu, inst.profile, inst.start, inst.gi_id, inst.uuid))
        where = f"{node}/{inst.gpu}/{inst.profile}@{inst.start}"
        _write_job_file(config, job, [f"export CUDA_VISIBLE_DEVICES={inst.uuid}", f"export MIG_BATCH_INSTANCE={where}",
                                      *_subjob_exports(config, store, job)])  # fmt: skip
    except Exception as exc:  # never fail the prolog: that would drain the node
        store.event(job, "prolog-error", node=node, error=f"{type(exc).__name__}: {exc}")
        with contextlib.suppress(Exception):
            store.set_state(job, "requeue", node=node, reason=str(exc))
    finally:
        store.close()


def epilog(config: SiteConfig, env: Mapping[str, str], attempts: int = 10) -> None:
    job, node = env.get("SLURM_JOB_ID", ""), env.get("SLURMD_NODENAME", "")
    store = Store(config.state)
    try:
        _job_file(config, job).unlink(missing_ok=True)
        record = store.instance(job)
        if record is None:
            return  # nothing created, or destroyed by an earlier run of this epilog
        backend = open_backend(config, node)
        for attempt in range(attempts):
            try:
                backend.destroy(record.gpu, record.gi_id)
                break
            except NotFound:
                break  # already gone: idempotent
            except InUse:
                if attempt == attempts - 1:
                    store.event(job, "epilog-in-use", node=node, gpu=record.gpu, gi_id=record.gi_id)
                    return  # keep the record: the controller reports it as a leak to clean up
                time.sleep(0.5)  # the job's processes are still exiting
        store.forget_instance(job, node=node, gpu=record.gpu, profile=record.profile, start=record.start)
    except Exception as exc:  # never fail the epilog either
        store.event(job, "epilog-error", node=node, error=f"{type(exc).__name__}: {exc}")
    finally:
        store.close()


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if not args or args[0] not in ("prolog", "epilog"):
        print("usage: python -m mig_batch.slurm.hooks prolog|epilog", file=sys.stderr)
        return 0
    try:
        config = load_config()
    except Exception as exc:
        print(f"mig-batch {args[0]}: {exc}", file=sys.stderr)
        return 0
    (prolog if args[0] == "prolog" else epilog)(config, os.environ)
    return 0


if __name__ == "__main__":
    sys.exit(main())
