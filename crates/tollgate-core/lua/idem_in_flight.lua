-- Whether one idempotency record is in flight now (read-only): what an
-- operator's listing shows. The lease's owner token and the request's
-- fingerprint never leave the script.
-- KEYS[1]: the lease's lock key. KEYS[2]: the record (see idem_claim.lua).
-- A claim sets the lease and the record together, and completion or
-- abandon settles the record, so a record in flight under a live lease is
-- that lease's claim; one whose lease expired waits for a retry to replace
-- it and is not in flight.
-- Returns {0} unless in flight; else {1, now_us, fence, claimed_us ('' when
-- the claim did not store it), lease pttl_ms}.
if redis.call('TYPE', KEYS[2]).ok ~= 'hash' then return {0} end
local rec = redis.call('HMGET', KEYS[2], 's', 'f', 'a')
if rec[1] ~= 'f' or not rec[2] then return {0} end
local pttl = redis.call('PTTL', KEYS[1])
if pttl <= 0 then return {0} end
local t = redis.call('TIME')
return {1, t[1] * 1000000 + t[2], rec[2], rec[3] or '', pttl}
