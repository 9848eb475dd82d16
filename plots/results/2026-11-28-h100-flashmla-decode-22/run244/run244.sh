#!/bin/bash
# run 244: pair iterations before an item's edge tiles without the zeroing and mask blocks (FS_EDGE_SPLIT), against the same binary's default and HEAD's binary
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
run() { local v=$1 r=$2; case $v in head) B=gpu-bench-head; D="";; base) B=gpu-bench; D="";; edge) B=gpu-bench; D=FS_EDGE_SPLIT;; esac
  SPECMLA_FLASH_DEFINES=$D timeout 120 $ROOT/.carry/$B --decode-only $S --csv $OUT/$v-$r.csv > $OUT/log-$v-$r.txt 2>&1; echo $v-$r rc $? t $SECONDS; }
for v in head base edge; do run $v 1; done
for v in edge base head; do run $v 2; done
python3 $ROOT/plots/results/2026-11-28-h100-flashmla-decode-20/summary.py $OUT head base edge > $OUT/summary.txt; cat $OUT/summary.txt | grep -v "inv"
SPECMLA_FLASH_DEFINES=FS_TRACE,FS_EDGE_SPLIT timeout 60 $ROOT/.carry/gpu-bench --timeline $OUT/tl-edge --shape 128,4,64,8192 > $OUT/timeline-edge.txt 2>&1; echo tl rc $? t $SECONDS; grep "whole iteration\|marks from" $OUT/timeline-edge.txt
SPECMLA_FLASH_DEFINES=FS_EDGE_SPLIT timeout 230 $ROOT/.carry/gpu-test --kernels-only > $OUT/test-edge.txt 2>&1; echo test-edge rc $? t $SECONDS; grep -i "FAIL" $OUT/test-edge.txt | head -5; tail -1 $OUT/test-edge.txt; grep -i sm_clock $OUT/test-edge.txt
grep -h "SM clock: lowest" $OUT/log-*.txt | sort | uniq -c
cd $OUT && tar czf all.tgz *.csv *.txt tl-* 2>/dev/null; rm -rf *.csv log-*.txt tl-* timeline-*.txt
