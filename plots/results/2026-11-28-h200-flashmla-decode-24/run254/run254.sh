#!/bin/bash
# Run 254 (first on the H200): gpu-test (full) with the in-part merge, then the table: ours
# (read scrub) and FlashMLA (FMBENCH_SCRUB=read), alternating, one process each.
ROOT=$PWD; SECONDS=0
nvidia-smi --query-gpu=name,clocks.max.sm,memory.total --format=csv > $OUT/gpu.txt 2>&1; cat $OUT/gpu.txt
timeout 300 $ROOT/.carry/gpu-test > $OUT/gpu-test.txt 2>&1; echo gpu-test rc $? t $SECONDS; grep -i "fail" $OUT/gpu-test.txt | head -8; grep -i "invariant schedule" $OUT/gpu-test.txt; tail -1 $OUT/gpu-test.txt
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
FS="128,1,64,4096 128,2,64,4096 128,4,64,4096 128,1,128,16384 128,4,128,16384 16,1,128,8192 16,4,128,8192 128,2,40,4096"
FMBENCH_SCRUB=read timeout 150 $ROOT/.carry/fmbench-scrub $FS > $OUT/fmread-1.txt 2>&1; echo fm rc $? t $SECONDS
timeout 200 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/read-1.csv > $OUT/log-read-1.txt 2>&1; echo bench rc $? t $SECONDS
python3 $ROOT/plots/results/2026-11-28-h100-flashmla-decode-23/table.py $OUT > $OUT/summary.txt 2>&1; cat $OUT/summary.txt
grep -h "SM clock: lowest" $OUT/log-*.txt
grep -h "^decode,inv" $OUT/read-1.csv
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt fm*.txt
