# Where a coalesced decision's Redis time goes (issue #15): variants of the
# batch script (as shipped; without its final SETs; without the MGET; without
# pcall; with the algorithm replaced by a constant reply), 64 GCRA checks on
# distinct keys per call, script time per decision from INFO commandstats;
# then a single call of gcra.lua for reference.
#
#   python3 batch_breakdown.py PORT [LUA_DIR]   (needs redis-py; use a private
#                                               redis-server: it resets stats)
import os, sys, redis
L = (sys.argv[2] if len(sys.argv) > 2 else
     os.path.join(os.path.dirname(__file__), '..', '..', 'tollgate-core', 'lua')) + '/'
rd = lambda f: open(L + f).read()
def fn(name, body=None):
    return 'local function %s(KEYS, ARGV)\n%s\nend\n' % (name, body if body is not None else rd(name + '.lua'))
def batch(variant):
    prelude = rd('rate_prelude.lua')
    gcra = rd('gcra.lua')
    loop = rd('rate_batch.lua')
    if variant == 'stub':
        gcra = "return {1, now, 0, 0, 0, 0}"
    if variant == 'noflush':
        loop = loop.replace("redis.call('SET', key, batch_view[key], 'PX', px)", "")
    if variant == 'nomget':
        loop = loop.replace("local values = redis.call('MGET', unpack(reads))", "local values = {}")
    if variant == 'nopcall':
        loop = loop.replace("local ok, reply = pcall(decide[ARGV[a] + 0], keys, args)", "local ok, reply = true, decide[ARGV[a] + 0](keys, args)")
    return ('local now, cost, n\n' + prelude + rd('gcra_state.lua') + fn('fixed_window', 'return 0') + fn('sliding_window_log', 'return 0')
            + fn('sliding_window_counter', 'return 0') + fn('token_bucket', 'return 0') + fn('gcra', gcra)
            + 'local decide = {fixed_window, sliding_window_log, sliding_window_counter, token_bucket, gcra}\n' + loop)
r = redis.Redis(port=int(sys.argv[1]))
B = 64
calls = 3000
for variant in ['full', 'noflush', 'nomget', 'nopcall', 'stub']:
    sha = r.script_load(batch(variant))
    r.config_resetstat()
    for c in range(calls):
        keys, args = [], [B]
        for d in range(B):
            keys.append('exp:%s:{u%d}' % (variant, (c * B + d) % 1000))
            args += [5, 1, 5, '', 1, '', 1000, '1000']
        r.evalsha(sha, len(keys), *keys, *args)
    st = r.info('commandstats')['cmdstat_evalsha']
    print('%-8s %.2f us/decision  (%.1f us/call)' % (variant, st['usec'] / (calls * B), st['usec_per_call']))
# single script for reference
single = rd('rate_args.lua') + rd('rate_prelude.lua') + rd('gcra_state.lua') + rd('gcra.lua')
sha = r.script_load(single)
r.config_resetstat()
for c in range(calls * 4):
    r.evalsha(sha, 1, 'exp:single:{u%d}' % (c % 1000), '', 1, '', 1000, '1000')
st = r.info('commandstats')['cmdstat_evalsha']
print('single   %.2f us/call' % st['usec_per_call'])
