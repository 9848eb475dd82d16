import csv,collections,math,sys
def pick(H,q,B,L):
    rb=math.ceil(H*q/64); u,c=((1024,2) if rb<=1 else (2048,max(4//rb,1)))
    per=math.ceil(L/c); ln=math.ceil(per/u)*u; n=math.ceil(L/ln)
    if n==1: return "grid, 1 split"
    if rb>=2 and ln>=4096: return 'persistent (long splits)'
    g=B*rb; pw=66; w=math.ceil(g/pw); last=g-(w-1)*pw
    if rb>=2: return 'persistent (last wave %d/66)'%last if last*6<=pw*5 else 'grid (last wave %d/66)'%last
    return 'persistent (%d waves, last %d/66)'%(w,last) if w>=2 and last*2<=pw else 'grid (%d waves, last %d/66)'%(w,last)
d=sys.argv[1]
t=collections.defaultdict(lambda: collections.defaultdict(list))
files=[f for f in ('held-1.csv','held-2.csv','new-1.csv') if __import__('os').path.exists(d+'/'+f)]
for f in files:
  for x in csv.DictReader(open(d+'/'+f)):
    if x['kernel']=='decode': t[(int(x['heads']),int(x['q_len']),int(x['batch']),int(x['context']))][x['mode']].append(float(x['time_us']))
out=open(d+'/summary.txt','w')
out.write('H q B L | invariant inv-graph inv-persist fast (us, per process) | persist/graph invariant/graph (means) | final rule\n')
for k in t:
    dd=t[k]; m={a:sum(v)/len(v) for a,v in dd.items()}
    out.write('%d %d %d %d | %s | %.3f %.3f | %s\n'%(k+(' '.join('/'.join('%.1f'%y for y in dd[a]) for a in ('invariant','inv-graph','inv-persist','fast')),m['inv-persist']/m['inv-graph'],m['invariant']/m['inv-graph'],pick(*k))))
