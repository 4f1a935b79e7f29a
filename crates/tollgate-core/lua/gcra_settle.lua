-- GCRA settle. Under the estimate: the theoretical arrival time moves back
-- by the difference's emission intervals, never before now (a full bucket
-- needs no key), while the quota's own span lasts. Over it: the TAT moves
-- later by the difference from max(TAT, now), never beyond now + (burst +
-- debt) intervals. Time relative to now in units of 1/per µs, as in gcra.lua.
-- A give-back while waiters hold reservations behind the charge gives
-- nothing: their slots were fixed by the schedule as it stood, and moving
-- its end back would admit the next arrival on top of them. Only the last
-- reservation (a waiter that left before its slot) may give itself back.
-- A schedule past full (the TAT beyond burst intervals ahead) holds
-- reservations (or a debt); the charge's own slot, when still ahead, is
-- allowed. (An under-admission of the difference, never an over-admission.)
if applied and give > 0 then
  for i = 1, q do
    local interval, per = interval_of(ARGV[8 + 2 * i])
    local tat = stored_instant(KEYS[i + 1], per)
    if tat and tat > math.max(at - now, 0) * per + ARGV[7 + 2 * i] * interval then applied = false end
  end
  -- Refused: the marker this call wrote goes, and the charge stays open
  -- (a give-back once the waiters have gone still applies).
  if not applied then redis.call('DEL', KEYS[1]) end
end
if applied then
  for i = 1, q do
    local key = KEYS[i + 1]
    local interval, per = interval_of(ARGV[8 + 2 * i])
    local tat = stored_instant(key, per)
    if give > 0 then
      local g = still_held(i, give, interval, per)
      if tat and g > 0 then
        tat = tat - g
        if tat <= 0 then
          redis.call('DEL', key)
        else
          redis.call('SET', key, instant(tat, per), 'PX',
            string.format('%d', math.ceil(ceil_us(tat, per) / 1000)))
        end
      end
    else
      tat = math.max(tat or 0, 0)
      local most = math.min((ARGV[7 + 2 * i] + debt_of(i)) * interval, most_ahead(per))
      tat = math.min(tat + owe * interval, math.max(tat, most))
      redis.call('SET', key, instant(tat, per), 'PX',
        string.format('%d', math.max(math.ceil(ceil_us(tat, per) / 1000), 1)))
    end
  end
end
