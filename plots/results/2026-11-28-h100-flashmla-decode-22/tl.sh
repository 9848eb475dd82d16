#!/bin/bash
# Timelines only: bash tl.sh "NAME=DEFINES ..." (FS_TRACE added to each)
ROOT=$PWD; SECONDS=0
for nv in $1; do n=${nv%%=*}; d=${nv#*=}; T=FS_TRACE; [ -n "$d" ] && T=FS_TRACE,$d
  SPECMLA_FLASH_DEFINES=$T timeout 100 $ROOT/.carry/gpu-bench --timeline $OUT/tl-$n --shape 128,4,64,8192 --shape 128,2,64,4096 > $OUT/timeline-$n.txt 2>&1; echo tl-$n rc $? t $SECONDS
  grep "whole iteration\|marks from" $OUT/timeline-$n.txt; done
cd $OUT && tar czf all.tgz tl-* timeline-*.txt && rm -rf tl-*
