-- A subject an operator blocked is refused until the block ends, whatever
-- its quotas say. KEYS[n + 1], when given: the subject's block key, whose
-- value is the block's end (server µs; it expires then too). Returns
-- {-2, now, µs left}: blocked. A value no block writes reads as no block.
if KEYS[n + 1] then
  local ends = tonumber(stored_string(KEYS[n + 1]) or '')
  if ends and ends > now then return {-2, now, ends - now} end
end
