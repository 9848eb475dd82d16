#!/bin/bash
# run 222: timing only (outputs not checked): FS_A_FIRST, FS_A_FIRST+FS_WG1_SLEEP (warpgroup 1's score waits with a 1 ms suspend hint), FS_WG1_SLEEP, against the default; 2 processes each, order reversed in the second
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,4,128,8192"
SECONDS=0
declare -A DEF=([base]= [afirst]=FS_A_FIRST [afsleep]=FS_A_FIRST,FS_WG1_SLEEP [sleep]=FS_WG1_SLEEP)
for r in 1 2; do
  if [ $r = 1 ]; then order="base afirst afsleep sleep"; else order="sleep afsleep afirst base"; fi
  for v in $order; do
    SPECMLA_FLASH_DEFINES=${DEF[$v]} timeout 100 .carry/gpu-bench --decode-only $S --csv $OUT/$v-$r.csv > $OUT/log-$v-$r.txt 2>&1; echo $v-$r rc $? t $SECONDS; done
done
for v in afsleep sleep; do
  SPECMLA_FLASH_DEFINES=FS_TRACE,${DEF[$v]} timeout 100 .carry/gpu-bench --timeline $OUT/tl-$v --shape 128,4,64,8192 > $OUT/timeline-$v.txt 2>&1; echo tl-$v rc $? t $SECONDS; done
cd $OUT && python3 - <<'PY'
import csv,collections
t=collections.defaultdict(lambda: collections.defaultdict(list))
V=('base','afirst','afsleep','sleep')
for v in V:
  for r in (1,2):
    for x in csv.DictReader(open('%s-%d.csv'%(v,r))):
      if x['kernel']=='decode' and x['mode']=='fast': t[(x['heads'],x['q_len'],x['batch'],x['context'])][v].append(float(x['time_us']))
for k,d in t.items():
    b=sum(d['base'])/2
    print('H%s q%s B%s L%s fast'%k,' '.join('%s %s (%.3f)'%(v,'/'.join('%.1f'%x for x in d[v]),sum(d[v])/2/b) for v in V))
PY
grep -h "whole iteration\|marks from" timeline-*.txt
tar czf all.tgz *.csv log-*.txt tl-* && rm -rf *.csv log-*.txt tl-*
