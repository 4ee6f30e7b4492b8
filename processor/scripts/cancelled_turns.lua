--[==[
cancelled_turns: which of some active turns of a shard (those a finalise
left waiting for their cut) have a cancellation key, and of those which a
finalise can publish now (includes/cancel_check). This script writes
nothing. (The sweep checks its slice of the active turns itself:
sweep_shard.)

KEYS[1] updates stream
KEYS[1 + 2*(t-1) + 1..2]   per turn t: cancellation key, turn hash

ARGV[1] consumer group   ARGV[2] this consumer   ARGV[3] its floor (includes/watermark)

Returns { the (1-based) indexes of the turns to finalise as cancelled now,
those of the cancelled turns that must wait } (a turn in neither is not
cancelled, or not active any more)
]==]

local updates = KEYS[1]
local group, consumer, floor = ARGV[1], ARGV[2], ARGV[3]

--- includes/cancel_check

local ready, waiting = cancel_check((#KEYS - 1) / 2,
  function(t) return KEYS[2 * t] end, function(t) return KEYS[2 * t + 1] end,
  updates, group, consumer, floor)
return { ready, waiting }
