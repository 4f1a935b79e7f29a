-- Release a lock if it is still ours, and tell waiters.
-- KEYS[1]: the lock key. ARGV[1]: the owner token. ARGV[2]: the release
-- channel (plain PUBLISH: on a cluster it reaches every node).
-- Returns 1 when the lock was ours and is now deleted, 0 otherwise (expired,
-- or taken by someone else, whose lock is left alone).
if redis.call('GET', KEYS[1]) == ARGV[1] then
  redis.call('DEL', KEYS[1])
  redis.call('PUBLISH', ARGV[2], 'released')
  return 1
end
return 0
