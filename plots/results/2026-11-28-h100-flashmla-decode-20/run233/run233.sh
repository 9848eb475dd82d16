#!/bin/bash
# run 233: the clock probe with its bounded timer wait: gpu-bench at two shapes (sm_mhz and the run's lowest), then the probe's gpu-test case alone is not selectable, so gpu-bench only
SECONDS=0
timeout 100 .carry/gpu-bench --decode-only --shape 128,2,64,4096 --shape 128,1,4,4096 --csv $OUT/self.csv > $OUT/log.txt 2> $OUT/err.txt; echo rc $? t $SECONDS
grep "SM clock\|ceilings" $OUT/log.txt; cat $OUT/err.txt; cut -d, -f1,2,3,4,5,6,8,15 $OUT/self.csv
