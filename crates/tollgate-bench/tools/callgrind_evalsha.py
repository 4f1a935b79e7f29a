#!/usr/bin/env python3
"""EXPERIMENT: instructions per EVALSHA, counted by callgrind on redis-server
(repeatable, unlike wall-clock time on a shared machine).
Usage: callgrind_evalsha.py PORT LUADIR OUT.json [N] [--all]
LUADIR holds rate_prelude.lua and the five scripts (joined as the loader does).
Env: FRESH=1 (one server per workload: steadier figures), ONLY=substr,... ,
WL_JSON=file (own workloads). --all: count the whole server (network, parsing,
reply) instead of evalShaCommand only."""
import glob, json, os, socket, subprocess, sys, time

PORT, LUADIR, OUT = int(sys.argv[1]), sys.argv[2], sys.argv[3]
N = int(sys.argv[4]) if len(sys.argv) > 4 and not sys.argv[4].startswith('--') else 10000
ALL = '--all' in sys.argv
BENCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'lua')  # crates/tollgate-bench/lua
KEYS = 300
CGDIR = os.environ.get('CGDIR', '/tmp/cg')
os.makedirs(CGDIR, exist_ok=True)

from resp import Conn, enc  # noqa: E402 (beside this file)

def src(name):
    if name.startswith('bench:'):
        return open(os.path.join(BENCH, name[6:])).read()
    if name.startswith('file:'):
        return open(name[5:]).read()
    # An algorithm's stored state's helpers (<alg>_state.lua) come after the prelude.
    state = os.path.join(LUADIR, name[:-4] + '_state.lua')
    helpers = open(state).read() if os.path.exists(state) else ''
    return open(os.path.join(LUADIR, 'rate_prelude.lua')).read() + helpers + open(os.path.join(LUADIR, name)).read()

# (label, script, quotas [(a, b)], now mode, keys per call, expect allowed)
BIG = (1000000000, 3600000000)       # windows: limit, period
RATE = (1000000, 1000000)            # gcra / bucket: burst 1e6, 1 s per unit
WL = [
    ('noop', 'bench:noop.lua', [()], 'time', 1, None),
    ('TIME only', 'bench:ref_time.lua', [()], 'time', 1, None),
    ('floor TIME+GET+SET', 'bench:exp_floor_time_get_set.lua', [()], 'time', 1, None),
    ('fixed_window 1q', 'fixed_window.lua', [BIG], 'time', 1, 1),
    ('sliding_window_counter 1q', 'sliding_window_counter.lua', [BIG], 'time', 1, 1),
    ('sliding_window_log 1q (virtual now)', 'sliding_window_log.lua', [(1000000000, 1000000)], 'virt', 1, 1),
    ('sliding_window_log 1q (TIME, nothing expires)', 'sliding_window_log.lua', [(1000000000, 10**12)], 'time', 1, 1),
    ('token_bucket 1q', 'token_bucket.lua', [RATE], 'time', 1, 1),
    ('gcra 1q', 'gcra.lua', [RATE], 'time', 1, 1),
    ('token_bucket 2q', 'token_bucket.lua', [RATE, RATE], 'time', 2, 1),
    ('gcra 2q', 'gcra.lua', [RATE, RATE], 'time', 2, 1),
    ('fixed_window 2q', 'fixed_window.lua', [BIG, BIG], 'time', 2, 1),
    ('sliding_window_counter 2q', 'sliding_window_counter.lua', [BIG, BIG], 'time', 2, 1),
    ('sliding_window_log 2q (virtual now)', 'sliding_window_log.lua', [(1000000000, 1000000)] * 2, 'virt', 2, 1),
    ('DENIED fixed_window 1q', 'fixed_window.lua', [(1, 3600000000)], 'time', 1, 0),
    ('DENIED sliding_window_counter 1q', 'sliding_window_counter.lua', [(1, 3600000000)], 'time', 1, 0),
    ('DENIED sliding_window_log 1q', 'sliding_window_log.lua', [(1, 1000000000)], 'time', 1, 0),
    ('DENIED token_bucket 1q', 'token_bucket.lua', [(1, 10**12)], 'time', 1, 0),
    ('DENIED gcra 1q', 'gcra.lua', [(1, 10**12)], 'time', 1, 0),
]
if os.environ.get('WL_JSON'):
    WL = [tuple(x) for x in json.load(open(os.environ['WL_JSON']))]
if os.environ.get('ONLY'):
    WL = [w for w in WL if any(o in w[0] for o in os.environ['ONLY'].split(','))]

def main():
    global WL
    if os.environ.get('FRESH'):
        allw = WL; res = {}
        for w in allw:
            WL = [w]; res.update(run())
        json.dump(res, open(OUT, 'w'), indent=1)
        return
    json.dump(run(), open(OUT, 'w'), indent=1)

def run():
    pat = CGDIR + '/out.%d.%%p' % PORT
    for f in glob.glob(CGDIR + '/out.%d.*' % PORT): os.remove(f)
    vg = ['valgrind', '--tool=callgrind', '--callgrind-out-file=' + pat]
    if not ALL: vg.append('--toggle-collect=evalShaCommand')
    p = subprocess.Popen(vg + ['redis-server', '--port', str(PORT), '--save', '', '--appendonly', 'no'],
                         stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    res = {}
    try:
        c = Conn(PORT)
        virt = 1700000000000000
        for wi, (label, script, quotas, mode, nk, expect) in enumerate(WL):
            c.cmd('FLUSHALL')
            sha = c.cmd('SCRIPT', 'LOAD', src(script))
            qargs = [x for q in quotas for x in q]
            def call(i):
                nonlocal virt
                k = 0 if mode == 'time1' else i % (10 if mode == 'virt' else KEYS)
                keys = ['w%d:{%d}:%d' % (wi, k, j) for j in range(nk)]
                if mode == 'virt':
                    virt += 3000; now = virt  # 10 keys: ~33 live entries each; revisited well within the 1 s TTL
                else:
                    now = ''
                return c.cmd('EVALSHA', sha, nk, *keys, now, 1, '%016x' % i, *qargs)
            for i in range(2 * KEYS):
                call(i)
            subprocess.run(['callgrind_control', '-z', str(p.pid)], check=True, capture_output=True)
            allowed = 0
            for i in range(2 * KEYS, 2 * KEYS + N):
                r = call(i)
                if isinstance(r, list): allowed += r[0]
            before = set(glob.glob(CGDIR + '/out.%d.*' % PORT))
            subprocess.run(['callgrind_control', '-d', str(p.pid)], check=True, capture_output=True)
            new = sorted(set(glob.glob(CGDIR + '/out.%d.*' % PORT)) - before, key=os.path.getmtime)
            tot = None
            for line in open(new[-1]):
                if line.startswith('summary:') or line.startswith('totals:'):
                    tot = int(line.split()[1])
            if expect is not None:
                assert allowed == (N if expect else 0), (label, allowed)
            res[label] = tot / N
            print('%-40s %10.0f' % (label, tot / N), flush=True)
    finally:
        p.terminate(); p.wait()
    return res

main()
