#!/bin/bash
# Run 258 (H200): gpu-bench --sweep-splits at five table shapes (split counts 1-8, the
# balanced schedule at 2, 5 and 8 tiles a piece, the persistent kernel on 1, 2, 4 splits),
# then the two plans at the same shapes, twice, alternating.
ROOT=$PWD; SECONDS=0
S="--shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,1,64,4096 --shape 128,1,128,16384 --shape 128,2,64,4096"
sw() { timeout 200 $ROOT/.carry/gpu-bench --decode-only --sweep-splits $S --csv $OUT/sweep-$1.csv > $OUT/log-sweep-$1.txt 2>&1; echo sweep$1 rc $? t $SECONDS; }
pl() { timeout 200 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/plans-$1.csv > $OUT/log-plans-$1.txt 2>&1; echo plans$1 rc $? t $SECONDS; }
sw 1; pl 1; sw 2; pl 2
for f in sweep-1 sweep-2 plans-1 plans-2; do echo "== $f"; grep -h "^decode," $OUT/$f.csv | cut -d, -f2-6,8 | sed 's/^/  /'; done
grep -h "SM clock: lowest" $OUT/log-*.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt
