#!/bin/bash
# run 225: is the pair iteration near shared memory's bandwidth? extra reads by the copy warps (FS_SMEM_STRESS 16 KB, _X3 48 KB an iteration) and the rope queries in registers (FS_ROPE_REGS, with its spills), timing only
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,4,128,16384 --shape 16,4,128,8192"
SECONDS=0
def() { case $1 in base) echo "";; rope) echo FS_ROPE_REGS;; st1) echo FS_SMEM_STRESS;; st3) echo FS_SMEM_STRESS_X3;; esac; }
for r in 1 2; do
  if [ $r = 1 ]; then order="base rope st1 st3"; else order="st3 st1 rope base"; fi
  for v in $order; do
    SPECMLA_FLASH_DEFINES=$(def $v) timeout 120 .carry/gpu-bench --decode-only $S --csv $OUT/$v-$r.csv > $OUT/log-$v-$r.txt 2>&1; echo $v-$r rc $? t $SECONDS; done
done
for v in base rope st1 st3; do D=FS_TRACE; [ $v != base ] && D=FS_TRACE,$(def $v)
  SPECMLA_FLASH_DEFINES=$D timeout 100 .carry/gpu-bench --timeline $OUT/tl-$v --shape 128,4,64,8192 --shape 128,2,64,4096 > $OUT/timeline-$v.txt 2>&1; echo tl-$v rc $? t $SECONDS; done
python3 plots/results/2026-11-28-h100-flashmla-decode-20/summary.py $OUT base rope st1 st3 > $OUT/summary.txt; cat $OUT/summary.txt
for v in base rope st1 st3; do echo "== $v"; grep -i -A3 "steady\|iteration" $OUT/timeline-$v.txt | head -12; done
cd $OUT && tar czf all.tgz *.csv *.txt tl-* 2>/dev/null; rm -rf *.csv log-*.txt tl-* timeline-*.txt
