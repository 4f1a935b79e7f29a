-- The token bucket's stored state, shared by token_bucket.lua and
-- token_bucket_lean.lua (the loader puts it after rate_prelude.lua). The
-- empty instant under `key`, in units of 1/per µs after now: absent or
-- foreign reads as a full bucket, and a full bucket holds no more than its
-- capacity (`full` = capacity × interval).
local function bucket_empty(key, per, full)
  local empty = stored_instant(key, per) or -full
  if empty < -full then return -full end
  return empty
end
-- Writes the empty instant `after`, a check made `wait` µs ahead or 0: the
-- key lives until the bucket is full again, at least 1 ms.
local function bucket_store(key, after, per, full, wait)
  local px = math.ceil((ceil_us(after + full, per) + wait) / 1000)
  if px < 1 then px = 1 end
  -- '%d' for PX too: cheaper than Redis's own '%.17g' conversion of a number.
  store(key, instant(after, per), string.format('%d', px))
end
