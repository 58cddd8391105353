#!/bin/bash
# A batch script for migsub --atomize: each subjob runs the training until its window closes.
#SBATCH --cpus-per-task=1
exec "${PYTHON:-python3}" "$(dirname "$0")/train_torch.py"
