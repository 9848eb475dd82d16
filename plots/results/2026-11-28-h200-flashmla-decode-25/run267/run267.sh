#!/bin/bash
# Run 267 (H200): with the tensor maps' L2 promotion at 128 B (5ce36cd), the L2 prefetch
# among a request's row blocks again: the default against none (FS_NO_L2_PREFETCH) and
# against none with the boxes read evict-first (FS_NO_L2_PREFETCH,FW_EVICT_FIRST: FlashMLA's
# load path) at 128 heads, 2 rounds, order reversed in the second.
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,1,128,16384 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,96,4096 --shape 128,2,40,4096"
b() { SPECMLA_FLASH_DEFINES=$2 timeout 100 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
b def-1 ""; b np-1 FS_NO_L2_PREFETCH; b npef-1 FS_NO_L2_PREFETCH,FW_EVICT_FIRST
b npef-2 FS_NO_L2_PREFETCH,FW_EVICT_FIRST; b np-2 FS_NO_L2_PREFETCH; b def-2 ""
for f in def-1 def-2 np-1 np-2 npef-1 npef-2; do echo "== $f"; grep -h "^decode,\(fast\|invariant\)," $OUT/$f.csv | cut -d, -f2-5,8 | tr '\n' ' '; echo; done
grep -h "SM clock: lowest" $OUT/log-*.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt
