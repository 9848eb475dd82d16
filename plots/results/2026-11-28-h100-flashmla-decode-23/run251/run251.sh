#!/bin/bash
# Run 251: the table from one call with one scrub for both kernels: ours (gpu-bench, read scrub) in 2 processes, FlashMLA (FMBENCH_SCRUB=read) twice, alternating; then the write scrub once each; then gpu-test.
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
FS="128,1,64,4096 128,2,64,4096 128,4,64,4096 128,1,128,16384 128,4,128,16384 16,1,128,8192 16,4,128,8192 128,2,40,4096"
run() { timeout 150 $ROOT/.carry/gpu-bench --decode-only $S --scrub $2 --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
fm() { FMBENCH_SCRUB=$2 timeout 150 $ROOT/.carry/fmbench-scrub $FS > $OUT/fm$1.txt 2>&1; echo fm$1 rc $? t $SECONDS; }
fm read-1 read; run read-1 read; fm read-2 read; run read-2 read; run write-1 write; fm mem-1 memset
python3 $ROOT/plots/results/2026-11-28-h100-flashmla-decode-23/table.py $OUT > $OUT/summary.txt; cat $OUT/summary.txt
grep -h "SM clock: lowest" $OUT/log-*.txt | sort | uniq -c
timeout 280 $ROOT/.carry/gpu-test > $OUT/gpu-test.txt 2>&1; echo gpu-test rc $? t $SECONDS; grep -i "fail" $OUT/gpu-test.txt | head -5; tail -2 $OUT/gpu-test.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt fm*.txt
