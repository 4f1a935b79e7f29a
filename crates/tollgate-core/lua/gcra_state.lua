-- GCRA's stored state, shared by gcra.lua and gcra_lean.lua (the loader
-- puts it after rate_prelude.lua). The TAT under `key`, in units of 1/per µs
-- after now: absent, foreign or past reads as 0 (an idle subject).
local function gcra_tat(key, per)
  local tat = stored_instant(key, per) or 0
  if tat < 0 then return 0 end
  return tat
end
-- Writes the TAT `nt`, a check made `wait` µs ahead (a reservation) or 0:
-- the key lives until the TAT, at least 1 ms (a cost of 0 on an idle key).
local function gcra_store(key, nt, per, wait)
  local px = math.ceil((ceil_us(nt, per) + wait) / 1000)
  if px < 1 then px = 1 end
  -- '%d' for PX too: cheaper than Redis's own '%.17g' conversion of a number.
  store(key, instant(nt, per), string.format('%d', px))
end
