#!/bin/bash
# run 228: the power state behind the FlashMLA ratios: SM clock and power sampled every 20 ms; ours (default kernels) and FlashMLA, each shape alone, after 4 s idle (short: 20 reps) and under sustained load (many reps), alternating who goes first
SECONDS=0
nvidia-smi --query-gpu=timestamp,clocks.sm,power.draw,temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 20 > $OUT/smi.csv 2>&1 &
SMI=$!
mark() { echo "$1 $2 $(date +%s.%N)" >> $OUT/marks.txt; }
ours() { # name shape reps
  mark $1 start; timeout 120 .carry/gpu-bench --decode-only --shape $2 --reps $3 --csv $OUT/$1.csv > $OUT/log-$1.txt 2>&1; mark $1 end; }
fm() { mark $1 start; FMBENCH_REPS=$3 timeout 120 .carry/fmbench $2 > $OUT/$1.txt 2>&1; mark $1 end; }
.carry/gpu-bench --decode-only --shape 16,1,8,1024 --reps 2 --csv /dev/null > /dev/null 2>&1  # NVRTC compile, outside the marks
for sh in 128,2,64,4096 128,4,64,4096 128,4,128,16384; do
  n=$(echo $sh | tr , _)
  sleep 4; fm fm-cold-$n $sh 20; sleep 4; ours ours-cold-$n $sh 20
  sleep 4; ours ours-cold2-$n $sh 20; sleep 4; fm fm-cold2-$n $sh 20
  echo cold $n t $SECONDS
done
for sh in 128,2,64,4096 128,4,64,4096 128,4,128,16384; do
  n=$(echo $sh | tr , _)
  case $sh in 128,4,128,16384) R=300; RO=100;; *) R=2000; RO=700;; esac
  fm fm-hot-$n $sh $R; ours ours-hot-$n $sh $RO; fm fm-hot2-$n $sh $R
  echo hot $n t $SECONDS
done
kill $SMI
cd $OUT && python3 - <<'PY'
import datetime, csv, glob
marks = {}
for l in open('marks.txt'):
    n, k, t = l.split(); marks.setdefault(n, {})[k] = float(t)
rows = []
for l in open('smi.csv'):
    p = [x.strip() for x in l.split(',')]
    try: rows.append((datetime.datetime.strptime(p[0], '%Y/%m/%d %H:%M:%S.%f').timestamp(), float(p[1].split()[0]), float(p[2].split()[0]), p[3], p[4]))
    except Exception: pass
def t_of(n):
    if n.startswith('fm'):
        for l in open(n + '.txt'):
            p = l.split()
            if p and p[0] == 'fm': return float(p[5])
    else:
        for x in csv.DictReader(open(n + '.csv')):
            if x['kernel'] == 'decode' and x['mode'] == 'fast': return float(x['time_us'])
for n, m in marks.items():
    sel = [r for r in rows if m['start'] <= r[0] <= m['end']]
    if n.startswith('ours'): sel = sel[len(sel) * 2 // 3:]  # the launches come after the ceilings: the last third
    busy = [r for r in sel if r[2] > 250]
    if not busy: print(n, 'no busy samples'); continue
    capped = sum(1 for r in busy if int(r[4], 16) & 4)
    print('%-26s %8.1f us  samples %4d busy %4d  SM %4.0f MHz (min %4.0f)  power %3.0f W  temp %s  power-capped %3d%%' % (
        n, t_of(n) or 0, len(sel), len(busy), sum(r[1] for r in busy) / len(busy), min(r[1] for r in busy),
        sum(r[2] for r in busy) / len(busy), busy[-1][3], 100 * capped // len(busy)))
PY
tar czf all.tgz *.csv *.txt 2>/dev/null; rm -f *.csv log-*.txt fm-*.txt
