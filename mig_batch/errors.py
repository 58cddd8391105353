"""The root of mig_batch's user-facing errors.

Every error a user can cause (bad input, missing files, a site whose Slurm is unreachable) derives from
``MigBatchError``; the entry points turn it into a one-line message and exit status 2. Errors that mean a
bug in mig_batch itself (``PlacementConflict``, ``TransitionError``) deliberately do not.
"""

from __future__ import annotations


class MigBatchError(Exception):
    """Something the user or the site can fix; ``str()`` names what was wrong and what is accepted."""
