"""PyTorch DDP over gloo, one rank per MIG instance of a multi-instance job (``migsub --instances N``).

Run one rank per task with srun (the TaskProlog gives each task its own instance)::

    srun python flex_ddp_gloo.py

or with torchrun inside the batch script (each worker picks its instance from MIG_BATCH_INSTANCES by
LOCAL_RANK before CUDA starts)::

    torchrun --standalone --nproc-per-node="$MIG_BATCH_INSTANCE_COUNT" flex_ddp_gloo.py

It checks that every rank saw exactly one MIG device, all distinct, and that one DDP step's all-reduced
gradient equals the gradient of the same step in a single process over the whole batch. gloo, not NCCL:
unmodified NCCL refuses several MIG instances of one GPU in one communicator (docs/flex.md). Tensors
stay on the CPU where CUDA is not usable (the emulated GPUs of the test bed); on a real node pass
``--device cuda`` to compute on each rank's instance (gloo then copies through host memory).
Prints one line ``flex-ddp: ...`` from rank 0 and exits non-zero when a check fails.
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def bind_rank_instance() -> str:
    """This rank's MIG device: under torchrun, the LOCAL_RANK-th of MIG_BATCH_INSTANCES (all workers
    inherit the batch step's CUDA_VISIBLE_DEVICES); under srun the TaskProlog has set it already."""
    instances = [u for u in os.environ.get("MIG_BATCH_INSTANCES", "").split(",") if u]
    if "LOCAL_RANK" in os.environ and instances:
        os.environ["CUDA_VISIBLE_DEVICES"] = instances[int(os.environ["LOCAL_RANK"])]
    return os.environ.get("CUDA_VISIBLE_DEVICES", "")


def rendezvous() -> tuple[int, int]:
    """(rank, world size) from torchrun's variables, else from srun's; one node, so a local address."""
    if "RANK" not in os.environ:
        os.environ["RANK"] = os.environ["SLURM_PROCID"]
        os.environ["WORLD_SIZE"] = os.environ["SLURM_NTASKS"]
        os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
        os.environ.setdefault("MASTER_PORT", str(20000 + int(os.environ.get("SLURM_JOB_ID", "0")) % 20000))
    return int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda: this rank's MIG instance")
    parser.add_argument("--batch", type=int, default=64, help="the whole batch (split evenly over the ranks)")
    args = parser.parse_args()
    device = bind_rank_instance()  # before torch initialises CUDA
    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    rank, world = rendezvous()
    dist.init_process_group("gloo")
    seen: list[str] = [""] * world
    dist.all_gather_object(seen, device)

    torch.manual_seed(0)  # the same model and data on every rank and in the reference
    model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).double()
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1)).double()
    reference.load_state_dict(model.state_dict())
    inputs, targets = torch.randn(args.batch, 16, dtype=torch.float64), torch.randn(args.batch, 1, dtype=torch.float64)
    if args.batch % world:
        raise SystemExit(f"--batch {args.batch} does not split over {world} ranks")
    share = args.batch // world

    ddp = DistributedDataParallel(model.to(args.device))
    mine = slice(rank * share, (rank + 1) * share)
    loss = torch.nn.functional.mse_loss(ddp(inputs[mine].to(args.device)), targets[mine].to(args.device))
    loss.backward()  # DDP all-reduces (averages) the gradients over the ranks here

    torch.nn.functional.mse_loss(reference(inputs), targets).backward()  # one process, the whole batch
    error = max((p.grad.cpu() - q.grad).abs().max().item() for p, q in zip(model.parameters(), reference.parameters(),
                                                                          strict=True))  # fmt: skip
    errors: list[float] = [0.0] * world
    dist.all_gather_object(errors, error)
    dist.barrier()  # no rank tears gloo down while another still talks
    dist.destroy_process_group()

    one_each = all(u.startswith("MIG-") and "," not in u for u in seen)
    distinct = len(set(seen)) == world
    equal = max(errors) < 1e-12
    if rank == 0:
        print("flex-ddp: " + json.dumps({"world": world, "uuids": seen, "one_mig_each": one_each, "distinct": distinct,
                                         "max_grad_error": max(errors), "equal": equal}), flush=True)  # fmt: skip
    return 0 if one_each and distinct and equal else 1


if __name__ == "__main__":
    sys.exit(main())
