-- Helpers shared by the five rate-limit scripts and the batch script; the
-- loader puts them after the locals `now`, `cost` and `n` (rate_args.lua, or
-- the batch's own), which they read as upvalues (Redis scripts cannot include
-- one another).
-- Stored state is read through redis.pcall: a key someone else wrote with
-- another type (WRONGTYPE) or a value no script writes is read as absent and
-- overwritten, like an expired key. A script error instead would leave the
-- value in place and fail every later check of that subject.
-- In a batch (rate_batch.lua) the strings stored under the batch's keys,
-- read by one MGET up front and kept current by `store` (key -> value, or
-- false for none: MGET reads a key of another type as none too), and the
-- writes waiting for the end of the batch (key -> PX). nil in a single call.
local batch_view, batch_writes
-- The string under `key`, or nil (absent, or of another type).
local function stored_string(key)
  if batch_view then
    local v = batch_view[key]
    if v ~= nil then return v or nil end
  end
  local v = redis.pcall('GET', key)
  if type(v) == 'string' then return v end
end
-- SET key value PX px (px: whole ms, as a string). In a batch the checks
-- after it read the value from batch_view; the batch script's writes wait
-- for the end of the batch (batch_writes) — the last one per key is what a
-- sequence of single calls would leave.
local function store(key, value, px)
  if batch_writes then
    batch_view[key], batch_writes[key] = value, px
    return
  end
  if batch_view then batch_view[key] = value end
  redis.call('SET', key, value, 'PX', px)
end
-- A quota's time argument: whole µs ('100000'), or an exact fraction of
-- them, '<ticks>/<per>' (a bucket's emission interval period/limit, reduced:
-- rounding it to whole µs would change the rate). Returns ticks, per: the
-- buckets count time in units of 1/per µs, so their arithmetic stays exact.
local function interval_of(s)
  local slash = string.find(s, '/', 1, true)
  if not slash then return s + 0, 1 end
  return string.sub(s, 1, slash - 1) + 0, string.sub(s, slash + 1) + 0
end
-- A bucket's instant (a TAT, an empty instant) under `key`, relative to
-- `now` in units of 1/per µs; nil when absent, of another type, or not such
-- a value (not a number, NaN, ±inf, not a whole number of units, 2^52
-- units or more from now: no script writes one, and a lean batch replies
-- the instant as an integer, exact only so). Stored as whole µs, plus
-- ':<frac>' units (0 < frac < per) when the instant falls between two
-- microseconds: only whole µs are ever absolute, so no figure nears 2^53.
local function stored_instant(key, per)
  local v = stored_string(key)
  if not v then return end
  local us, frac = tonumber(v), 0
  if not us then
    local colon = string.find(v, ':', 1, true)
    if not colon then return end
    us, frac = tonumber(string.sub(v, 1, colon - 1)), tonumber(string.sub(v, colon + 1))
    if not (us and frac and frac >= 0) then return end
    -- Units of another quota (changed under the same name): the next whole
    -- µs, later and so stricter for both buckets.
    if frac >= per or frac % 1 ~= 0 then us, frac = us + 1, 0 end
  end
  local rel = (us - now) * per + frac
  if rel < 4503599627370496 and rel > -4503599627370496 and rel % 1 == 0 then return rel end
end
-- The instant `rel` units of 1/per µs after now, as stored_instant reads it.
local function instant(rel, per)
  local us = math.floor(rel / per)
  local frac = rel - us * per
  if frac == 0 then return string.format('%d', now + us) end
  return string.format('%d:%d', now + us, frac)
end
-- Units of 1/per µs until one more unit is available, `room` units of room
-- (negative: a debt) into a quota of `interval` units per unit: room must
-- reach the next whole interval, and at least one (draft-10's `t`).
local function unit_after(room, interval)
  if room < 0 then return interval - room end
  return interval - room % interval
end
-- `x` units of 1/per µs in whole µs, rounded up (a client waiting that long
-- is not early). Exact: |x| < 2^52.
local function ceil_us(x, per)
  return math.ceil(x / per)
end
