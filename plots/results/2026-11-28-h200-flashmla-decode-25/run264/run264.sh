#!/bin/bash
# Run 264 (H200): the loads alone at 16 heads, as the pair loop takes them (FS_LOADS_ONLY:
# both tiles of a pair waited for, then released) against each block reloaded as soon as it
# lands (FS_LOADS_ONLY,FS_LOADS_FREE, new; each warpgroup meeting before a release), and the default; --sweep-splits, 2 rounds,
# order reversed in the second; FlashMLA (read scrub) at the same shapes before and after.
ROOT=$PWD; SECONDS=0
P="--shape 16,1,128,8192 --shape 16,4,128,8192 --shape 16,1,140,8192"
fm() { FMBENCH_SCRUB=read timeout 100 $ROOT/.carry/fmbench-scrub 16,1,128,8192 16,4,128,8192 16,1,140,8192 > $OUT/fm-$1.txt 2>&1; echo fm$1 rc $? t $SECONDS; }
sw() { SPECMLA_FLASH_DEFINES=$2 timeout 60 $ROOT/.carry/gpu-bench --decode-only --sweep-splits $P --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
fm 1
sw free-1 FS_LOADS_ONLY,FS_LOADS_FREE; sw def-1 ""; sw lo-1 FS_LOADS_ONLY
[ -s $OUT/free-1.csv ] && sw free-2 FS_LOADS_ONLY,FS_LOADS_FREE; sw lo-2 FS_LOADS_ONLY; sw def-2 ""
fm 2
for f in def-1 def-2 lo-1 lo-2 free-1 free-2; do echo "== $f"; grep -h "^decode,\(persist=1\|balanced,\|splits=1,\)" $OUT/$f.csv | cut -d, -f2-5,8 | tr '\n' ' '; echo; done
grep -h "^fm" $OUT/fm-*.txt
grep -h "SM clock: lowest" $OUT/log-*.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt fm*.txt
