"""A PyTorch (CPU) training job that runs as a chain of subjobs and resumes bit-exactly.

Each subjob restores model, optimizer, the data order generator and every RNG (torch, numpy,
random) from the latest checkpoint, trains until the scheduler's window is about to close
(``Subjob.should_checkpoint``), checkpoints and exits 75; the last one writes ``final.pt`` and exits
0. Run it uninterrupted (no deadline) or through ``migsub --atomize``; the final weights are the same
bit for bit (``sha256`` printed at the end).

    migsub --atomize --checkpoint-dir $HOME/ckpt/demo --gpu-mem 6G \
           --subjob-min 5s --subjob-max 10m docs/examples/train_torch.sh

Environment knobs for demos and tests: TRAIN_STEPS (default 300), TRAIN_STEP_SLEEP (seconds of
extra "work" per step, default 0), TRAIN_PROGRESS_FILE (append one JSON line per event to watch a
subjob: its start, with the process id, resume step and window deadline; each step; its end).
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import random
import time

import numpy as np
import torch

from mig_batch.subjob import Subjob

STEPS = int(os.environ.get("TRAIN_STEPS", "300"))
STEP_SLEEP = float(os.environ.get("TRAIN_STEP_SLEEP", "0"))
PROGRESS = os.environ.get("TRAIN_PROGRESS_FILE")
BATCH = 32


def report(event: str, step: int, **fields: object) -> None:
    if PROGRESS:
        with open(PROGRESS, "a") as f:
            f.write(json.dumps({"event": event, "pid": os.getpid(), "step": step, **fields}) + "\n")


def make_data(seed: int = 1234) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(2048, 16, generator=g)
    w = torch.randn(16, 1, generator=g)
    return x, x @ w + 0.1 * torch.randn(2048, 1, generator=g)


def weights_digest(model: torch.nn.Module) -> str:
    buffer = io.BytesIO()
    for name, tensor in sorted(model.state_dict().items()):
        buffer.write(name.encode())
        buffer.write(tensor.detach().numpy().tobytes())
    return hashlib.sha256(buffer.getvalue()).hexdigest()


def main() -> None:
    sj = Subjob()
    torch.manual_seed(0)
    np.random.seed(0)
    random.seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU(), torch.nn.Dropout(0.1), torch.nn.Linear(64, 1))
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    order = torch.Generator().manual_seed(42)  # the data order: part of the state
    x, y = make_data()
    step, loss = 0, float("nan")
    latest = sj.latest()
    if latest is not None:
        state = torch.load(latest, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        order.set_state(state["order"])
        torch.set_rng_state(state["torch_rng"])
        np.random.set_state(state["numpy_rng"])
        random.setstate(state["python_rng"])
        step, loss = state["step"], state["loss"]
    first = step
    print(f"subjob {os.environ.get('SLURM_JOB_ID', 'local')}.{os.environ.get('SLURM_RESTART_COUNT', '0')}: "
          f"resume at step {step}", flush=True)
    report("start", step, job=os.environ.get("SLURM_JOB_ID"), subjob=os.environ.get("MIG_BATCH_SUBJOB"),
           deadline=sj.deadline, margin=sj.margin)  # fmt: skip

    def save(path) -> None:
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(), "order": order.get_state(),
                    "torch_rng": torch.get_rng_state(), "numpy_rng": np.random.get_state(),
                    "python_rng": random.getstate(), "step": step, "loss": loss}, path)

    model.train()
    while step < STEPS:
        if sj.should_checkpoint():
            sj.save(save, step)
            print(f"progress {first} {step} checkpointed", flush=True)
            report("checkpointed", step)
            sj.pause()
        idx = torch.randperm(len(x), generator=order)[:BATCH]
        optimizer.zero_grad()
        batch_loss = torch.nn.functional.mse_loss(model(x[idx]), y[idx])
        batch_loss.backward()
        optimizer.step()
        loss = batch_loss.item()
        step += 1
        if STEP_SLEEP:
            time.sleep(STEP_SLEEP)
        report("step", step)
    sj.save(save, step)
    torch.save(model.state_dict(), sj.directory / "final.pt")
    print(f"progress {first} {step} done", flush=True)
    report("done", step)
    print(f"final loss {loss!r} sha256 {weights_digest(model)}", flush=True)
    sj.done()


if __name__ == "__main__":
    main()
