#!/bin/bash
# Per-instruction warp-stall samples of one launch each: ours (flash_decode_seesaw) and FlashMLA's, H 128 q 4 B 64 L 4096.
ROOT=$PWD; SECONDS=0
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1); echo "ncu: $NCU"; $NCU --version | tail -1
SEC="--section SourceCounters --section WarpStateStats --section SpeedOfLight --clock-control none"
timeout 200 $NCU $SEC -k regex:'^flash_decode_seesaw$' -c 1 -o $OUT/ours $ROOT/.carry/gpu-bench --decode-only --shape 128,4,64,4096 --reps 1 > $OUT/log-ours.txt 2>&1; echo ours rc $? t $SECONDS
FMBENCH_REPS=1 timeout 200 $NCU $SEC -k regex:flash_fwd_splitkv_mla -c 1 -o $OUT/fm $ROOT/.carry/fmbench 128,4,64,4096 > $OUT/log-fm.txt 2>&1; echo fm rc $? t $SECONDS
for r in ours fm; do
  $NCU -i $OUT/$r.ncu-rep --page source --csv --print-source sass > $OUT/$r-source.csv 2> $OUT/$r-source.err; echo export $r rc $? $(wc -c < $OUT/$r-source.csv)
  $NCU -i $OUT/$r.ncu-rep --page details > $OUT/$r-details.txt 2>&1
done
head -c 1500 $OUT/ours-source.csv; echo; head -3 $OUT/ours-source.err
gzip -f $OUT/*-source.csv; rm -f $OUT/*.ncu-rep; ls -la $OUT
