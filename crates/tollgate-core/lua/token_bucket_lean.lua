-- The token bucket's step in a lean batch (rate_lean.lua): token_bucket.lua's
-- single-quota check without a wait. ARGV[2], ARGV[3]: capacity and refill
-- interval. The state is the empty instant (units of 1/per µs after now,
-- ≥ -capacity × interval). The step reads and writes the state itself, as
-- bucket_empty and bucket_store do (a function call per layer costs Redis
-- more than the check's arithmetic), and is the only writer: rate_lean.lua
-- stores a held state by a step of cost 0.
local interval, per = interval_of(ARGV[3])
local full = (ARGV[2] + 0) * interval
local tonumber, format, floor, ceil, call = tonumber, string.format, math.floor, math.ceil, redis.call
-- In whole µs (per 1, a whole capacity) every instant is whole (read
-- strictly, whole costs and interval): bucket_store's roundings are no-ops,
-- and C calls cost.
local whole = per == 1 and full % 1 == 0
local function step(key, cost, empty, keep, got)
  if not empty then
    local us = got and tonumber(got)
    if us then
      -- A plain number: bucket_empty's reading, where not whole units, 2^52
      -- units away or more than full reads as full.
      empty = (us - now) * per
      if not (empty >= -full and empty < 4503599627370496 and empty > -4503599627370496 and empty % 1 == 0) then
        empty = -full
      end
    elseif got then
      -- The state's own reading, which reads the value from batch_view.
      batch_view[key] = got
      empty = bucket_empty(key, per, full)
    else
      empty = -full
    end
  end
  if floor(-empty / interval) < cost then return empty end
  local after = empty + cost * interval
  -- Within ±2^52 it reads back as written (stored_instant's bound).
  if keep and after < 4503599627370496 and after > -4503599627370496 then return empty, after end
  -- bucket_store(key, after, per, full, 0). A key checked again in the
  -- batch reads the value back from batch_view.
  local v, px
  if whole then
    v, px = format('%d', now + after), ceil((after + full) / 1000)
  else
    local us = floor(after / per)
    local frac = after - us * per
    v = frac == 0 and format('%d', now + us) or format('%d:%d', now + us, frac)
    px = ceil(ceil((after + full) / per) / 1000)
  end
  if keep then batch_view[key] = v end
  call('SET', key, v, 'PX', format('%d', px < 1 and 1 or px))
  return empty, after, true
end
