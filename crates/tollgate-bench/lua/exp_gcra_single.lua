-- EXPERIMENT (not tollgate's script): gcra.lua's single-quota case as
-- straight-line code with locals — no per-quota tables, no loops. Same
-- arguments, same reply, same writes as gcra.lua with one key. A real change
-- would keep gcra.lua's loop for #KEYS > 1 and take this path for #KEYS == 1.
local now = tonumber(ARGV[1])
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2]
end
local cost = tonumber(ARGV[2])
local interval = tonumber(ARGV[5])
local limit_at = now + ARGV[4] * interval
local tat = tonumber(redis.call('GET', KEYS[1])) or now
if tat < now then tat = now end
local nt = tat + cost * interval
if nt > limit_at then
  local retry = nt - limit_at
  return {0, math.floor((limit_at - tat) / interval), tat - now, retry}
end
redis.call('SET', KEYS[1], string.format('%d', nt), 'PX', math.ceil((nt - now) / 1000))
return {1, math.floor((limit_at - nt) / interval), nt - now, 0}
