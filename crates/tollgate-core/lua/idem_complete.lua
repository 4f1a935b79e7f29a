-- Store the response of a claimed idempotency key, fenced: only while the
-- record still carries the claim's fence, so a holder whose claim was
-- superseded never overwrites a newer record. A claim sets the lease and
-- the record's fence together, so the fence alone says no later claim was
-- made: a lease that merely expired (the holder was slow, nobody claimed
-- since) still stores, and the retries get the response instead of running
-- the handler again. Then the lease, if still this holder's, is deleted and
-- waiters are told.
-- KEYS[1]: the lease's lock key. KEYS[2]: the record.
-- ARGV[1]: the owner token. ARGV[2]: the claim's fence. ARGV[3]: status.
-- ARGV[4]: headers. ARGV[5]: body. ARGV[6]: '1' when replayable.
-- ARGV[7]: the record's TTL in ms. ARGV[8]: the release channel.
-- Returns 1 when stored, 0 when the record is no longer this claim's.
--
-- Idempotent per claim: a complete sent again after its reply was lost (the
-- layer retries a failed completion) finds the record done with this claim's fence — a
-- fence is handed out once, so only this claim can have stored it — and
-- answers 1 again instead of "no longer ours".
local record = redis.call('HMGET', KEYS[2], 's', 'f')
if record[2] ~= ARGV[2] then return 0 end
if record[1] == 'd' then return 1 end
redis.call('HSET', KEYS[2], 's', 'd', 'c', ARGV[3], 'h', ARGV[4], 'b', ARGV[5], 'r', ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
if redis.call('GET', KEYS[1]) == ARGV[1] then redis.call('DEL', KEYS[1]) end
redis.call('PUBLISH', ARGV[8], 'released')
return 1
