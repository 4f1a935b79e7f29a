-- Decides several rate-limit checks in one call (issue #15: coalescing).
-- The loader puts before it `local now, cost, n`, rate_prelude.lua, and each
-- algorithm's own script wrapped as `local function <alg>(KEYS, ARGV) ... end`
-- — the same code a single call runs, so no algorithm has a second copy —
-- and the table `decide` of those five functions.
-- ARGV[1]: the number of checks. Then per check, in order: its algorithm
-- (1 fixed window, 2 sliding log, 3 sliding counter, 4 token bucket,
-- 5 GCRA), its number of keys k, its number of arguments m, then its own
-- ARGV as a single call takes it (m values: now or '', cost, nonce, the
-- quotas' parameters, and its deadline if it has one). KEYS: every check's
-- keys, in order (a key per quota, then its block key if it has one, as in
-- rate_block.lua). All keys hash to
-- one slot (the same hash tag on a cluster).
-- Returns one reply per check, in order: the single call's reply, or the
-- error it raised as a string — one check's error fails that check only.
-- Checks run in order: a later check of a key sees what an earlier one took.
-- What the algorithms read with GET is read by one MGET first, and what they
-- SET is written once per key at the end (see `store` in rate_prelude.lua):
-- the commands, not the arithmetic, are most of a check's cost.
local reads, logs, a, k = {}, {}, 2, 0
for d = 1, ARGV[1] + 0 do
  local nk, m = ARGV[a + 1] + 0, ARGV[a + 2] + 0
  local nq = math.floor((m - 3) / 2)
  -- The sliding log (2) keeps a sorted set, read with its own commands; a
  -- block key (after the quotas' keys) is read by its PTTL.
  for i = 1, math.min(nk, nq) do
    if ARGV[a] == '2' then
      logs[KEYS[k + i]] = true
    else
      reads[#reads + 1] = KEYS[k + i]
    end
  end
  a, k = a + 3 + m, k + nk
end
-- A key both a log and a string algorithm use in this batch (only a foreign
-- or colliding key can be: keys carry their algorithm) would see the log's
-- writes and the deferred ones out of order: that batch reads and writes
-- as single calls do.
local mixed = false
for i = 1, #reads do
  if logs[reads[i]] then mixed = true end
end
if not mixed then
  batch_view, batch_writes = {}, {}
  -- In slices: unpack has a limit on how many values it returns.
  for from = 1, #reads, 1000 do
    local to = math.min(from + 999, #reads)
    local values = redis.call('MGET', unpack(reads, from, to))
    for i = from, to do batch_view[reads[i]] = values[i - from + 1] end
  end
end
local out, clock = {}, nil
a, k = 2, 0
for d = 1, ARGV[1] + 0 do
  local nk, m = ARGV[a + 1] + 0, ARGV[a + 2] + 0
  local keys, args = {}, {}
  for i = 1, nk do keys[i] = KEYS[k + i] end
  for i = 1, m do args[i] = ARGV[a + 2 + i] end
  -- As rate_args.lua, with one TIME for the whole batch.
  now = args[1] ~= '' and tonumber(args[1])
  if not now then
    if not clock then
      local t = redis.call('TIME')
      clock = t[1] * 1000000 + t[2]
    end
    now = clock
  end
  cost, n = args[2] + 0, math.floor((m - 3) / 2)
  -- As rate_deadline.lua: a check its caller no longer waits for is late;
  -- as rate_block.lua: a blocked subject is refused.
  local deadline = args[4 + 2 * n]
  local left = keys[n + 1] and redis.call('PTTL', keys[n + 1]) or 0
  if deadline and now > deadline + 0 then
    out[d] = {-1, now}
  elseif left > 0 then
    out[d] = {-2, now, left * 1000}
  else
    local ok, reply = pcall(decide[ARGV[a] + 0], keys, args)
    if ok then
      out[d] = reply
    elseif type(reply) == 'table' then
      -- Redis 7 raises a command's error as {err = '...'}.
      out[d] = tostring(reply.err)
    else
      out[d] = tostring(reply)
    end
  end
  a, k = a + 3 + m, k + nk
end
-- A write that fails here fails the whole call (every check gets the
-- error): no check is answered as admitted without its write.
if batch_writes then
  for key, px in pairs(batch_writes) do
    redis.call('SET', key, batch_view[key], 'PX', px)
  end
end
return out
