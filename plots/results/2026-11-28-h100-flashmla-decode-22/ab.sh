#!/bin/bash
# A/B of diagnostic switches in one binary: bash ab.sh "NAME=DEFINES ..." "TEST_NAMES"
# (the first NAME is the base, DEFINES comma-separated, empty for none). 2 gpu-bench processes
# each (order reversed in the second), FS_TRACE timelines of each, then gpu-test --kernels-only
# for each name in TEST_NAMES.
ROOT=$PWD
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
SECONDS=0
declare -A D; names=""
for nv in $1; do n=${nv%%=*}; D[$n]=${nv#*=}; names="$names $n"; done
rev=$(echo $names | tr ' ' '\n' | tac | tr '\n' ' ')
for r in 1 2; do
  order=$names; [ $r = 2 ] && order=$rev
  for v in $order; do
    SPECMLA_FLASH_DEFINES=${D[$v]} timeout 120 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/$v-$r.csv > $OUT/log-$v-$r.txt 2>&1; echo $v-$r rc $? t $SECONDS; done
done
for v in $names; do T=FS_TRACE; [ -n "${D[$v]}" ] && T=FS_TRACE,${D[$v]}
  SPECMLA_FLASH_DEFINES=$T timeout 100 $ROOT/.carry/gpu-bench --timeline $OUT/tl-$v --shape 128,4,64,8192 --shape 128,2,64,4096 > $OUT/timeline-$v.txt 2>&1; echo tl-$v rc $? t $SECONDS; done
python3 $ROOT/plots/results/2026-11-28-h100-flashmla-decode-20/summary.py $OUT $names > $OUT/summary.txt; cat $OUT/summary.txt
for v in $names; do echo "== $v"; grep "whole iteration\|marks from" $OUT/timeline-$v.txt; done
for v in $2; do SPECMLA_FLASH_DEFINES=${D[$v]} timeout 240 $ROOT/.carry/gpu-test --kernels-only > $OUT/test-$v.txt 2>&1; echo test-$v rc $? t $SECONDS; grep -i "FAIL" $OUT/test-$v.txt | head -5; tail -1 $OUT/test-$v.txt; done
grep -h "SM clock: lowest" $OUT/log-*.txt | sort | uniq -c
cd $OUT && tar czf all.tgz *.csv *.txt tl-* 2>/dev/null; rm -rf *.csv log-*.txt tl-* timeline-*.txt
