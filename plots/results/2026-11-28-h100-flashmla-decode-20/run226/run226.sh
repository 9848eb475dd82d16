#!/bin/bash
# run 226: P stores by XOR-ed 32-bit addresses (FS_P_XOR: no spills) and, with it, the rope queries in registers (FS_ROPE_REGS: none in the loop); timing, then gpu-test --kernels-only with both
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192"
SECONDS=0
def() { case $1 in base) echo "";; xor) echo FS_P_XOR;; rope) echo FS_P_XOR,FS_ROPE_REGS;; esac; }
for r in 1 2; do
  if [ $r = 1 ]; then order="base xor rope"; else order="rope xor base"; fi
  for v in $order; do
    SPECMLA_FLASH_DEFINES=$(def $v) timeout 120 .carry/gpu-bench --decode-only $S --csv $OUT/$v-$r.csv > $OUT/log-$v-$r.txt 2>&1; echo $v-$r rc $? t $SECONDS; done
done
for v in base xor rope; do D=FS_TRACE; [ $v != base ] && D=FS_TRACE,$(def $v)
  SPECMLA_FLASH_DEFINES=$D timeout 100 .carry/gpu-bench --timeline $OUT/tl-$v --shape 128,4,64,8192 --shape 128,2,64,4096 > $OUT/timeline-$v.txt 2>&1; echo tl-$v rc $? t $SECONDS; done
python3 plots/results/2026-11-28-h100-flashmla-decode-20/summary.py $OUT base xor rope > $OUT/summary.txt; cat $OUT/summary.txt
for v in base xor rope; do echo "== $v"; grep "whole iteration" $OUT/timeline-$v.txt; done
SPECMLA_FLASH_DEFINES=FS_P_XOR,FS_ROPE_REGS timeout 250 .carry/gpu-test --kernels-only > $OUT/test-rope.txt 2>&1; echo test-rope rc $? t $SECONDS; tail -3 $OUT/test-rope.txt
cd $OUT && tar czf all.tgz *.csv *.txt tl-* 2>/dev/null; rm -rf *.csv log-*.txt tl-* timeline-*.txt
