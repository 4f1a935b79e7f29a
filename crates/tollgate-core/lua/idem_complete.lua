-- Store the response of a claimed idempotency key, fenced: only while the
-- claim's lease is still this holder's and the record still carries its
-- fence, so a holder whose lease was lost or superseded never overwrites a
-- newer record. Then the lease is deleted and waiters are told.
-- KEYS[1]: the lease's lock key. KEYS[2]: the record.
-- ARGV[1]: the owner token. ARGV[2]: the claim's fence. ARGV[3]: status.
-- ARGV[4]: headers. ARGV[5]: body. ARGV[6]: '1' when replayable.
-- ARGV[7]: the record's TTL in ms. ARGV[8]: the release channel.
-- Returns 1 when stored, 0 when the claim was no longer this holder's.
--
-- Idempotent per claim: a complete sent again after its reply was lost (the
-- cluster client retries) finds the lease gone and the record done with
-- this claim's fence — a fence is handed out once, so only this claim can
-- have stored it — and answers 1 again instead of "no longer ours".
if redis.call('GET', KEYS[1]) ~= ARGV[1] then
  local done = redis.call('HMGET', KEYS[2], 's', 'f')
  if done[1] == 'd' and done[2] == ARGV[2] then return 1 end
  return 0
end
if redis.call('HGET', KEYS[2], 'f') ~= ARGV[2] then return 0 end
redis.call('HSET', KEYS[2], 's', 'd', 'c', ARGV[3], 'h', ARGV[4], 'b', ARGV[5], 'r', ARGV[6])
redis.call('PEXPIRE', KEYS[2], ARGV[7])
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[8], 'released')
return 1
