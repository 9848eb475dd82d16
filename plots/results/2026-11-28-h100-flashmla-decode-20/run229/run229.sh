#!/bin/bash
# run 229: the SM clock probe (gpu-bench's sm_mhz column, gpu-test's sm_clock check) on the device; the table with the clock beside every row, FlashMLA twice with nvidia-smi sampling the clock
S="--shape 128,1,64,4096 --shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,1,128,16384 --shape 128,4,128,16384 --shape 16,1,128,8192 --shape 16,4,128,8192"
FM="128,1,64,4096 128,2,64,4096 128,4,64,4096 128,1,128,16384 128,4,128,16384 16,1,128,8192 16,4,128,8192"
SECONDS=0
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 20 > $OUT/smi.csv 2>&1 &
SMI=$!
mark() { echo "$1 $2 $(date +%s.%N)" >> $OUT/marks.txt; }
for r in 1 2; do
  mark fm-$r start; timeout 120 .carry/fmbench $FM > $OUT/fm-$r.txt 2>&1; mark fm-$r end; echo fm-$r rc $? t $SECONDS
  mark ours-$r start; timeout 200 .carry/gpu-bench --decode-only $S --csv $OUT/self-$r.csv > $OUT/log-self-$r.txt 2> $OUT/err-self-$r.txt; echo self-$r rc $? t $SECONDS; mark ours-$r end
done
kill $SMI
grep -h "SM clock\|warning" $OUT/log-self-*.txt $OUT/err-self-*.txt
cut -d, -f1,2,3,4,5,6,8,15 $OUT/self-1.csv | head -30
timeout 300 .carry/gpu-test --kernels-only > $OUT/test.txt 2>&1; echo test rc $? t $SECONDS; grep -i "sm_clock" $OUT/test.txt; tail -1 $OUT/test.txt
cd $OUT && python3 - <<'PY'
import datetime, csv, collections
marks = {}
for l in open('marks.txt'):
    n, k, t = l.split(); marks.setdefault(n, {})[k] = float(t)
rows = []
for l in open('smi.csv'):
    p = [x.strip() for x in l.split(',')]
    try: rows.append((datetime.datetime.strptime(p[0], '%Y/%m/%d %H:%M:%S.%f').timestamp(), float(p[1].split()[0]), float(p[2].split()[0]), p[3], p[4]))
    except Exception: pass
for n, m in marks.items():
    sel = [r for r in rows if m['start'] <= r[0] <= m['end'] and r[2] > 250]
    if sel: print('%-7s busy samples %4d  SM %4.0f MHz (min %4.0f)  power %3.0f W  temp %s  reasons %s' % (n, len(sel), sum(r[1] for r in sel) / len(sel), min(r[1] for r in sel), sum(r[2] for r in sel) / len(sel), sel[-1][3], collections.Counter(r[4] for r in sel).most_common(3)))
fm = collections.defaultdict(list)
for r in (1, 2):
    for l in open('fm-%d.txt' % r):
        p = l.split()
        if p and p[0] == 'fm': fm[tuple(p[1:5])].append(float(p[5]))
t = collections.defaultdict(lambda: collections.defaultdict(list))
for r in (1, 2):
    for x in csv.DictReader(open('self-%d.csv' % r)):
        if x['kernel'] == 'decode': t[(x['heads'], x['q_len'], x['batch'], x['context'])][x['mode']].append((float(x['time_us']), x['sm_mhz'], float(x['pct_gemm'])))
for k, d in t.items():
    F = sum(fm[k]) / len(fm[k])
    print('H%s q%s B%s L%s' % k, 'FM %s' % '/'.join('%.1f' % v for v in fm[k]), ' | '.join('%s %s (%s) MHz %s' % (mode, '/'.join('%.1f' % v[0] for v in vs), '-'.join('%.3f' % (v[0] / F) for v in vs), '/'.join(v[1] for v in vs)) for mode, vs in d.items() if mode in ('fast', 'invariant', 'inv-graph', 'inv-persist')), 'gemm %s' % '/'.join('%.0f' % v[2] for v in d['fast']))
PY
tar czf all.tgz *.csv *.txt 2>/dev/null; rm -f *.csv log-*.txt fm-*.txt err-*.txt
