-- The fixed window's step in a lean batch (rate_lean.lua): fixed_window.lua's
-- single-quota check. ARGV[2], ARGV[3]: limit and period (µs). The state is
-- this window's count. The step reads and writes the state itself, as
-- window_count and window_store do (and is the only writer: rate_lean.lua
-- stores a held state by a step of cost 0), with what depends only on the window
-- (its pattern, its prefix, the PX) formatted once per call. A key whose
-- window is later (a clock ahead wrote it) counts in that window; its
-- figures, which the client derives from this call's window, then end with
-- this window, up to a period before that one does.
local limit, period = ARGV[2] + 0, ARGV[3] + 0
local format, match = string.format, string.match
local w, this, value, px
-- The keys whose stored window is later than this call's (a clock ahead):
-- key -> that window, which their writes keep (window_count).
local ahead = {}
local function step(key, cost, count, keep, got)
  -- `now` is set once per call, after this file runs.
  if not w then
    w = math.floor(now / period)
    local ws = format('%d', w)
    value = ws .. ':%d'
    -- No stored window is negative ('%d+'): that pattern matches nothing.
    this = w >= 0 and '^' .. ws .. ':(%d+)$' or '[^%s%S]'
    px = format('%d', math.ceil(((w + 1) * period - now) / 1000))
  end
  if not count then
    -- This window's count as this script writes it; anything else (another
    -- window, leading zeros, foreign) as window_count reads it.
    local sc = got and match(got, this)
    if sc and #sc <= 15 then
      count = sc + 0
    elseif got then
      -- window_count reads the value from batch_view.
      batch_view[key] = got
      local counted
      count, counted = window_count(key, w)
      if counted ~= w then ahead[key] = counted end
    else
      count = 0
    end
  end
  if count + cost > limit then return count end
  -- Below 10^15 it reads back as written (window_count's 15 digits).
  if keep and count + cost < 1000000000000000 then return count, count + cost end
  -- window_store(key, w, count, reset). A key checked again in the batch
  -- reads the value back from batch_view.
  local later, v, p = ahead[key], nil, px
  if later then
    v = format('%d:%d', later, count + cost)
    p = format('%d', math.ceil(((later + 1) * period - now) / 1000))
  else
    v = format(value, count + cost)
  end
  if keep then batch_view[key] = v end
  redis.call('SET', key, v, 'PX', p)
  return count, count + cost, true
end
