#!/bin/bash
# Run 248: per-kernel durations and cycles of timed-loop launches, no cache flush by ncu (each harness's own scrub), H 128 q 2 / q 4 B 64 L 4096.
ROOT=$PWD; SECONDS=0
NCU=/usr/local/cuda/bin/ncu
M="--metrics gpu__time_duration.sum,sm__cycles_elapsed.max,sm__cycles_elapsed.avg.per_second --cache-control none --clock-control none"
for q in 2 4; do
  timeout 150 $NCU $M -k regex:'^flash_decode_seesaw$' -s 8 -c 6 --csv $ROOT/.carry/gpu-bench --decode-only --shape 128,$q,64,4096 > $OUT/ours-q$q.txt 2>&1; echo ours q$q rc $? t $SECONDS
  FMBENCH_REPS=20 timeout 150 $NCU $M -k regex:'flash_fwd_splitkv_mla|combine' -s 10 -c 12 --csv $ROOT/.carry/fmbench 128,$q,64,4096 > $OUT/fm-q$q.txt 2>&1; echo fm q$q rc $? t $SECONDS
done
for f in $OUT/*.txt; do echo "== $f"; grep -E '"(gpu__time_duration.sum|sm__cycles_elapsed.max|sm__cycles_elapsed.avg.per_second)"' $f | awk -F'","' '{print $5, $(NF-2), $(NF)}' | cut -c1-160; done
