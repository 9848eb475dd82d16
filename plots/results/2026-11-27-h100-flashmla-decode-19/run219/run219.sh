#!/bin/bash
# run 219: FS_COPY_BAR (copy warps wait on named barriers, no polling) against the default, same binary; correctness first
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192 --shape 128,2,40,4096"
FM="128,1,64,4096 128,2,64,4096 128,4,64,4096 128,1,128,16384 128,4,128,16384 16,1,128,8192 16,4,128,8192 128,2,40,4096"
SECONDS=0
SPECMLA_FLASH_DEFINES=FS_COPY_BAR timeout 300 .carry/gpu-test --kernels-only > $OUT/test-bar.txt 2>&1; echo test-bar rc $? t $SECONDS; tail -3 $OUT/test-bar.txt
for r in 1 2; do
  if [ $r = 1 ]; then order="base bar"; else order="bar base"; fi
  for v in $order; do D=; [ $v = bar ] && D=FS_COPY_BAR
    SPECMLA_FLASH_DEFINES=$D timeout 200 .carry/gpu-bench --decode-only $S --csv $OUT/$v-$r.csv > $OUT/log-$v-$r.txt 2>&1; echo $v-$r rc $? t $SECONDS; done
done
timeout 120 .carry/fmbench $FM > $OUT/fm-1.txt 2>&1; echo fm rc $? t $SECONDS
for v in base bar; do D=FS_TRACE; [ $v = bar ] && D=FS_TRACE,FS_COPY_BAR
  SPECMLA_FLASH_DEFINES=$D timeout 100 .carry/gpu-bench --timeline $OUT/tl-$v --shape 128,4,64,8192 --shape 128,2,64,4096 > $OUT/timeline-$v.txt 2>&1; echo tl-$v rc $? t $SECONDS; done
cd $OUT && python3 - <<'PY'
import csv,collections
t=collections.defaultdict(lambda: collections.defaultdict(list))
for v in ('base','bar'):
  for r in (1,2):
    try:
      for x in csv.DictReader(open('%s-%d.csv'%(v,r))):
        if x['kernel']=='decode': t[(x['heads'],x['q_len'],x['batch'],x['context'])][(v,x['mode'])].append(float(x['time_us']))
    except Exception as e: print('missing',v,r,e)
fm={}
for l in open('fm-1.txt'):
    p=l.split()
    if p and p[0]=='fm': fm[tuple(p[1:5])]=float(p[5])
for k,d in t.items():
    m={a:sum(x)/len(x) for a,x in d.items()}
    F=fm.get(k,0) or 1
    out=[]
    for mode in ('fast','invariant','inv-persist'):
        b=d.get(('base',mode)); c=d.get(('bar',mode))
        if b and c: out.append('%s base %s bar %s bar/base %.3f bar/FM %.3f base/FM %.3f'%(mode,'/'.join('%.1f'%x for x in b),'/'.join('%.1f'%x for x in c),m[('bar',mode)]/m[('base',mode)],m[('bar',mode)]/F,m[('base',mode)]/F))
    print('H%s q%s B%s L%s FM %.1f'%(k+(F,)),' | '.join(out))
PY
tar czf all.tgz *.csv *.txt tl-* 2>/dev/null; rm -rf *.csv log-*.txt fm-1.txt tl-*
