#!/bin/bash
# Run 262 (H200): at 16 heads, where FlashMLA reads at the copy ceiling and we at 95-96%:
# the default against FW_EVICT_FIRST (the cache's boxes read with an L2 evict-first policy,
# as FlashMLA's), each with and without FS_LOADS_ONLY (the loads alone), --sweep-splits,
# 2 rounds, order reversed in the second; FlashMLA (read scrub) at the same shapes, twice.
# Then the default against FW_EVICT_FIRST at 128 heads (fast and invariant), 2 rounds.
ROOT=$PWD; SECONDS=0
P="--shape 16,1,128,8192 --shape 16,4,128,8192 --shape 16,1,140,8192"
fm() { FMBENCH_SCRUB=read timeout 100 $ROOT/.carry/fmbench-scrub 16,1,128,8192 16,4,128,8192 16,1,140,8192 > $OUT/fm-$1.txt 2>&1; echo fm$1 rc $? t $SECONDS; }
sw() { SPECMLA_FLASH_DEFINES=$2 timeout 120 $ROOT/.carry/gpu-bench --decode-only --sweep-splits $P --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
fm 1
sw def-1 ""; sw ef-1 FW_EVICT_FIRST; sw lo-1 FS_LOADS_ONLY; sw loef-1 FS_LOADS_ONLY,FW_EVICT_FIRST
sw loef-2 FS_LOADS_ONLY,FW_EVICT_FIRST; sw lo-2 FS_LOADS_ONLY; sw ef-2 FW_EVICT_FIRST; sw def-2 ""
fm 2
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384"
b() { SPECMLA_FLASH_DEFINES=$2 timeout 100 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
b h-def-1 ""; b h-ef-1 FW_EVICT_FIRST; b h-ef-2 FW_EVICT_FIRST; b h-def-2 ""
for f in def-1 def-2 ef-1 ef-2 lo-1 lo-2 loef-1 loef-2; do echo "== $f"; grep -h "^decode,\(persist=1\|balanced,\|splits=1,\|fast\|inv\)" $OUT/$f.csv | cut -d, -f2-5,8 | tr '\n' ' '; echo; done
for f in h-def-1 h-def-2 h-ef-1 h-ef-2; do echo "== $f"; grep -h "^decode,\(fast\|inv\)" $OUT/$f.csv | cut -d, -f2-5,8 | tr '\n' ' '; echo; done
grep -h "^fm" $OUT/fm-*.txt
grep -h "SM clock: lowest\|ceilings" $OUT/log-*.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt fm*.txt
