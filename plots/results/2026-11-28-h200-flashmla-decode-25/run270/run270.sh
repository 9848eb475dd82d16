#!/bin/bash
# Run 270 (H200): the kernels assembled by NVRTC's own ptxas into a CUBIN
# (SPECMLA_PTXAS_OPTIONS, new) instead of the driver's JIT of NVRTC's PTX (the default), at
# ptxas's default register-usage level (5), at 10 (FlashMLA's build, its setup.py) and at 2;
# 128 and 16 heads, the default before and after.
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192"
b() { timeout 100 env $2 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
b def-1 X=1; b cub5-1 SPECMLA_PTXAS_OPTIONS=; b cub10-1 SPECMLA_PTXAS_OPTIONS=--register-usage-level=10
b cub2-1 SPECMLA_PTXAS_OPTIONS=--register-usage-level=2; b def-2 X=1
[ $SECONDS -lt 200 ] && b cub5-2 SPECMLA_PTXAS_OPTIONS=
for f in def-1 def-2 cub5-1 cub5-2 cub10-1 cub2-1; do [ -f $OUT/$f.csv ] || continue; echo "== $f"; grep -h "^decode,\(fast\|invariant\)," $OUT/$f.csv | cut -d, -f2-5,8 | tr '\n' ' '; echo; done
grep -h "SM clock: lowest\|rror" $OUT/log-*.txt | head
nvidia-smi --query-gpu=driver_version --format=csv,noheader; ls /usr/local/ | grep -i cuda
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt
