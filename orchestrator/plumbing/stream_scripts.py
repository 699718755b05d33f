"""The Lua scripts the hosts' stream reader (orchestrator/plumbing/streams.py) runs in Redis: a bounded read, the
take-over of what a dead reader left, and the age of the oldest entry not finished with. Plain text, no imports: what
each takes and returns is said above it."""

from __future__ import annotations

# KEYS: streams. ARGV: group, consumer, start ('>' new entries, '0' this consumer's pending ones), count per stream,
# count in all, max bytes, the entry name allowed the big bound, the big bound, max deliveries, streams per
# XREADGROUP, the read's byte budget (no further XREADGROUP once the entries measured so far weigh that much).
# Returns, per entry read: {stream, id, 'ok', fields} | {stream, id, 'size', bytes} | {stream, id, 'tries', n} |
# {stream, id, 'gone'} (deleted after it was read); per stream that failed: {stream, 'error', message}.
#
# New entries are read from many streams per XREADGROUP (up to MANY_STREAMS, an equal share of the count in all from
# each), in rounds: then again from the streams that gave all that was asked of them. Most of a fleet's streams have
# nothing new at any moment: one XREADGROUP per stream was, at 500 hosts, 2 ms of Redis's time per read and a tenth of
# its core (bench/scale.py).
# Pending entries (a reader starting again) are read one stream at a time, their delivery counts first.
#
# Bytes: Redis has no command that sizes an entry without reading it, and an XREADGROUP loads every entry it returns
# into the script's memory at once. So the first round asks each stream for one entry only (most streams have at most
# a few new ones), and every later XREADGROUP asks for as many as the byte budget left holds at the size the entries
# measured so far averaged; once the budget is spent no further XREADGROUP is made. One read then takes about its
# budget, not 500 entries of whatever size: a host that queued 85 MiB entries is read one entry at a time.
READ = """
local group, consumer, start = ARGV[1], ARGV[2], ARGV[3]
local per, budget = tonumber(ARGV[4]), tonumber(ARGV[5])
local maxb, bigname, bigmax, maxdel = tonumber(ARGV[6]), ARGV[7], tonumber(ARGV[8]), tonumber(ARGV[9])
local many, bytes = tonumber(ARGV[10]), tonumber(ARGV[11])
local out = {}
local measured, counted = 0, 0

-- How many entries each of `c` streams may be asked for: one until an entry was measured, then what the byte budget
-- left holds at the average size measured so far (at least one, at most `n`).
local function fits(n, c)
  if counted == 0 then return 1 end
  return math.max(1, math.min(n, math.floor(bytes * counted / (c * measured))))
end

local function take(key, entries, tries)
  for _, e in ipairs(entries) do
    local id, f = e[1], e[2]
    budget = budget - 1
    if not f then
      table.insert(out, {key, id, 'gone'})
    elseif (tries[id] or 0) >= maxdel then
      table.insert(out, {key, id, 'tries', tries[id]})
    else
      local size, limit = 0, maxb
      for j = 1, #f, 2 do
        size = size + #f[j] + #f[j + 1]
        if f[j] == 'name' and f[j + 1] == bigname then limit = bigmax end
      end
      bytes = bytes - size
      measured, counted = measured + size, counted + 1
      if size > limit then
        table.insert(out, {key, id, 'size', size})
      else
        table.insert(out, {key, id, 'ok', f})
      end
    end
  end
end

-- Reads up to `n` entries of one stream: new ones, or (a backlog read) this consumer's pending ones after id `from`.
-- Returns how many it read and the last one's id.
local function read_one(key, n, from)
  local tries = {}
  if start ~= '>' then
    local after = '-'
    if from ~= '0' then after = '(' .. from end
    local pending = redis.pcall('XPENDING', key, group, after, '+', n, consumer)
    if type(pending) == 'table' and not pending.err then
      for _, p in ipairs(pending) do tries[p[1]] = p[4] end
      -- Delivered twice already: a reader died on this batch. One entry at a time from here, so the entry that kills
      -- it is found and set aside alone, not with every neighbour it was read with.
      if #pending > 0 and pending[1][4] >= 2 then
        n = 1
        budget = 1
      end
    end
  end
  local res = redis.pcall('XREADGROUP', 'GROUP', group, consumer, 'COUNT', n, 'STREAMS', key, from)
  if type(res) == 'table' and res.err then
    table.insert(out, {key, 'error', res.err})
  elseif res then
    local entries = res[1][2]
    take(key, entries, tries)
    if #entries > 0 then return #entries, entries[#entries][1] end
  end
  return 0, nil
end

-- A backlog read: each stream's pending entries in order, one at first, then as many as the byte budget holds.
if start ~= '>' then
  for _, key in ipairs(KEYS) do
    local from, left = '0', per
    while budget > 0 and bytes > 0 and left > 0 do
      local n = fits(math.min(left, budget), 1)
      local got, last = read_one(key, n, from)
      if got < n then break end
      left, from = left - got, last
    end
    if budget <= 0 or bytes <= 0 then break end
  end
  return out
end

-- Rounds: every stream at first, then the streams that gave all that was asked of them (they may hold more), until
-- the count in all is reached or none may hold more. Each round asks each stream for an equal share of what is left.
local took = {}
local round = KEYS
local first = true
while #round > 0 and budget > 0 and bytes > 0 do
  local again = {}
  local i = 1
  while i <= #round and budget > 0 and bytes > 0 do
    local c = math.min(#round - i + 1, budget, many)
    local most = 0
    for j = i, i + c - 1 do most = math.max(most, took[round[j]] or 0) end
    local n = math.max(1, math.min(per - most, math.floor(budget / c)))
    if first then n = 1 else n = fits(n, c) end
    local args = {'XREADGROUP', 'GROUP', group, consumer, 'COUNT', n, 'STREAMS'}
    for j = i, i + c - 1 do args[#args + 1] = round[j] end
    for j = 1, c do args[#args + 1] = '>' end
    local res = redis.pcall(unpack(args))
    if type(res) == 'table' and res.err then
      -- A stream or its group is missing (a new host, a Redis that lost them): one at a time, so each says which.
      for j = i, i + c - 1 do
        if budget <= 0 or bytes <= 0 then break end
        read_one(round[j], math.min(per - (took[round[j]] or 0), budget), '>')
      end
    elseif res then
      for _, s in ipairs(res) do
        take(s[1], s[2], {})
        took[s[1]] = (took[s[1]] or 0) + #s[2]
        if #s[2] == n and took[s[1]] < per then table.insert(again, s[1]) end
      end
    end
    i = i + c
  end
  round = again
  first = false
end
return out
"""

# KEYS: streams. ARGV: group, consumer, min idle ms, count. Takes over (JUSTID: unread, uncounted) entries other
# consumers of the group read and left unacknowledged for that long; they are then read as this consumer's pending (the
# reader's next read is a backlog read when any was claimed). Returns how many it claimed.
CLAIM = """
local claimed = 0
for _, key in ipairs(KEYS) do
  local res = redis.pcall('XAUTOCLAIM', key, ARGV[1], ARGV[2], ARGV[3], '0-0', 'COUNT', ARGV[4], 'JUSTID')
  if type(res) == 'table' and not res.err then claimed = claimed + #res[2] end
end
return claimed
"""

# KEYS: streams. ARGV: group. The id of the oldest entry the group has not finished with, over all the streams:
# pending (read, not acknowledged) or not read yet. False when none waits.
OLDEST_WAITING = """
local oldest = nil
local function consider(id)
  local ms = tonumber(string.match(id, '^(%d+)'))
  if oldest == nil or ms < oldest then oldest = ms end
end
for _, key in ipairs(KEYS) do
  local groups = redis.pcall('XINFO', 'GROUPS', key)
  if type(groups) == 'table' and not groups.err then
    local last = nil
    for _, g in ipairs(groups) do
      local t = {}
      for j = 1, #g, 2 do t[g[j]] = g[j + 1] end
      if t['name'] == ARGV[1] then last = t['last-delivered-id'] end
    end
    local first
    if last then
      local p = redis.call('XPENDING', key, ARGV[1])
      if p[1] > 0 then consider(p[2]) end
      first = redis.call('XRANGE', key, '(' .. last, '+', 'COUNT', 1)
    else
      first = redis.call('XRANGE', key, '-', '+', 'COUNT', 1)
    end
    if #first > 0 then consider(first[1][1]) end
  end
end
if oldest == nil then return false end
return tostring(oldest)
"""
