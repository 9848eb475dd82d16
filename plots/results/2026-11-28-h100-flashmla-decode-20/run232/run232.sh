#!/bin/bash
# run 232: the clock probe between timer ticks (gpu-test's sm_clock, gpu-bench's sm_mhz), and the fast plan's picks with the one-wave balanced overhead (12 tiles) and the split cap at small batches, FlashMLA beside
SH="128,1,4,4096 128,2,8,4096 128,4,4,4096 128,4,6,4096 16,1,4,8192 128,1,16,4096 128,2,64,4096 128,4,128,16384"
S=$(for s in $SH; do echo -n "--shape $s "; done)
SECONDS=0; ROOT=$PWD
timeout 60 .carry/fmbench $SH > $OUT/fm-1.txt 2>&1; echo fm rc $? t $SECONDS
timeout 200 .carry/gpu-bench --decode-only $S --csv $OUT/plans-1.csv > $OUT/log-plans-1.txt 2> $OUT/err-plans-1.txt; echo plans rc $? t $SECONDS
cat $OUT/err-plans-1.txt; grep -h "SM clock" $OUT/log-plans-1.txt
cd $OUT && python3 - <<'PY' | tee summary.txt
import csv, collections
fm = {}
for l in open('fm-1.txt'):
    p = l.split()
    if p and p[0] == 'fm': fm[tuple(p[1:5])] = float(p[5])
for x in csv.DictReader(open('plans-1.csv')):
    if x['kernel'] == 'decode' and x['mode'] in ('fast', 'invariant'):
        k = (x['heads'], x['q_len'], x['batch'], x['context'])
        print('H%s q%s B%s L%s' % k, '%-9s %8.1f us  FM %8.1f  ratio %.3f  SM %s MHz' % (x['mode'], float(x['time_us']), fm[k], float(x['time_us']) / fm[k], x['sm_mhz']))
PY
grep -h "^fast\|decode " log-plans-1.txt | head -0
timeout 250 $ROOT/.carry/gpu-test --kernels-only > $OUT/test.txt 2>&1; echo test rc $?; grep -i "sm_clock" $OUT/test.txt; tail -1 $OUT/test.txt
tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt err-*.txt fm-*.txt
