"""The table of a run folder with one scrub for both kernels: `python3 table.py DIR`. DIR holds
gpu-bench CSVs read-N.csv / write-N.csv (--scrub read / write) and FlashMLA harness outputs
fmread-N.txt (FMBENCH_SCRUB=read) / fmmem-N.txt (its memset). Per shape: each side's times per
process, and our mean over FlashMLA's under the same scrub, fast and invariant."""
import collections, csv, os, sys

d = sys.argv[1]
ours = collections.defaultdict(list)  # (shape, mode, scrub) -> [us]
fm = collections.defaultdict(list)  # (shape, scrub) -> [us]
for f in sorted(os.listdir(d)):
    p = os.path.join(d, f)
    if f.endswith('.csv') and f.split('-')[0] in ('read', 'write'):
        for x in csv.DictReader(open(p)):
            if x['kernel'] == 'decode':
                k = (x['heads'], x['q_len'], x['batch'], x['context'])
                ours[(k, x['mode'], f.split('-')[0])].append(float(x['time_us']))
    elif f.startswith('fm') and f.endswith('.txt'):
        scrub = {'read': 'read', 'mem': 'write'}[f[2:].split('-')[0]]
        for l in open(p):
            w = l.split()
            if w and w[0] == 'fm':
                fm[(tuple(w[1:5]), scrub)].append(float(w[5]))
mean = lambda v: sum(v) / len(v)
shapes = sorted({k[0] for k in ours}, key=lambda k: (-int(k[0]), int(k[1]), int(k[2]), int(k[3])))
for scrub in ('read', 'write'):
    print('scrub %s: H q B L | FlashMLA us | fast us | invariant us | fast/FM | invariant/FM' % scrub)
    for k in shapes:
        F = fm.get((k, scrub))
        fa, inv = ours.get((k, 'fast', scrub)), ours.get((k, 'invariant', scrub))
        if not F or not fa:
            continue
        j = lambda v: '/'.join('%.1f' % x for x in v)
        print('  %s %s %s %s | %s | %s | %s | %.3f | %.3f' % (*k, j(F), j(fa), j(inv), mean(fa) / mean(F), mean(inv) / mean(F)))
