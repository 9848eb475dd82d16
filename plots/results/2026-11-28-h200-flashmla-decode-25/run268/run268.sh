#!/bin/bash
# Run 268 (H200): the table again with 5ce36cd's binary (L2 promotion 128 B), another call:
# FlashMLA (read scrub) and ours alternating, 2 processes each.
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
FS="128,1,64,4096 128,2,64,4096 128,4,64,4096 128,1,128,16384 128,4,128,16384 16,1,128,8192 16,4,128,8192 128,2,40,4096"
fm() { FMBENCH_SCRUB=read timeout 150 $ROOT/.carry/fmbench-scrub $FS > $OUT/fmread-$1.txt 2>&1; echo fm$1 rc $? t $SECONDS; }
run() { timeout 200 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/read-$1.csv > $OUT/log-read-$1.txt 2>&1; echo bench$1 rc $? t $SECONDS; }
fm 1; run 1; fm 2; run 2
python3 $ROOT/plots/results/2026-11-28-h100-flashmla-decode-23/table.py $OUT > $OUT/summary.txt 2>&1; cat $OUT/summary.txt
grep -h "SM clock: lowest\|ceilings" $OUT/log-*.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt fm*.txt
