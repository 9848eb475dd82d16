#!/bin/bash
# Run 269 (H200): with the tensor maps' L2 promotion at 128 B (5ce36cd), the L2 prefetch at
# one row block a request (FS_PREFETCH_ONE_BLOCK, 1.07-1.25x slower at 256 B in run 259)
# against the default at 16 heads, --sweep-splits, 2 rounds, order reversed in the second.
ROOT=$PWD; SECONDS=0
P="--shape 16,1,128,8192 --shape 16,4,128,8192 --shape 16,1,140,8192"
sw() { SPECMLA_FLASH_DEFINES=$2 timeout 100 $ROOT/.carry/gpu-bench --decode-only --sweep-splits $P --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
sw def-1 ""; sw pf-1 FS_PREFETCH_ONE_BLOCK; sw pf-2 FS_PREFETCH_ONE_BLOCK; sw def-2 ""
for f in def-1 def-2 pf-1 pf-2; do echo "== $f"; grep -h "^decode,\(persist=1\|balanced,\|splits=1,\)" $OUT/$f.csv | cut -d, -f2-5,8 | tr '\n' ' '; echo; done
grep -h "SM clock: lowest" $OUT/log-*.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt
