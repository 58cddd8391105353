"""Decision and chain life cycles, with their allowed transitions in one place.

A decision (one managed job's placement) moves
  decided -> released -> running -> ended
with ``requeue`` (the node could not place it) -> ``requeued`` -> decided again, and ``ended`` or
``requeued`` may be decided again when the job comes back (a requeue by Slurm, a chain's fallback).
A chain moves waiting -> granted -> running -> waiting ... and ends done, failed or cancelled.
"""

from __future__ import annotations

import enum


class DecisionState(enum.StrEnum):
    DECIDED = "decided"  # recorded, not yet applied to the batch system
    RELEASED = "released"  # pinned to its node and released
    RUNNING = "running"
    REQUEUE = "requeue"  # the node could not place it: the controller requeues it
    REQUEUED = "requeued"
    ENDED = "ended"


ACTIVE = (DecisionState.DECIDED, DecisionState.RELEASED, DecisionState.RUNNING, DecisionState.REQUEUE)
DECIDABLE = (DecisionState.ENDED, DecisionState.REQUEUED)  # a job in these states may be decided again

_D = DecisionState
DECISION_TRANSITIONS: dict[DecisionState, frozenset[DecisionState]] = {
    _D.DECIDED: frozenset({_D.DECIDED, _D.RELEASED, _D.RUNNING, _D.REQUEUE, _D.REQUEUED, _D.ENDED}),
    _D.RELEASED: frozenset({_D.RUNNING, _D.REQUEUE, _D.REQUEUED, _D.ENDED, _D.DECIDED}),
    _D.RUNNING: frozenset({_D.REQUEUE, _D.ENDED, _D.REQUEUED}),
    _D.REQUEUE: frozenset({_D.REQUEUED, _D.ENDED}),
    _D.REQUEUED: frozenset({_D.DECIDED}),
    _D.ENDED: frozenset({_D.DECIDED}),
}


class ChainState(enum.StrEnum):
    WAITING = "waiting"
    GRANTED = "granted"
    RUNNING = "running"
    DONE = "done"
    FAILED = "failed"
    CANCELLED = "cancelled"


CHAIN_OVER = (ChainState.DONE, ChainState.FAILED, ChainState.CANCELLED)
_C = ChainState
CHAIN_TRANSITIONS: dict[ChainState, frozenset[ChainState]] = {
    _C.WAITING: frozenset({_C.GRANTED, _C.RUNNING, _C.WAITING, *CHAIN_OVER}),
    _C.GRANTED: frozenset({_C.RUNNING, _C.WAITING, *CHAIN_OVER}),
    _C.RUNNING: frozenset({_C.WAITING, *CHAIN_OVER}),
    _C.DONE: frozenset(),
    _C.FAILED: frozenset(),
    _C.CANCELLED: frozenset(),
}


class TransitionError(ValueError):
    pass


def check_decision(old: str | None, new: str) -> None:
    if old is not None and DecisionState(new) not in DECISION_TRANSITIONS[DecisionState(old)]:
        raise TransitionError(f"a decision cannot go from {old} to {new}")


def check_chain(old: str | None, new: str) -> None:
    if old is not None and ChainState(new) not in CHAIN_TRANSITIONS[ChainState(old)]:
        raise TransitionError(f"a chain cannot go from {old} to {new}")
