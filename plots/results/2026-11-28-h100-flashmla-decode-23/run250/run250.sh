#!/bin/bash
# Run 250: FlashMLA timed after its memset (as always) and after a read scrub (FMBENCH_SCRUB=read, our harness's own change), ours after our read and write scrubs, one call.
ROOT=$PWD; SECONDS=0
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
FS="128,1,64,4096 128,2,64,4096 128,4,64,4096 128,1,128,16384 128,4,128,16384 16,1,128,8192 16,4,128,8192 128,2,40,4096"
run() { timeout 150 $ROOT/.carry/gpu-bench --decode-only $S --scrub $2 --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; echo $1 rc $? t $SECONDS; }
fm() { FMBENCH_SCRUB=$2 timeout 150 $ROOT/.carry/fmbench-scrub $FS > $OUT/fm$1.txt 2>&1; echo fm$1 rc $? t $SECONDS; }
FMBENCH_PROBE=1 timeout 100 $ROOT/.carry/fmbench-scrub 128,2,64,4096 2>&1 | grep -i "probe\|^fm"
fm mem-1 memset; fm read-1 read; run read-1 read; fm read-2 read; fm mem-2 memset; run write-1 write; fm mem-3 memset; fm read-3 read
python3 - $OUT <<'PY'
import csv,sys,os,collections
d=sys.argv[1]; t=collections.defaultdict(list)
for v in ['read-1','write-1']:
    for x in csv.DictReader(open(os.path.join(d,v+'.csv'))):
        if x['kernel']=='decode': t[(x['heads'],x['q_len'],x['batch'],x['context'],x['mode'],v[:-2])].append(float(x['time_us']))
fm=collections.defaultdict(list)
for f in sorted(os.listdir(d)):
    if f.startswith('fm') and f.endswith('.txt'):
        kind=f[2:].split('-')[0]
        for l in open(os.path.join(d,f)):
            p=l.split()
            if p and p[0]=='fm': fm[(kind,)+tuple(p[1:5])].append(float(p[5]))
mean=lambda v: sum(v)/len(v)
for k in sorted({k[:4] for k in t}, key=lambda k:(int(k[0]),int(k[1]),int(k[2]))):
    M=fm[('mem',)+k]; R=fm[('read',)+k]
    print('H%s q%s B%s L%s  FM memset %s | FM read %s (read/memset %.3f)' % (*k, '/'.join('%.1f'%x for x in M), '/'.join('%.1f'%x for x in R), mean(R)/mean(M)))
    for mode in ('fast','invariant'):
        r=t.get(k+(mode,'read'),[]); w=t.get(k+(mode,'write'),[])
        print('  %-9s ours read %s: / FM read %.3f, / FM memset %.3f | ours write %s: / FM memset %.3f' % (mode,'/'.join('%.1f'%x for x in r),mean(r)/mean(R),mean(r)/mean(M),'/'.join('%.1f'%x for x in w),mean(w)/mean(M)))
PY
grep -h "SM clock: lowest" $OUT/log-*.txt | sort | uniq -c
cd $OUT && tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt
