#!/bin/bash
# run 223: the invariant policy's q 1 trade-off on 8ccef75's kernels: --sweep-splits at H 128 q 1 L 4k, B 16-128, FlashMLA beside
S="--shape 128,1,16,4096 --shape 128,1,32,4096 --shape 128,1,48,4096 --shape 128,1,64,4096 --shape 128,1,96,4096 --shape 128,1,128,4096"
FM="128,1,16,4096 128,1,32,4096 128,1,48,4096 128,1,64,4096 128,1,96,4096 128,1,128,4096"
SECONDS=0
timeout 200 .carry/gpu-bench --decode-only --sweep-splits $S --csv $OUT/sweep-1.csv > $OUT/log-sweep-1.txt 2>&1; echo sweep-1 rc $? t $SECONDS
timeout 60 .carry/fmbench $FM > $OUT/fm-1.txt 2>&1; echo fm rc $? t $SECONDS
timeout 200 .carry/gpu-bench --decode-only $S --csv $OUT/plans-1.csv > $OUT/log-plans-1.txt 2>&1; echo plans-1 rc $? t $SECONDS
cd $OUT && python3 - <<'PY'
import csv,collections
t=collections.defaultdict(dict)
for f in ('sweep-1.csv','plans-1.csv'):
    for x in csv.DictReader(open(f)):
        if x['kernel']=='decode': t[(x['heads'],x['q_len'],x['batch'],x['context'])][x['mode']]=float(x['time_us'])
fm={}
for l in open('fm-1.txt'):
    p=l.split()
    if p and p[0]=='fm': fm[tuple(p[1:5])]=float(p[5])
for k,d in t.items():
    F=fm.get(k,0) or 1
    print('H%s q%s B%s L%s'%k,'FM %.1f |'%F,' '.join('%s %.1f (%.2f)'%(m,v,v/F) for m,v in sorted(d.items())))
PY
tar czf all.tgz *.csv *.txt && rm -f *.csv log-*.txt fm-1.txt
