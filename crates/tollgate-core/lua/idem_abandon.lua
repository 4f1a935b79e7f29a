-- Give up a claimed idempotency key (the handler failed: a 5xx, a panic, a
-- client that went away) so that a retry may run: the lease and the
-- in-flight record go, if they are still this holder's.
-- KEYS[1]: the lease's lock key. KEYS[2]: the record.
-- ARGV[1]: the owner token. ARGV[2]: the claim's fence. ARGV[3]: the
-- release channel.
-- Returns 1 when abandoned, 0 when the claim was no longer this holder's.
if redis.call('GET', KEYS[1]) ~= ARGV[1] then return 0 end
if redis.call('HGET', KEYS[2], 'f') == ARGV[2] then
  redis.call('DEL', KEYS[2])
end
redis.call('DEL', KEYS[1])
redis.call('PUBLISH', ARGV[3], 'released')
return 1
