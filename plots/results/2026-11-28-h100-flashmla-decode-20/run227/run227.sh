#!/bin/bash
# run 227: the SM clock and power beside the launches: nvidia-smi sampled every 50 ms while base and FS_P_XOR alternate (2 rounds), and FlashMLA
S="--shape 128,2,64,4096 --shape 128,4,64,4096 --shape 128,4,128,16384"
FM="128,2,64,4096 128,4,64,4096 128,4,128,16384"
SECONDS=0
nvidia-smi -q -d POWER,CLOCK,TEMPERATURE,PERFORMANCE > $OUT/smi-q-start.txt 2>&1
nvidia-smi --query-gpu=timestamp,clocks.sm,clocks.mem,power.draw,enforced.power.limit,temperature.gpu,clocks_event_reasons.active --format=csv,noheader -lms 50 > $OUT/smi.csv 2>&1 &
SMI=$!
def() { case $1 in base) echo "";; xor) echo FS_P_XOR;; esac; }
# compile both variants' kernels first (NVRTC), so the timed processes start warm
for v in base xor; do SPECMLA_FLASH_DEFINES=$(def $v) timeout 60 .carry/gpu-bench --decode-only --shape 16,1,8,1024 --reps 2 --csv /dev/null > /dev/null 2>&1; done
for r in 1 2 3; do
  if [ $r = 2 ]; then order="xor base"; else order="base xor"; fi
  for v in $order; do
    echo "$v-$r start $(date +%s.%N)" >> $OUT/marks.txt
    SPECMLA_FLASH_DEFINES=$(def $v) timeout 120 .carry/gpu-bench --decode-only $S --reps 50 --csv $OUT/$v-$r.csv > $OUT/log-$v-$r.txt 2>&1; echo $v-$r rc $? t $SECONDS
    echo "$v-$r end $(date +%s.%N)" >> $OUT/marks.txt
  done
done
echo "fm start $(date +%s.%N)" >> $OUT/marks.txt
timeout 120 .carry/fmbench $FM > $OUT/fm-1.txt 2>&1; echo fm rc $? t $SECONDS
echo "fm end $(date +%s.%N)" >> $OUT/marks.txt
kill $SMI
nvidia-smi -q -d POWER,CLOCK,TEMPERATURE,PERFORMANCE > $OUT/smi-q-end.txt 2>&1
python3 - "$OUT" <<'PY'
import sys, datetime, collections
d = sys.argv[1]
marks = {}
for l in open(d + '/marks.txt'):
    n, k, t = l.split(); marks.setdefault(n, {})[k] = float(t)
rows = []
for l in open(d + '/smi.csv'):
    p = [x.strip() for x in l.split(',')]
    try:
        ts = datetime.datetime.strptime(p[0], '%Y/%m/%d %H:%M:%S.%f').timestamp()
        rows.append((ts, float(p[1].split()[0]), float(p[3].split()[0]), p[5], p[6]))
    except Exception:
        pass
for n, m in marks.items():
    sel = [r for r in rows if m['start'] <= r[0] <= m['end']]
    busy = [r for r in sel if r[2] > 300]  # samples while a kernel draws power
    if not busy: print(n, 'no busy samples', len(sel)); continue
    clk = sum(r[1] for r in busy) / len(busy); pw = sum(r[2] for r in busy) / len(busy)
    reasons = collections.Counter(r[4] for r in busy).most_common(2)
    print('%-7s samples %3d busy %3d  SM clock %.0f MHz  power %.0f W  temp %s  reasons %s' % (n, len(sel), len(busy), clk, pw, busy[-1][3], reasons))
PY
python3 plots/results/2026-11-28-h100-flashmla-decode-20/summary.py $OUT base xor
cd $OUT && tar czf all.tgz *.csv *.txt 2>/dev/null; rm -f *.csv log-*.txt
