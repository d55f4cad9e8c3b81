#!/bin/bash
# Usage: interop/header_scan/scan.sh 2.0.1 2.1.2 ...   (HDRSCAN_DIR, default /tmp/hdrscan)
# Downloads each torch wheel (pip download --no-deps, ~0.5-0.9 GB), extracts the c10d headers,
# the TCPStore .pyi and rendezvous.py into $HDRSCAN_DIR/out/<version>/, deletes the wheel.
# Then: python3 interop/header_scan/summarize.py $HDRSCAN_DIR/out
set -u
mkdir -p "${HDRSCAN_DIR:-/tmp/hdrscan}" && cd "${HDRSCAN_DIR:-/tmp/hdrscan}"
for v in "$@"; do
  [ -f out/$v/.done ] && continue
  rm -rf dl; mkdir -p dl out/$v
  t0=$(date +%s)
  if ! pip download -q --no-deps "torch==$v" -d dl >out/$v/pip.log 2>&1; then echo "$v DOWNLOAD FAILED"; continue; fi
  w=$(ls dl/*.whl); ls -l $w > out/$v/wheel.txt
  unzip -q -o "$w" 'torch/include/torch/csrc/distributed/c10d/*' 'torch/_C/_distributed_c10d.pyi' 'torch/distributed/rendezvous.py' 'torch/distributed/distributed_c10d.py' 'torch/version.py' -d out/$v 2>>out/$v/pip.log
  rm -rf dl
  touch out/$v/.done
  echo "$v ok $(( $(date +%s)-t0 ))s $(cat out/$v/wheel.txt | awk '{print $5, $9}')"
done
echo ALLDONE
