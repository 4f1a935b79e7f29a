-- Prologue shared by the five rate-limit scripts; the loader prepends it to
-- each (Redis scripts cannot include one another).
-- ARGV[1]: now in µs, or '' to use the server's TIME. ARGV[2]: cost.
local now = ARGV[1] ~= '' and tonumber(ARGV[1]) -- '' (the default) skips a strtod
if not now then
  local t = redis.call('TIME')
  now = t[1] * 1000000 + t[2] -- string to number by arithmetic: cheaper than tonumber
end
-- Arithmetic coerces a string with one strtod; tonumber() runs two.
local cost = ARGV[2] + 0
local n = #KEYS
-- Stored state is read through redis.pcall: a key someone else wrote with
-- another type (WRONGTYPE) or a value no script writes is read as absent and
-- overwritten, like an expired key. A script error instead would leave the
-- value in place and fail every later check of that subject.
-- The string under `key`, or nil (absent, or of another type).
local function stored_string(key)
  local v = redis.pcall('GET', key)
  if type(v) == 'string' then return v end
end
-- The integer under `key` (a TAT, an empty instant), or nil: absent, of
-- another type, not a number, NaN, ±inf or beyond 2^53 (where integers stop
-- being exact; no script writes one). tonumber() of an error table is nil.
local function stored_int(key)
  local x = tonumber(redis.pcall('GET', key))
  if x and x > -9007199254740992 and x < 9007199254740992 then return x end
end
