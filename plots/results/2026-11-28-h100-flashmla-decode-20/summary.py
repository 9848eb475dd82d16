"""Per-shape summary of a run folder's CSVs against its baseline: `python3 summary.py DIR
base VARIANT...` where DIR holds NAME-1.csv, NAME-2.csv... per name (gpu-bench --decode-only, one
process each) and optionally fm-1.txt (the FlashMLA harness). For each shape and mode it
prints each name's times per process, then each variant's mean over the base's mean and
every name's mean over FlashMLA's."""
import collections, csv, os, sys

d, names = sys.argv[1], sys.argv[2:]
t = collections.defaultdict(lambda: collections.defaultdict(list))
for v in names:
    for r in range(1, 10):
        f = os.path.join(d, '%s-%d.csv' % (v, r))
        if not os.path.exists(f):
            continue
        for x in csv.DictReader(open(f)):
            if x['kernel'] == 'decode':
                t[(x['heads'], x['q_len'], x['batch'], x['context'])][(v, x['mode'])].append(float(x['time_us']))
fm = {}
if os.path.exists(os.path.join(d, 'fm-1.txt')):
    for l in open(os.path.join(d, 'fm-1.txt')):
        p = l.split()
        if p and p[0] == 'fm':
            fm[tuple(p[1:5])] = float(p[5])
for k, e in t.items():
    F = fm.get(k)
    print('H%s q%s B%s L%s' % k + (' FM %.1f' % F if F else ''))
    for mode in ('fast', 'invariant', 'inv-persist'):
        base = e.get((names[0], mode))
        if not base:
            continue
        mb = sum(base) / len(base)
        cells = []
        for v in names:
            x = e.get((v, mode))
            if not x:
                continue
            mv = sum(x) / len(x)
            cell = '%s %s' % (v, '/'.join('%.1f' % y for y in x))
            if v != names[0]:
                cell += ' (%.3f)' % (mv / mb)
            if F:
                cell += ' FM %.3f' % (mv / F)
            cells.append(cell)
        print('  %-11s' % mode, ' | '.join(cells))
