-- Token bucket settle. Under the estimate: the tokens go back into the
-- bucket, never above its capacity (a full bucket needs no key), while the
-- quota's own span lasts. Over it: the empty instant moves later by the
-- difference, the tokens never below -debt. Time relative to now in units
-- of 1/per µs, as in token_bucket.lua.
-- A give-back while waiters hold reservations behind the charge gives
-- nothing: their slots were fixed by the bucket as it stood, and moving
-- its empty instant back would admit the next arrival on top of them. Only
-- the last reservation (a waiter that left before its slot) may give itself
-- back. An empty instant ahead of now means reservations (or a debt); the
-- charge's own slot, when still ahead, is allowed. (An under-admission of
-- the difference, never an over-admission.)
if applied and give > 0 then
  for i = 1, q do
    local _, per = interval_of(ARGV[8 + 2 * i])
    local empty = stored_instant(KEYS[i + 1], per)
    if empty and empty > math.max(at - now, 0) * per then applied = false end
  end
  -- Refused: the marker this call wrote goes, and the charge stays open
  -- (a give-back once the waiters have gone still applies).
  if not applied then redis.call('DEL', KEYS[1]) end
end
if applied then
  for i = 1, q do
    local key = KEYS[i + 1]
    local interval, per = interval_of(ARGV[8 + 2 * i])
    local full = ARGV[7 + 2 * i] * interval
    local empty = stored_instant(key, per)
    if give > 0 then
      local g = still_held(i, give, interval, per)
      if empty and g > 0 then
        empty = empty - g
        if empty <= -full then
          redis.call('DEL', key)
        else
          redis.call('SET', key, instant(empty, per), 'PX',
            string.format('%d', math.ceil(ceil_us(empty + full, per) / 1000)))
        end
      end
    else
      empty = math.max(empty or -full, -full)
      local most = math.min(debt_of(i) * interval, most_ahead(per) - full)
      empty = math.min(empty + owe * interval, math.max(empty, most))
      redis.call('SET', key, instant(empty, per), 'PX',
        string.format('%d', math.max(math.ceil(ceil_us(empty + full, per) / 1000), 1)))
    end
  end
end
