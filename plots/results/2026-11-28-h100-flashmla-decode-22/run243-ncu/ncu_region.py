import csv,re,collections,sys
def load(f):
    rows=list(csv.reader(open(f)))
    hi=[i for i,r in enumerate(rows) if r and r[0]=='Address'][0]
    h=rows[hi]; return h,[dict(zip(h,r)) for r in rows[hi+1:] if len(r)==len(h)]
def region(f,a,b,label,top=25):
    h,d=load(f)
    stalls=[c for c in h if c.startswith('stall_') and 'Not Issued' not in c]
    S=lambda r,c: int(r[c] or 0)
    tot=collections.Counter(); n=0
    for r in d[a:b+1]:
        n+=S(r,'Warp Stall Sampling (All Samples)')
        for c in stalls: tot[c]+=S(r,c)
    print(f'== {label}: instructions {a}..{b} ({b-a+1}), samples {n}')
    print('  '+', '.join(f'{k[6:]} {v}' for k,v in tot.most_common() if v))
    rs=sorted(d[a:b+1], key=lambda r:-S(r,'Warp Stall Sampling (All Samples)'))[:top]
    for r in rs:
        top3=sorted(((S(r,c),c[6:]) for c in stalls), reverse=True)[:3]
        print(f"  {S(r,'Warp Stall Sampling (All Samples)'):5d} {r['Source'].strip()[:60]:60s} {top3}")
if __name__=='__main__':
    region(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], int(sys.argv[5]) if len(sys.argv)>5 else 25)
