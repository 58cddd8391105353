"""``python -m mig_batch.controller``: the same as ``mig-batchd``."""

import sys

from mig_batch.cli.daemons import batchd_main

sys.exit(batchd_main())
