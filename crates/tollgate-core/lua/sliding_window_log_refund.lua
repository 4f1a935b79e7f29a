-- Sliding window log refund: the charge's own entries leave the log (those
-- that already left the window are gone anyway).
for i = 1, n - 1 do
  local m = 0
  while m < cost do
    -- In chunks: unpack has a limit on how many values it returns.
    local members, k = {}, 0
    while m < cost and k < 1000 do
      m, k = m + 1, k + 1
      members[k] = ARGV[3] .. ':' .. m
    end
    -- pcall: a key of another type holds none of them (the next check
    -- repairs it).
    redis.pcall('ZREM', KEYS[i + 1], unpack(members))
  end
end
return 1
