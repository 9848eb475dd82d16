"""Per-shape A/B summary of a run folder's CSVs: `python3 summary.py DIR` where DIR holds
base-{1,2}.csv and bar-{1,2}.csv (the variant; named `bar` in every run's script) from
gpu-bench --decode-only, and fm-1.txt from the FlashMLA harness. Prints each mode's times
per process, variant/base (means) and both against FlashMLA."""
import collections, csv, os, sys

d = sys.argv[1]
t = collections.defaultdict(lambda: collections.defaultdict(list))
for v in ('base', 'bar'):
    for r in (1, 2):
        for x in csv.DictReader(open(os.path.join(d, '%s-%d.csv' % (v, r)))):
            if x['kernel'] == 'decode':
                t[(x['heads'], x['q_len'], x['batch'], x['context'])][(v, x['mode'])].append(float(x['time_us']))
fm = {}
for l in open(os.path.join(d, 'fm-1.txt')):
    p = l.split()
    if p and p[0] == 'fm':
        fm[tuple(p[1:5])] = float(p[5])
for k, e in t.items():
    m = {a: sum(x) / len(x) for a, x in e.items()}
    F = fm.get(k, 0) or 1
    out = []
    for mode in ('fast', 'invariant', 'inv-persist'):
        b, c = e.get(('base', mode)), e.get(('bar', mode))
        if b and c:
            out.append('%s base %s variant %s variant/base %.3f variant/FM %.3f base/FM %.3f' % (
                mode, '/'.join('%.1f' % x for x in b), '/'.join('%.1f' % x for x in c),
                m[('bar', mode)] / m[('base', mode)], m[('bar', mode)] / F, m[('base', mode)] / F))
    print('H%s q%s B%s L%s FM %.1f' % (k + (F,)), ' | '.join(out))
