#!/bin/bash
# Run 260 (H200): FS_PREFETCH_LINES (the product warpgroups pull the next pair's reload
# tiles into L2 with line prefetches, on the kernel without a copy warpgroup) against the
# default at 16 heads, 2 rounds, order reversed in the second; then gpu-test
# --kernels-only with the switch.
ROOT=$PWD; SECONDS=0
S="--shape 16,1,128,8192 --shape 16,4,128,8192 --shape 16,1,64,8192 --shape 16,2,128,16384"
b() { SPECMLA_FLASH_DEFINES=$2 timeout 150 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
b def-1 ""; b pl-1 FS_PREFETCH_LINES; b pl-2 FS_PREFETCH_LINES; b def-2 ""
for f in def-1 def-2 pl-1 pl-2; do echo "== $f"; grep -h "^decode,\(fast\|inv\)" $OUT/$f.csv | cut -d, -f2-6,8,11,15 | tr '\n' ' '; echo; done
grep -h "SM clock: lowest\|ceilings" $OUT/log-*.txt
SPECMLA_FLASH_DEFINES=FS_PREFETCH_LINES timeout 250 $ROOT/.carry/gpu-test --kernels-only > $OUT/test-pl.txt 2>&1; echo test rc $? t $SECONDS; grep -i "fail" $OUT/test-pl.txt | head -5; tail -1 $OUT/test-pl.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt
