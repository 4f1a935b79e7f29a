-- The fixed window's stored state, shared by fixed_window.lua and
-- fixed_window_lean.lua (the loader puts it after rate_prelude.lua): one
-- string per key, "<window index>:<count>". The count of window `w` under
-- `key`: anything but "<digits>:<digits>" is not this script's and reads as
-- absent, and so does a count of more than 15 digits (a limit is at most
-- a period's µs, ten years': 15 digits; and a lean batch replies the count
-- as an integer, exact only so); a count from an earlier window no longer
-- counts. A count from the next window (written on a clock ahead of this
-- one: another instance's, or the server's before a failover) is the
-- current one: it counts, and an admission adds to it, under its window —
-- reading it as empty would let each clock admit a limit in turn. One
-- further ahead is another period's (the quota changed under the name),
-- and reads as absent.
-- Returns the count and the window it counts in.
local function window_count(key, w)
  local v = stored_string(key)
  if v then
    local sw, sc = string.match(v, '^(%d+):(%d+)$')
    if sw and #sc <= 15 and (sw + 0 == w or sw + 0 == w + 1) then return sc + 0, sw + 0 end
  end
  return 0, w
end
-- Writes `count` for window `w`, living until the window ends (`reset` µs).
local function window_store(key, w, count, reset)
  -- '%d' for PX too: cheaper than Redis's own '%.17g' conversion of a number.
  store(key, string.format('%d:%d', w, count), string.format('%d', math.ceil(reset / 1000)))
end
