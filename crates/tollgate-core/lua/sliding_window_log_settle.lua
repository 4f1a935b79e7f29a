-- Sliding window log settle. Under the estimate: the charge's last entries
-- leave the log (members <id>:m for m in actual+1..cost; those that already
-- left the window are gone anyway). Over it: the log drops what left the
-- window (as the check does) and gains the difference's entries at now
-- (members <id>:+m for m in cost+1..actual: named apart from the check's,
-- which a part of a charge, settled over its own cost, would otherwise
-- only move), never more than limit + debt live entries.
if applied then
  for i = 1, q do
    local key = KEYS[i + 1]
    -- Members <id>:<mark>m for m in from+1..to, in chunks (unpack has a
    -- limit on how many values it returns); `score` to add them, nil to
    -- remove.
    local function members(from, to, score, mark)
      local m = from
      while m < to do
        local args, k = {}, 0
        while m < to and k < 1000 do
          m, k = m + 1, k + 1
          if score then
            args[2 * k - 1], args[2 * k] = score, ARGV[3] .. ':' .. mark .. m
          else
            args[k] = ARGV[3] .. ':' .. mark .. m
          end
        end
        if score then
          redis.call('ZADD', key, unpack(args))
        else
          -- pcall: a key of another type holds none of them (the next
          -- check repairs it).
          redis.pcall('ZREM', key, unpack(args))
        end
      end
    end
    if give > 0 then
      members(cost - give, cost, nil, '')
    else
      local limit, period = ARGV[7 + 2 * i] + 0, ARGV[8 + 2 * i] + 0
      -- As the check's trim: a key of another type is not a log.
      if type(redis.pcall('ZREMRANGEBYSCORE', key, '-inf', string.format('%d', now - period))) == 'table' then
        redis.call('DEL', key)
      end
      local room = math.max(limit + debt_of(i) - redis.call('ZCARD', key), 0)
      local to = cost + math.min(owe, room)
      if to > cost then
        members(cost, to, string.format('%d', now), '+')
        redis.call('PEXPIRE', key, string.format('%d', math.ceil(period / 1000)))
      end
    end
  end
end
