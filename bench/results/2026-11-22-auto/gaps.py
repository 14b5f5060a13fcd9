import json,sys,statistics as st
for f in sys.argv[1:]:
    r=json.load(open(f))
    g={}
    for x in r['runs']:
        d='tx' if x['rx']=='copy' else ('rx' if x['tx']=='copy' else None)
        if x['tx']=='copy' and x['rx']=='copy': ds=['tx','rx']
        elif d: ds=[d]
        else: continue
        for d in ds:
            p=x['tx'] if d=='tx' else x['rx']
            g.setdefault((d,x['size'],x['touch']),{}).setdefault(p,[]).append(x['sender_cpu_s_per_gib']+x['receiver_cpu_s_per_gib'])
    for k in sorted(g):
        m={p:st.median(v) for p,v in g[k].items()}
        if 'auto' not in m: continue
        best=min((v,p) for p,v in m.items() if p!='auto')
        print(f"{f.split('/')[-1]:24} {k[0]} {k[1]:>8} touch={k[2]!s:5} auto {m['auto']:.3f}  best {best[1]:>8} {best[0]:.3f}  excess {100*(m['auto']/best[0]-1):+6.1f}%   all: "+" ".join(f"{p}={v:.3f}" for p,v in sorted(m.items())))
