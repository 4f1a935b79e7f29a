-- Adds one instance's denial counts to a limiter's throttled list.
-- KEYS[1]: the list (sorted set: member = subject id, score = denials).
-- KEYS[2]: its details (hash: subject id -> '<last denial ms>|<label>').
-- ARGV[1]: how long the list lives after this addition (ms). ARGV[2]: how
-- many subjects it keeps (the most denied). Then per subject: its id, its
-- denials, its last denial (ms), its label ('' for none).
local ttl, keep = ARGV[1], ARGV[2] + 0
for i = 3, #ARGV, 4 do
  local id, last, label = ARGV[i], ARGV[i + 2] + 0, ARGV[i + 3]
  redis.call('ZINCRBY', KEYS[1], ARGV[i + 1], id)
  local old = redis.call('HGET', KEYS[2], id)
  if old then
    local bar = string.find(old, '|', 1, true)
    local old_last = bar and tonumber(string.sub(old, 1, bar - 1)) or 0
    if old_last > last then last = old_last end
    if label == '' and bar then label = string.sub(old, bar + 1) end
  end
  redis.call('HSET', KEYS[2], id, string.format('%d', last) .. '|' .. label)
end
local over = redis.call('ZCARD', KEYS[1]) - keep
if over > 0 then
  local gone = redis.call('ZRANGE', KEYS[1], 0, over - 1)
  redis.call('ZREMRANGEBYRANK', KEYS[1], 0, over - 1)
  redis.call('HDEL', KEYS[2], unpack(gone))
end
redis.call('PEXPIRE', KEYS[1], ttl)
redis.call('PEXPIRE', KEYS[2], ttl)
return 1
