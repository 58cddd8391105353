"""``python -I -m mig_batch.slurm.hooks prolog|epilog|agent``: what the generated hooks and the C hook client
run when the agent does not answer; the main lives with the daemons' mains."""

import sys

from mig_batch.cli.daemons import slurm_hook_main

sys.exit(slurm_hook_main())
