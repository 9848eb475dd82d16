#!/bin/bash
# run 234: warpgroup 1 with tile B's own running maximum (FS_OWN_MAX) against the default; timing, timelines, gpu-test --kernels-only with it
ROOT=$PWD
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
SECONDS=0
def() { case $1 in base) echo "";; own) echo FS_OWN_MAX;; esac; }
for r in 1 2; do
  if [ $r = 1 ]; then order="base own"; else order="own base"; fi
  for v in $order; do
    SPECMLA_FLASH_DEFINES=$(def $v) timeout 120 .carry/gpu-bench --decode-only $S --csv $OUT/$v-$r.csv > $OUT/log-$v-$r.txt 2>&1; echo $v-$r rc $? t $SECONDS; done
done
for v in base own; do D=FS_TRACE; [ $v != base ] && D=FS_TRACE,$(def $v)
  SPECMLA_FLASH_DEFINES=$D timeout 100 .carry/gpu-bench --timeline $OUT/tl-$v --shape 128,4,64,8192 --shape 128,2,64,4096 > $OUT/timeline-$v.txt 2>&1; echo tl-$v rc $? t $SECONDS; done
python3 plots/results/2026-11-28-h100-flashmla-decode-20/summary.py $OUT base own > $OUT/summary.txt; cat $OUT/summary.txt
for v in base own; do echo "== $v"; grep "whole iteration" $OUT/timeline-$v.txt; done
SPECMLA_FLASH_DEFINES=FS_OWN_MAX timeout 250 .carry/gpu-test --kernels-only > $OUT/test-own.txt 2>&1; echo test-own rc $? t $SECONDS; grep -i "sm_clock\|fail" $OUT/test-own.txt | head; tail -3 $OUT/test-own.txt
grep -h "SM clock\|lowest\|warning" $OUT/log-*.txt | sort | uniq -c | head
cd $OUT && tar czf all.tgz *.csv *.txt tl-* 2>/dev/null; rm -rf *.csv log-*.txt tl-* timeline-*.txt
