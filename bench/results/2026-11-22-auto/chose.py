import json,sys,statistics as st
for f in sys.argv[1:]:
    r=json.load(open(f)); d='tx' if '-tx' in f else 'rx'
    for size in sorted({x['size'] for x in r['runs']}):
        runs=[x for x in r['runs'] if x['size']==size]
        auto=[x for x in runs if (x['tx'] if d=='tx' else x['rx'])=='auto']
        if d=='tx':
            a=auto[0]['sender_stats']['auto']; chose='copy' if a['chose_by_profile']==0 else 'profile:'+('uring' if auto[0]['sender_stats']['tx_bytes_zerocopy']>0 else '?')
        else:
            chose=auto[0].get('rx_in_effect') or 'copy'
        cost=lambda xs: st.median([x['sender_cpu_s_per_gib']+x['receiver_cpu_s_per_gib'] for x in xs])
        same=[x for x in runs if (x['tx'] if d=='tx' else x['rx'])==chose.split(':')[-1]]
        print(f"{f.split('/')[-1]:22} {d} {size:>8} auto took {chose:14} auto {cost(auto):.3f} vs that path alone {cost(same):.3f} ({100*(cost(auto)/cost(same)-1):+.1f}%)")
