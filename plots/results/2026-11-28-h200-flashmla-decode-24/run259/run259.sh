#!/bin/bash
# Run 259 (H200): the table again with HEAD's binary (gpu-bench-base = 3b0dd67's): FlashMLA
# (FMBENCH_SCRUB=read) and ours (read scrub) in 2 processes each, alternating. Then the L2
# prefetch at one row block a request (FS_PREFETCH_ONE_BLOCK, diagnostic) against the
# default on the copy-warpgroup launches at 16 heads (--sweep-splits: persist=N, balanced),
# 2 rounds, order reversed in the second.
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
FS="128,1,64,4096 128,2,64,4096 128,4,64,4096 128,1,128,16384 128,4,128,16384 16,1,128,8192 16,4,128,8192 128,2,40,4096"
fm() { FMBENCH_SCRUB=read timeout 150 $ROOT/.carry/fmbench-scrub $FS > $OUT/fmread-$1.txt 2>&1; echo fm$1 rc $? t $SECONDS; }
run() { timeout 200 $ROOT/.carry/gpu-bench-base --decode-only $S --csv $OUT/read-$1.csv > $OUT/log-read-$1.txt 2>&1; echo bench$1 rc $? t $SECONDS; }
fm 1; run 1; fm 2; run 2
python3 $ROOT/plots/results/2026-11-28-h100-flashmla-decode-23/table.py $OUT > $OUT/summary.txt 2>&1; cat $OUT/summary.txt
P="--shape 16,1,128,8192 --shape 16,4,128,8192 --shape 16,1,140,8192"
sw() { SPECMLA_FLASH_DEFINES=$2 timeout 150 $ROOT/.carry/gpu-bench --decode-only --sweep-splits $P --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
sw def-1 ""; sw pf-1 FS_PREFETCH_ONE_BLOCK; sw pf-2 FS_PREFETCH_ONE_BLOCK; sw def-2 ""
for f in def-1 def-2 pf-1 pf-2; do echo "== $f"; grep -h "^decode,\(persist\|balanced\|splits=1\)" $OUT/$f.csv | cut -d, -f2-6,8,15 | tr '\n' ' '; echo; done
grep -h "SM clock: lowest\|ceilings" $OUT/log-*.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt fm*.txt
