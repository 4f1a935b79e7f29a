-- GCRA's step in a lean batch (rate_lean.lua): gcra.lua's single-quota
-- check without a wait. ARGV[2], ARGV[3]: burst and emission interval.
-- The state is the TAT (units of 1/per µs after now, ≥ 0). The step reads
-- and writes the state itself, as gcra_tat and gcra_store do (a function
-- call per layer costs Redis more than the check's arithmetic), and is the
-- only writer: rate_lean.lua stores a held state by a step of cost 0.
local interval, per = interval_of(ARGV[3])
local limit_at = ARGV[2] * interval
local tonumber, format, floor, ceil, call = tonumber, string.format, math.floor, math.ceil, redis.call
-- In whole µs (per 1) every TAT is whole (read strictly, whole costs and
-- interval): gcra_store's roundings are no-ops, and C calls cost.
local whole = per == 1
local function step(key, cost, tat, keep, got)
  if not tat then
    local us = got and tonumber(got)
    if us then
      -- A plain number: gcra_tat's reading, where past, not whole units or
      -- 2^52 units away reads as 0.
      tat = (us - now) * per
      if not (tat > 0 and tat < 4503599627370496 and tat % 1 == 0) then tat = 0 end
    elseif got then
      -- The state's own reading, which reads the value from batch_view.
      batch_view[key] = got
      tat = gcra_tat(key, per)
    else
      tat = 0
    end
  end
  local nt = tat + cost * interval
  if nt > limit_at then return tat end
  -- A TAT below 2^52 reads back as written (stored_instant's bound).
  if keep and nt < 4503599627370496 then return tat, nt end
  -- gcra_store(key, nt, per, 0). A key checked again in the batch reads
  -- the value back from batch_view.
  local v, px
  if whole then
    v, px = format('%d', now + nt), ceil(nt / 1000)
  else
    local us = floor(nt / per)
    local frac = nt - us * per
    v = frac == 0 and format('%d', now + us) or format('%d:%d', now + us, frac)
    px = ceil(ceil(nt / per) / 1000)
  end
  if keep then batch_view[key] = v end
  call('SET', key, v, 'PX', format('%d', px < 1 and 1 or px))
  return tat, nt, true
end
