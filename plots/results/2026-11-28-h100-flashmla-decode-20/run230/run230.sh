#!/bin/bash
# run 230: small-batch verify shapes (q 1, 2, 4 at B 4, 8, 16, L 4k; q 2 B 8 and q 4 B 4 at L 16k): the fast plan's pick against every schedule --sweep-splits times, FlashMLA beside
SH="128,1,4,4096 128,1,8,4096 128,1,16,4096 128,2,4,4096 128,2,8,4096 128,2,16,4096 128,4,4,4096 128,4,8,4096 128,4,16,4096 128,2,8,16384 128,4,4,16384"
S=$(for s in $SH; do echo -n "--shape $s "; done)
SECONDS=0
timeout 200 .carry/gpu-bench --decode-only --sweep-splits $S --csv $OUT/sweep-1.csv > $OUT/log-sweep-1.txt 2> $OUT/err-sweep-1.txt; echo sweep rc $? t $SECONDS
timeout 60 .carry/fmbench $SH > $OUT/fm-1.txt 2>&1; echo fm rc $? t $SECONDS
timeout 200 .carry/gpu-bench --decode-only $S --csv $OUT/plans-1.csv > $OUT/log-plans-1.txt 2> $OUT/err-plans-1.txt; echo plans rc $? t $SECONDS
timeout 60 .carry/fmbench $SH > $OUT/fm-2.txt 2>&1; echo fm2 rc $? t $SECONDS
cat $OUT/err-*.txt; grep -h "SM clock" $OUT/log-*.txt
cd $OUT && python3 - <<'PY' | tee summary.txt
import csv, collections
t = collections.defaultdict(dict); clk = collections.defaultdict(dict)
for f in ('sweep-1.csv', 'plans-1.csv'):
    for x in csv.DictReader(open(f)):
        if x['kernel'] == 'decode':
            k = (x['heads'], x['q_len'], x['batch'], x['context'])
            t[k][x['mode']] = float(x['time_us']); clk[k][f] = x['sm_mhz']
fm = collections.defaultdict(list)
for f in ('fm-1.txt', 'fm-2.txt'):
    for l in open(f):
        p = l.split()
        if p and p[0] == 'fm': fm[tuple(p[1:5])].append(float(p[5]))
print('us (ratio to the mean of FlashMLA\'s two); best = the fastest --sweep-splits schedule; SM MHz after the shape (sweep/plans)')
for k, d in t.items():
    F = sum(fm[k]) / len(fm[k])
    sweep = {m: v for m, v in d.items() if m.startswith(('splits', 'balanced', 'persist'))}
    best = min(sweep, key=sweep.get)
    print('H%s q%s B%s L%s' % k, 'FM %s' % '/'.join('%.1f' % v for v in fm[k]),
          '| fast %.1f (%.2f) | invariant %.1f (%.2f) | best %s %.1f (%.2f) | fast/best %.2f | MHz %s' % (
          d['fast'], d['fast'] / F, d['invariant'], d['invariant'] / F, best, sweep[best], sweep[best] / F, d['fast'] / sweep[best], '/'.join(clk[k].values())))
    print('   ', ' '.join('%s %.1f' % (m, v) for m, v in sorted(sweep.items(), key=lambda x: x[1])))
PY
tar czf all.tgz *.csv *.txt; rm -f *.csv log-*.txt err-*.txt fm-*.txt
