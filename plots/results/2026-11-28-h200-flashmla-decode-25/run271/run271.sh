#!/bin/bash
# Run 271 (H200): the Hopper decode kernels as programmatic dependent launches (SPECMLA_PDL,
# new; each kernel waits with griddepcontrol.wait first) against plain launches, at the
# table's 8 shapes, 2 rounds, order reversed in the second; then gpu-test --kernels-only
# with SPECMLA_PDL.
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
b() { timeout 100 env $2 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
b def-1 X=1; b pdl-1 SPECMLA_PDL=1; b pdl-2 SPECMLA_PDL=1; b def-2 X=1
for f in def-1 def-2 pdl-1 pdl-2; do echo "== $f"; grep -h "^decode,\(fast\|invariant\)," $OUT/$f.csv | cut -d, -f2-5,8 | tr '\n' ' '; echo; done
SPECMLA_PDL=1 timeout 200 $ROOT/.carry/gpu-test --kernels-only > $OUT/gpu-test-pdl.txt 2>&1; echo gpu-test rc $? t $SECONDS; tail -2 $OUT/gpu-test-pdl.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt
