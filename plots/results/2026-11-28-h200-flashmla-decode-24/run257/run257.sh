#!/bin/bash
# Run 257 (H200): gpu-test (full) on the final in-part merge (all or none); the table:
# ours (read scrub) and FlashMLA (FMBENCH_SCRUB=read) in 2 processes each, alternating;
# then inv-persist before (HEAD 3b0dd67's binary) and after at six shapes, 2 rounds.
ROOT=$PWD; SECONDS=0
timeout 300 $ROOT/.carry/gpu-test > $OUT/gpu-test.txt 2>&1; echo gpu-test rc $? t $SECONDS; grep -i "fail" $OUT/gpu-test.txt | head -8; grep -i "invariant schedule" $OUT/gpu-test.txt; tail -1 $OUT/gpu-test.txt
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
FS="128,1,64,4096 128,2,64,4096 128,4,64,4096 128,1,128,16384 128,4,128,16384 16,1,128,8192 16,4,128,8192 128,2,40,4096"
fm() { FMBENCH_SCRUB=read timeout 150 $ROOT/.carry/fmbench-scrub $FS > $OUT/fmread-$1.txt 2>&1; echo fm$1 rc $? t $SECONDS; }
run() { timeout 200 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/read-$1.csv > $OUT/log-read-$1.txt 2>&1; echo bench$1 rc $? t $SECONDS; }
fm 1; run 1; fm 2; run 2
python3 $ROOT/plots/results/2026-11-28-h100-flashmla-decode-23/table.py $OUT > $OUT/summary.txt 2>&1; cat $OUT/summary.txt
P="--shape 128,1,64,4096 --shape 128,1,32,4096 --shape 128,1,96,4096 --shape 128,1,128,16384 --shape 16,4,128,8192 --shape 16,1,64,8192"
b() { timeout 150 $ROOT/.carry/$2 --decode-only $P --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
b base-1 gpu-bench-base; b new-1 gpu-bench; b new-2 gpu-bench; b base-2 gpu-bench-base
for f in base-1 base-2 new-1 new-2; do echo "== $f"; grep -h "^decode,\(inv\|fast\)" $OUT/$f.csv | cut -d, -f2-6,8 | tr '\n' ' ' | sed 's/decode,//g'; echo; done
grep -h "SM clock: lowest" $OUT/log-*.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt fm*.txt
