"""``python -m mig_batch.controller``: the same as ``mig-batchd``."""

import sys

from mig_batch.cli.cluster_commands import daemon_main

sys.exit(daemon_main())
