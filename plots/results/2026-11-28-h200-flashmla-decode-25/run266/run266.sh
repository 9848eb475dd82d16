#!/bin/bash
# Run 266 (H200): gpu-test (full) with the tensor maps' L2 promotion at 128 B; then the
# prefill attention (gpu-bench --prefill-only, 128 heads) at 256 B against 128 B, rounds
# alternating while the call has time.
ROOT=$PWD; SECONDS=0
timeout 240 $ROOT/.carry/gpu-test > $OUT/gpu-test.txt 2>&1; echo gpu-test rc $? t $SECONDS; tail -3 $OUT/gpu-test.txt
p() { timeout 120 $ROOT/.carry/$2 --prefill-only --heads 128 --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
p pre256-1 gpu-bench; p pre128-1 gpu-bench-128B
[ $SECONDS -lt 330 ] && { p pre128-2 gpu-bench-128B; p pre256-2 gpu-bench; }
for f in pre256-1 pre256-2 pre128-1 pre128-2; do [ -f $OUT/$f.csv ] || continue; echo "== $f"; grep -hv "ceiling\|^kernel" $OUT/$f.csv | cut -d, -f1-8 | tr '\n' ' '; echo; done
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt
