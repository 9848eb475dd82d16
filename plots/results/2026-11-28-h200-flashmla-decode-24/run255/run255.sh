#!/bin/bash
# Run 255 (H200): inv-persist before (HEAD 3b0dd67's binary, the combine) and after the
# in-part merge, and after with FS_NO_PART_MERGE (the merge left out), 2 rounds, order
# reversed in the second; FS_TRACE timeline of CTA 0 not taken.
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,1,32,4096 --shape 128,1,96,4096 --shape 128,1,128,16384 --shape 16,4,128,8192 --shape 16,1,64,8192"
b() { SPECMLA_FLASH_DEFINES=$3 timeout 150 $ROOT/.carry/$2 --decode-only $S --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
b base-1 gpu-bench-base ""; b new-1 gpu-bench ""; b nomerge-1 gpu-bench FS_NO_PART_MERGE
b nomerge-2 gpu-bench FS_NO_PART_MERGE; b new-2 gpu-bench ""; b base-2 gpu-bench-base ""
for f in base-1 base-2 new-1 new-2 nomerge-1 nomerge-2; do echo "== $f"; grep -h "^decode,\(inv\|fast\)" $OUT/$f.csv | cut -d, -f2-6,8 | tr '\n' ' ' | sed 's/decode,//g'; echo; done
grep -h "SM clock: lowest" $OUT/log-*.txt
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt
