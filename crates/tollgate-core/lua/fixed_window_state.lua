-- The fixed window's stored state, shared by fixed_window.lua and
-- fixed_window_lean.lua (the loader puts it after rate_prelude.lua): one
-- string per key, "<window index>:<count>". The count of window `w` under
-- `key`: anything but "<digits>:<digits>" is not this script's and reads as
-- absent, and so does a count of more than 15 digits (a limit is at most
-- a period's µs, ten years': 15 digits; and a lean batch replies the count
-- as an integer, exact only so); a count from an earlier window no longer
-- counts.
local function window_count(key, w)
  local v = stored_string(key)
  if v then
    local sw, sc = string.match(v, '^(%d+):(%d+)$')
    if sw and sw + 0 == w and #sc <= 15 then return sc + 0 end
  end
  return 0
end
-- Writes `count` for window `w`, living until the window ends (`reset` µs).
local function window_store(key, w, count, reset)
  -- '%d' for PX too: cheaper than Redis's own '%.17g' conversion of a number.
  store(key, string.format('%d:%d', w, count), string.format('%d', math.ceil(reset / 1000)))
end
