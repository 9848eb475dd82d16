#!/bin/bash
# Run 265 (H200): the tensor maps' L2 promotion: 256 B (ours until now) against 128 B
# (CUTLASS's default, which FlashMLA's maps take) and none, at the table's 8 shapes, 2
# rounds, order reversed in the second; FlashMLA (read scrub) at the start and the end.
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
FS="128,1,64,4096 128,2,64,4096 128,4,64,4096 128,1,128,16384 128,4,128,16384 16,1,128,8192 16,4,128,8192 128,2,40,4096"
fm() { FMBENCH_SCRUB=read timeout 150 $ROOT/.carry/fmbench-scrub $FS > $OUT/fmread-$1.txt 2>&1; echo fm$1 rc $? t $SECONDS; }
b() { timeout 150 $ROOT/.carry/$2 --decode-only $S --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
fm 1
b p256-1 gpu-bench; b p128-1 gpu-bench-128B; b pnone-1 gpu-bench-NONE
b pnone-2 gpu-bench-NONE; b p128-2 gpu-bench-128B; b p256-2 gpu-bench
fm 2
for f in p256-1 p256-2 p128-1 p128-2 pnone-1 pnone-2; do echo "== $f"; grep -h "^decode,\(fast\|invariant\)," $OUT/$f.csv | cut -d, -f2-5,8 | tr '\n' ' '; echo; done
grep -h "^fm" $OUT/fmread-*.txt
grep -h "SM clock: lowest\|ceilings" $OUT/log-*.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt fm*.txt
