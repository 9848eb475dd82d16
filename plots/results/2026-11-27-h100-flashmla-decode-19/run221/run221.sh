#!/bin/bash
# run 221: gpu-test (full) on b36c564 (copy warps at named barriers); the table beside FlashMLA (ours 2 processes, FlashMLA twice); timelines with warpgroup 0's exponential mark
T="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192"
FM="128,1,64,4096 128,2,64,4096 128,4,64,4096 128,1,128,16384 128,4,128,16384 16,1,128,8192 16,4,128,8192"
SECONDS=0
timeout 330 .carry/gpu-test > $OUT/test.txt 2>&1; echo test rc $? t $SECONDS; tail -2 $OUT/test.txt
.carry/gpu-bench --decode-only $T --csv $OUT/self-1.csv > $OUT/log-self-1.txt 2>&1; echo self-1 rc $? t $SECONDS
.carry/fmbench $FM > $OUT/fm-1.txt 2>&1; echo fm-1 rc $? t $SECONDS
.carry/gpu-bench --decode-only $T --csv $OUT/self-2.csv > $OUT/log-self-2.txt 2>&1; echo self-2 rc $? t $SECONDS
.carry/fmbench $FM > $OUT/fm-2.txt 2>&1; echo fm-2 rc $? t $SECONDS
SPECMLA_FLASH_DEFINES=FS_TRACE timeout 100 .carry/gpu-bench --timeline $OUT/tl --shape 128,4,64,8192 --shape 128,2,64,4096 > $OUT/timeline.txt 2>&1; echo tl rc $? t $SECONDS
grep "ceilings" $OUT/log-self-*.txt
cd $OUT && python3 - <<'PY'
import csv,collections
t=collections.defaultdict(lambda: collections.defaultdict(list))
for f in ('self-1.csv','self-2.csv'):
    for x in csv.DictReader(open(f)):
        if x['kernel']=='decode': t[(x['heads'],x['q_len'],x['batch'],x['context'])][x['mode']].append((float(x['time_us']),x['pct_gemm']))
fm=collections.defaultdict(list)
for f in ('fm-1.txt','fm-2.txt'):
    for l in open(f):
        p=l.split()
        if p and p[0]=='fm': fm[tuple(p[1:5])].append(float(p[5]))
for k,d in t.items():
    F=sum(fm[k])/len(fm[k])
    g=lambda m: '/'.join('%.1f [%s%%]'%(x[0],x[1]) for x in d[m])
    r=lambda m: '%.3f-%.3f'%(min(x[0] for x in d[m])/F,max(x[0] for x in d[m])/F)
    print('H%s q%s B%s L%s'%k,'FM %s | fast %s (%s) | invariant %s (%s) | inv-graph %s (%s) | inv-persist %s (%s)'%('/'.join('%.1f'%x for x in fm[k]),g('fast'),r('fast'),g('invariant'),r('invariant'),g('inv-graph'),r('inv-graph'),g('inv-persist'),r('inv-persist')))
PY
tar czf all.tgz *.csv *.txt tl && rm -rf *.csv log-*.txt fm-*.txt tl
