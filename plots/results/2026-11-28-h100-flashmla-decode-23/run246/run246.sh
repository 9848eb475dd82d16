#!/bin/bash
# Run 246: the loads alone (FS_LOADS_ONLY), with 4 of 9 blocks (FS_LOADS_HALF), the math alone (FW_NO_LOAD), against the default.
ROOT=$PWD
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
SECONDS=0
declare -A D; names=""
for nv in "base=" "noload=FW_NO_LOAD" "loads=FS_LOADS_ONLY" "half=FS_LOADS_ONLY,FS_LOADS_HALF"; do n=${nv%%=*}; D[$n]=${nv#*=}; names="$names $n"; done
rev=$(echo $names | tr ' ' '\n' | tac | tr '\n' ' ')
for r in 1 2; do
  order=$names; [ $r = 2 ] && order=$rev
  for v in $order; do
    SPECMLA_FLASH_DEFINES=${D[$v]} timeout 120 $ROOT/.carry/gpu-bench --decode-only $S --csv $OUT/$v-$r.csv > $OUT/log-$v-$r.txt 2>&1; echo $v-$r rc $? t $SECONDS; done
done
python3 $ROOT/plots/results/2026-11-28-h100-flashmla-decode-20/summary.py $OUT $names > $OUT/summary.txt; cat $OUT/summary.txt
grep -h "SM clock: lowest" $OUT/log-*.txt | sort | uniq -c
nvidia-smi --query-gpu=name,clocks.sm,power.draw,temperature.gpu --format=csv
cd $OUT && tar czf all.tgz *.csv *.txt 2>/dev/null; rm -rf *.csv log-*.txt
