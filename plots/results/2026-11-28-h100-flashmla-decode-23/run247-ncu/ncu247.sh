#!/bin/bash
# Run 247: both kernels' memory and pipe counters (ncu sections, raw page), H 128 q 2 and q 4, B 64, L 4096; one launch each.
ROOT=$PWD; SECONDS=0
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"; $NCU --version | tail -1
SEC="--section SpeedOfLight --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section ComputeWorkloadAnalysis --section InstructionStats --section SchedulerStats --section WarpStateStats --clock-control none"
for q in 2 4; do
  timeout 150 $NCU $SEC -k regex:'^flash_decode_seesaw$' -c 1 -o $OUT/ours-q$q $ROOT/.carry/gpu-bench --decode-only --shape 128,$q,64,4096 --reps 1 > $OUT/log-ours-q$q.txt 2>&1; echo ours q$q rc $? t $SECONDS
  FMBENCH_REPS=1 timeout 150 $NCU $SEC -k regex:flash_fwd_splitkv_mla -c 1 -o $OUT/fm-q$q $ROOT/.carry/fmbench 128,$q,64,4096 > $OUT/log-fm-q$q.txt 2>&1; echo fm q$q rc $? t $SECONDS
done
for r in ours-q2 fm-q2 ours-q4 fm-q4; do
  $NCU -i $OUT/$r.ncu-rep --page details --print-details all > $OUT/$r-details.txt 2>&1
  $NCU -i $OUT/$r.ncu-rep --page raw --csv > $OUT/$r-raw.csv 2>&1
done
$NCU --query-metrics --chip gh100 > $OUT/query.txt 2>&1
rm -f $OUT/*.ncu-rep; tar czf $OUT/ncu247.tgz -C $OUT $(cd $OUT && ls *.txt *.csv); ls -la $OUT
