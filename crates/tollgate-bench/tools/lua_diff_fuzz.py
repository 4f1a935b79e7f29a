#!/usr/bin/env python3
"""EXPERIMENT: differential fuzz of two versions of the rate scripts.
Usage: lua_diff_fuzz.py OLD_LUADIR NEW_LUADIR [STEPS]   (env SEED=n)
Runs OLD on one redis-server and NEW on another (ports 6381, 6382) with the same
random steps (explicit now, costs, quotas, stray values written into the keys),
and compares every reply (or that both failed), every key's value, and every
command the scripts issued (MONITOR), arguments included."""
import os, random, socket, subprocess, sys, time
OLD, NEW = sys.argv[1], sys.argv[2]
STEPS = int(sys.argv[3]) if len(sys.argv) > 3 else 3000

from resp import Conn as _Conn, Err, enc  # beside this file


def Conn(port):
    # Error replies are compared, not raised.
    return _Conn(port, raise_errors=False, tries=100)

ports = [6381, 6382]
procs = [subprocess.Popen(['redis-server', '--port', str(p), '--save', '', '--appendonly', 'no'],
                          stdout=subprocess.DEVNULL) for p in ports]
try:
    cs = [Conn(p) for p in ports]
    mons = [Conn(p) for p in ports]
    for m in mons: assert m.cmd('MONITOR') == 'OK'
    names = ['fixed_window', 'sliding_window_counter', 'sliding_window_log', 'token_bucket', 'gcra']
    def src(d, n):
        # An algorithm's stored state's helpers (<alg>_state.lua) come after the prelude.
        state = os.path.join(d, n + '_state.lua')
        helpers = open(state).read() if os.path.exists(state) else ''
        return open(os.path.join(d, 'rate_prelude.lua')).read() + helpers + open(os.path.join(d, n + '.lua')).read()
    shas = [{n: c.cmd('SCRIPT', 'LOAD', src(d, n)) for n in names} for c, d in zip(cs, [OLD, NEW])]
    rng = random.Random(int(os.environ.get('SEED', '1')))
    foreign = ['abc', '12', '5:x', 'x:5', '1:2:3', '3:4', '', ':', '7:', '1764812345678901', '0x10:2', ' 5:1', '5.0:2', '-3:2', '2:3:x', '2:x:3']
    nsteps = errs = 0
    for name in names:
        for nq in (1, 2, 3):
            for trial in range(4):
                now = rng.choice([0, 1000000, 1764812345678901, rng.randrange(10**6, 10**13)])
                quotas = []
                for _ in range(nq):
                    lim = rng.choice([1, 2, 3, 5, 7, 20, 1000])
                    per = rng.choice([1, 999, 1000, 1500000, 3600000000, rng.randrange(1, 5 * 10**6)])
                    if name == 'sliding_window_log' and per < 20000:
                        per += 20000  # PEXPIRE of 1 ms can lapse in real time (Redis checks mstime() twice)
                    quotas.append((lim, per))
                subject = '%s:%d:%d' % (name, nq, trial)
                keys = ['{%s}:%d' % (subject, j) for j in range(nq)]
                for step in range(STEPS // 60):
                    if rng.random() < 0.03:
                        k = rng.choice(keys); v = rng.choice(foreign)
                        for c in cs: c.cmd('SET', k, v)
                    if rng.random() < 0.04:
                        for c in cs: c.cmd('DEL', *keys)
                    now += rng.choice([0, 1, 7, rng.randrange(0, 400000), rng.randrange(0, 4 * 10**6)])
                    cost = rng.choice([0, 1, 1, 1, 2, 3, 4, 1500, 2500])
                    nowarg = now
                    args = [nq, *keys, nowarg, cost, '%016x' % rng.getrandbits(64)] + [x for q in quotas for x in q]
                    r = []
                    for c, sh in zip(cs, shas):
                        # MULTI freezes the clock, so a 1 ms PX cannot lapse before PERSIST.
                        c.cmd('MULTI'); c.cmd('EVALSHA', sh[name], *args); c.cmd('PERSIST', *keys[:1])
                        for k in keys[1:]: c.cmd('PERSIST', k)
                        r.append(c.cmd('EXEC')[0])
                    if isinstance(r[0], Err) or isinstance(r[1], Err):
                        errs += 1
                        assert isinstance(r[0], Err) and isinstance(r[1], Err), (name, quotas, now, cost, r)
                    else:
                        assert r[0] == r[1], (name, quotas, now, cost, r)
                    # state: compare values of every key
                    for k in keys:
                        st = []
                        for c in cs:
                            t = c.cmd('TYPE', k)
                            v = c.cmd('ZRANGE', k, 0, -1, 'WITHSCORES') if t == 'zset' else c.cmd('GET', k)
                            st.append((t, v))
                        assert st[0] == st[1], (name, k, st)
                    nsteps += 1
    # Compare the commands the scripts issued.
    for c in cs: c.cmd('SET', 'end-marker', '1')
    logs = []
    for m in mons:
        lines = []
        while True:
            l = m.read()
            body = l.split('] ', 1)[1]
            if body.startswith('"SET" "end-marker"'): break
            if 'lua]' in l: lines.append(body)
        logs.append(lines)
    n = min(len(logs[0]), len(logs[1]))
    for i in range(n):
        if logs[0][i] != logs[1][i]:
            print('first command difference at', i, '\n old:', logs[0][i], '\n new:', logs[1][i])
            break
    from collections import Counter
    co, cn = Counter(l.split(' ')[0] for l in logs[0]), Counter(l.split(' ')[0] for l in logs[1])
    wo = [l for l in logs[0] if not l.startswith(('"GET"', '"ZCARD"', '"ZRANGE"', '"TIME"'))]
    wn = [l for l in logs[1] if not l.startswith(('"GET"', '"ZCARD"', '"ZRANGE"', '"TIME"'))]
    print('steps', nsteps, 'errors(both)', errs, 'old cmds', dict(co), 'new cmds', dict(cn))
    print('write commands identical:', wo == wn, len(wo))
    print('all commands identical:', logs[0] == logs[1])
finally:
    for p in procs: p.terminate()
