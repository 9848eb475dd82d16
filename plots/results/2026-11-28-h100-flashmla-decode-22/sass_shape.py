import sys,re
# op stream: M=MUFU.EX2 P=F2FP A=WARPGROUP.ARRIVE H=HGMMA 64x256 with register A, G=other HGMMA, W=DEPBAR, B=BAR, j=BRA, .=other
ops=[]
for l in open(sys.argv[1]):
    m=re.match(r'\s*/\*([0-9a-f]{4})\*/\s+(@!?U?P\w+\s+)?([A-Za-z0-9_.]+)(.*)',l)
    if not m: continue
    op=m.group(3); rest=m.group(4)
    if op.startswith('MUFU.EX2'): c='M'
    elif op.startswith('F2FP'): c='P'
    elif op=='WARPGROUP.ARRIVE': c='A'
    elif op.startswith('WARPGROUP.DEPBAR'): c='W'
    elif op.startswith('HGMMA') and '64x256' in op and re.match(r'\s*R\d+, R\d+, gdesc',rest): c='H'
    elif op.startswith('HGMMA'): c='G'
    elif op.startswith('BAR'): c='B'
    elif op=='BRA': c='j'
    elif op=='FMUL': c='f'
    elif op.startswith('STS'): c='S'
    elif op.startswith('FENCE') or op.startswith('MEMBAR'): c='X'
    else: c='.'
    ops.append(c)
s=''.join(ops)
s=re.sub(r'f{8,}','F',s)
i=0
for m in re.finditer(r'H',s): pass
# print windows around each H group
for m in re.finditer(r'M',s):
    pass
# simply print from first M before H-cluster
for mm in re.finditer(r'H(?:[^G]{0,80}?H){3}',s):
    a=s.rfind('B',0,mm.start())
    print(s[a:mm.end()+3]); print()
