#!/bin/bash
# Read-only device probe. Writes everything under $OUT.
set -u
cd "$(dirname "$0")"
PY=$(command -v python3 || command -v python || ls /usr/bin/python3* 2>/dev/null | head -1)
{ echo "PY=$PY"; $PY --version; uname -a; cat /etc/os-release | head -3; date -u;
  ls -l /usr/lib/x86_64-linux-gnu 2>/dev/null | grep -i nvidia-ml; ldconfig -p | grep -i nvidia-ml;
  command -v unzip; } > "$OUT/env.txt" 2>&1
run() { local f="$1"; shift; { echo "\$ $*"; "$@"; echo "[rc=$?]"; } > "$OUT/$f" 2>&1; }
run nvidia-smi.txt nvidia-smi
nvidia-smi -q > "$OUT/nvidia-smi-q-full.txt" 2>&1; head -80 "$OUT/nvidia-smi-q-full.txt" > "$OUT/nvidia-smi-q-head80.txt"
run nvidia-smi-mig-lgip.txt nvidia-smi mig -lgip
run nvidia-smi-mig-lgipp.txt nvidia-smi mig -lgipp
run nvidia-smi-mig-lgi.txt nvidia-smi mig -lgi
run nvidia-smi-query.txt nvidia-smi --query-gpu=index,name,uuid,driver_version,memory.total,mig.mode.current,mig.mode.pending --format=csv
for w in wheels/*.whl; do
  v=$(basename "$w" | cut -d- -f2); d=/tmp/gpuprobe-pkg/$v; mkdir -p "$d"
  if command -v unzip >/dev/null; then unzip -qo "$w" -d "$d"; else $PY -m zipfile -e "$w" "$d"; fi
  PYTHONPATH="$d" timeout 150 $PY -X faulthandler probe.py "$OUT/nvml-$v.json" > "$OUT/probe-$v.log" 2>&1
  echo "[rc=$?]" >> "$OUT/probe-$v.log"
done
ls -l "$OUT"
cd "$OUT" && tar czf /tmp/gpuprobe-all.tar.gz . && rm -f ./* && mv /tmp/gpuprobe-all.tar.gz "$OUT/all.tar.gz" && ls -l "$OUT"
