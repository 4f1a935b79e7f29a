#!/usr/bin/env python3
"""EXPERIMENT: instructions per decision of a lean GCRA batch inside
redis-server, whole server (parsing, script, reply), counted by callgrind
(repeatable, unlike wall-clock time on a shared machine), against the
least-work sketch of crates/tollgate-bench/src/sketch_gcra.lua.
Usage: callgrind_lean.py PORT N NAME=LUADIR ...
Each LUADIR holds rate_prelude.lua, gcra_state.lua, gcra_lean.lua and
rate_lean.lua (joined as the loader does); N calls of 16 checks on 16 of
1000 subjects each, with the arguments tollgate sends (server time, one
cost, the block marker and index, distinct keys, no deadline); the sketch is always run last."""
import glob, os, subprocess, sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from resp import Conn  # noqa: E402 (beside this file)

PORT, N = int(sys.argv[1]), int(sys.argv[2])
SKETCH = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), 'src', 'sketch_gcra.lua')
VARIANTS = [a.split('=', 1) for a in sys.argv[3:]] + [('sketch', None)]
B, SUBJECTS = 16, 1000
CG = os.environ.get('CGDIR', '/tmp/cg-lean')


def body(luadir):
    if luadir is None:
        return open(SKETCH).read()
    parts = ['rate_prelude.lua', 'gcra_state.lua', 'gcra_lean.lua', 'rate_lean.lua']
    return 'local now, cost, n\n' + ''.join(open(os.path.join(luadir, p)).read() for p in parts)


def read_raw(conn):
    """A reply, bulk strings as bytes (the lean reply packs doubles)."""
    line = conn.f.readline()
    t, rest = line[:1], line[1:-2]
    if t == b'$':
        n = int(rest)
        return None if n < 0 else conn.f.read(n + 2)[:-2]
    if t == b'*':
        return [read_raw(conn) for _ in range(int(rest))]
    if t == b'-':
        raise RuntimeError(rest.decode())
    return rest


def main():
    os.makedirs(CG, exist_ok=True)
    for f in glob.glob(CG + '/out.*'):
        os.remove(f)
    server = subprocess.Popen(['valgrind', '--tool=callgrind', '--callgrind-out-file=' + CG + '/out.%p',
                               'redis-server', '--port', str(PORT), '--save', '', '--appendonly', 'no'],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        conn = Conn(PORT)
        conn.read = lambda: read_raw(conn)
        for name, luadir in VARIANTS:
            sha = conn.cmd('SCRIPT', 'LOAD', body(luadir)).decode()

            def call(i):
                keys = ['tgbench:%s:gcra:{s%d}' % (name, (i * B + d) % SUBJECTS) for d in range(B)]
                if luadir is None:
                    return conn.cmd('EVALSHA', sha, B, *keys, 1000, 1000)
                return conn.cmd('EVALSHA', sha, B + 2, *keys, 'tgbench:%s:block:any' % name,
                                'tgbench:%s:block:index' % name, '', 1000, 1000, 'u', B, 1, '')
            for i in range(300):
                call(i)
            subprocess.run(['callgrind_control', '-z', str(server.pid)], check=True, capture_output=True)
            for i in range(300, 300 + N):
                call(i)
            before = set(glob.glob(CG + '/out.*'))
            subprocess.run(['callgrind_control', '-d', str(server.pid)], check=True, capture_output=True)
            dump = max(set(glob.glob(CG + '/out.*')) - before, key=os.path.getmtime)
            total = next(int(l.split()[1]) for l in open(dump) if l.startswith(('summary:', 'totals:')))
            print('%-10s %8.0f instructions per decision' % (name, total / N / B), flush=True)
    finally:
        server.terminate()
        server.wait()


main()
