#!/bin/bash
# Run 261 (H200): the L2 prefetch among a request's row blocks (default) against none
# (FS_NO_L2_PREFETCH) at 128 heads, 2 rounds, order reversed in the second: on the H100 it
# made q 1 0.96-0.97x (runs 147-149); the H200's memory is faster.
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,1,128,16384 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,96,4096"
b() { SPECMLA_FLASH_DEFINES=$2 timeout 100 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
b def-1 ""; b np-1 FS_NO_L2_PREFETCH; b np-2 FS_NO_L2_PREFETCH; b def-2 ""
for f in def-1 def-2 np-1 np-2; do echo "== $f"; grep -h "^decode,\(fast\|inv\)" $OUT/$f.csv | cut -d, -f2-6,8,15 | tr '\n' ' '; echo; done
grep -h "SM clock: lowest" $OUT/log-*.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt
