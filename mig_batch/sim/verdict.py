"""How placement experiments rank policies: by served demand, with starvation marked (issue 20).

A count of accepted requests rewards refusing the large ones (MCC and GRMU "win" by refusing nearly
every 7g request). So every experiment reports, beside the count, the demand served (accepted
memory-slice time) and the acceptance of each profile, and marks a profile as *starved* by a policy
when that policy accepts it at less than half the rate the first-fit reference gives it. Policies are
ranked by served demand; a policy that starves any profile ranks after every policy that does not.

The reference is ``nvidia`` (first GPU where the profile fits, NVIDIA's default start; GRMU's FF),
the MIG-aware first fit: the MIG-agnostic ``ff`` of MFI §VI refuses requests on GPUs it picked by
free capacity alone, which would make a weak yardstick.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

REFERENCE_POLICY = "nvidia"
STARVATION_RATIO = 0.5


def acceptance_by_profile(arrived: Mapping[str, float], accepted: Mapping[str, float]) -> dict[str, float]:
    """Accepted / arrived per profile that arrived at least once."""
    return {p: accepted.get(p, 0) / n for p, n in sorted(arrived.items()) if n}


def starved_profiles(rates: Mapping[str, float], reference: Mapping[str, float]) -> list[str]:
    """Profiles accepted at less than ``STARVATION_RATIO`` x the reference policy's rate."""
    return sorted(p for p, ref in reference.items() if rates.get(p, 0.0) < STARVATION_RATIO * ref)


def mark_starvation(per_policy: Mapping[str, dict[str, Any]], reference: str = REFERENCE_POLICY) -> None:
    """Add ``starved`` (list of profiles) to every policy summary; needs ``acceptance_by_profile``."""
    if reference not in per_policy:
        raise ValueError(f"starvation is judged against {reference!r}, which was not run")
    ref = per_policy[reference]["acceptance_by_profile"]
    for summary in per_policy.values():
        summary["starved"] = starved_profiles(summary["acceptance_by_profile"], ref)


def ranked(per_policy: Mapping[str, Mapping[str, Any]], served_key: str = "served") -> list[str]:
    """Policy names, best first: no starvation before starvation, then the most served demand,
    then the most accepted requests, then the name (for a stable order)."""
    return sorted(
        per_policy,
        key=lambda p: (
            bool(per_policy[p].get("starved")),
            -per_policy[p][served_key],
            -per_policy[p].get("accepted", 0),
            p,
        ),
    )


def starvation_note(summary: Mapping[str, Any]) -> str:
    starved = summary.get("starved") or []
    return "starves " + ", ".join(starved) if starved else ""
