#!/bin/bash
# Run 249: our launches timed after a read scrub (default) and after a write scrub (as FlashMLA's harness's memset), FlashMLA beside.
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
FS="128,1,64,4096 128,2,64,4096 128,4,64,4096 128,1,128,16384 128,4,128,16384 16,1,128,8192 16,4,128,8192 128,2,40,4096"
run() { timeout 150 $ROOT/.carry/gpu-bench --decode-only $S --scrub $2 --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
fm() { timeout 150 $ROOT/.carry/fmbench $FS > $OUT/fm-$1.txt 2>&1; echo fm-$1 rc $? t $SECONDS; }
fm 1; run read-1 read; run write-1 write; fm 2; run write-2 write; run read-2 read; fm 3
cat $OUT/fm-1.txt $OUT/fm-2.txt $OUT/fm-3.txt | grep "^fm" | sort > $OUT/fm-all.txt
python3 - $OUT <<'PY'
import csv,sys,os,collections
d=sys.argv[1]; t=collections.defaultdict(list)
for v in ['read-1','read-2','write-1','write-2']:
    for x in csv.DictReader(open(os.path.join(d,v+'.csv'))):
        if x['kernel']=='decode': t[(x['heads'],x['q_len'],x['batch'],x['context'],x['mode'],v[:-2])].append(float(x['time_us']))
fm=collections.defaultdict(list)
for l in open(os.path.join(d,'fm-all.txt')):
    p=l.split(); fm[tuple(p[1:5])].append(float(p[5]))
for k in sorted({k[:4] for k in t}, key=lambda k:(int(k[0]),int(k[1]),int(k[2]))):
    F=fm.get(k,[]); mf=sum(F)/len(F) if F else float('nan')
    print('H%s q%s B%s L%s  FM %s' % (*k, '/'.join('%.1f'%x for x in F)))
    for mode in ('fast','invariant'):
        r=t.get(k+(mode,'read'),[]); w=t.get(k+(mode,'write'),[])
        if not r: continue
        mr=sum(r)/len(r); mw=sum(w)/len(w)
        print('  %-9s read %s (%.3f FM) | write %s (%.3f FM) | write/read %.3f' % (mode,'/'.join('%.1f'%x for x in r),mr/mf,'/'.join('%.1f'%x for x in w),mw/mf,mw/mr))
PY
grep -h "SM clock: lowest" $OUT/log-*.txt | sort | uniq -c
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt fm-?.txt
