"""The Lua scripts of a bucket kept in Redis: its takes (`BUCKET_SCRIPT`) and its capacity leases
(`LEASE_SCRIPT`), on the Redis server's clock so the hosts' clock skew does not matter.

KEYS[1] is the bucket hash, KEYS[2] the hash of its leases (same hash tag). A lease is a share of
the rate (per second) and of the burst that its holder spends in its own process; while it is
live the bucket refills at the rate less the leased shares and holds the burst less the leased
bursts, and a holder's first permits are taken from the bucket's level. So the bucket and every
holder's bucket together never hold more than the burst nor refill faster than the rate: no window
holds more grants than the one bucket would give, whichever sidecar the holders lease from.

A lease entry is "share burst until prev_share prev_burst prev_until demand told": the grant and
the one before it, kept until it ends unless its holder says it spends the new one (`holding`), since
until the answer reaches it the holder spends the old terms. What is reserved for a holder at a
time is the larger of its live grants. The bucket hash caches the sums (`lshare`, `lburst`) and the
next end of a grant (`lnext`): a take reads the leases only when a grant has ended since.

Whatever is read is held to what the scripts themselves could have written (levels within the
burst, shares within the rate, no time from the future beyond the longest lease), whoever wrote it.
"""

from __future__ import annotations

from typing import Final

MAX_LEASE_SECONDS: Final = 3600
MAX_LEASES_PER_KEY: Final = 256

# ARGV[1] burst, ARGV[2] refill per second; defines now, level, updated, paused, advance(), save()
_PRELUDE: Final = """
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local burst = tonumber(ARGV[1])
local rate = tonumber(ARGV[2])
local MAXL = @MAX_LEASE@
local function num(v, default, lo, hi)
  local x = tonumber(v)
  if x == nil or x ~= x then return default end
  return math.max(lo, math.min(hi, x))
end
local h = redis.call('HMGET', KEYS[1], 'level', 'updated', 'paused_until', 'lnext', 'lshare', 'lburst',
                     'asked', 'waiting_until')
local level = num(h[1], burst, 0, burst)
local updated = num(h[2], now, 0, now)
local lnext = num(h[4], nil, 0, now + MAXL)
local lshare = num(h[5], 0, 0, rate)
local lburst = num(h[6], 0, 0, burst)
local asked = num(h[7], 0, 0, 1e15)  -- permits asked for by takes, granted or not (their demand)
local waiting_until = num(h[8], 0, 0, now + MAXL)  -- a refused take waits (at least) until then
local leases = nil
local function read_leases()
  leases = {}
  local all = redis.call('HGETALL', KEYS[2])
  for i = 1, #all, 2 do
    local f = {}
    for x in string.gmatch(all[i + 1], '[^ ]+') do f[#f + 1] = x end
    if #f == 8 then
      leases[all[i]] = {num(f[1], 0, 0, rate), num(f[2], 0, 0, burst), num(f[3], 0, 0, now + MAXL),
                        num(f[4], 0, 0, rate), num(f[5], 0, 0, burst), num(f[6], 0, 0, now + MAXL),
                        num(f[7], 0, 0, rate), num(f[8], 0, 0, 1)}
    end
  end
end
local function reserved(e, at)
  local s, b = 0, 0
  if e[3] > at then s, b = e[1], e[2] end
  if e[6] > at then s, b = math.max(s, e[4]), math.max(b, e[5]) end
  return s, b
end
-- the leased sums at `at`, the next end of a grant after it and the last end
local function sums(at)
  local s, b, nxt, last = 0, 0, nil, at
  for _, e in pairs(leases) do
    local es, eb = reserved(e, at)
    s, b = s + es, b + eb
    for _, u in ipairs({e[3], e[6]}) do
      if u > at and (nxt == nil or u < nxt) then nxt = u end
      if u > last then last = u end
    end
  end
  return math.min(s, rate), math.min(b, burst), nxt, last
end
local dirty = false
-- refill to now, in stretches between the ends of grants (each end raises the rate and the cap)
local function advance()
  if leases == nil and lnext ~= nil and lnext <= now then read_leases() end
  if leases ~= nil then
    while updated < now do
      local s, b, nxt = sums(updated)
      local stop = now
      if nxt ~= nil and nxt < now then stop = nxt end
      level = math.min(burst - b, level + (rate - s) * (stop - updated))
      updated = stop
    end
    local last
    lshare, lburst, lnext, last = sums(now)
    for id, e in pairs(leases) do
      if e[3] <= now and e[6] <= now then
        redis.call('HDEL', KEYS[2], id)
        leases[id] = nil
      end
    end
    dirty = true
  else
    level = math.min(burst - lburst, level + (rate - lshare) * (now - updated))
  end
  level = math.max(0, level)
end
local function save(paused)
  redis.call('HSET', KEYS[1], 'level', tostring(level), 'updated', tostring(now),
             'paused_until', tostring(paused), 'asked', tostring(asked), 'waiting_until',
             tostring(waiting_until))
  local idle = math.max(0, paused - now) + 60
  if dirty then
    if lnext ~= nil then
      redis.call('HSET', KEYS[1], 'lnext', tostring(lnext), 'lshare', tostring(lshare),
                 'lburst', tostring(lburst))
    else
      redis.call('HDEL', KEYS[1], 'lnext', 'lshare', 'lburst')
    end
  end
  if lnext ~= nil then
    idle = idle + MAXL  -- leases may be live that long: the bucket must not be forgotten meanwhile
  else
    idle = idle + (burst - level) / rate
  end
  redis.call('PEXPIRE', KEYS[1], math.ceil(idle * 1000))
end
""".replace("@MAX_LEASE@", str(MAX_LEASE_SECONDS))

# ARGV: burst, rate, cost, mode (take|peek|pause), pause seconds, longest pause, then (take only)
# the costs of further callers. A take grants the callers in order, first come first served, and
# stops at the first whose cost is not there (or at once while paused): one run serves a batch of
# concurrent callers of the key. Returns {callers granted, wait seconds for the first not granted
# (0 if all were), level, pause remaining} (floats as strings: Lua numbers would be truncated to
# integers in the reply).
BUCKET_SCRIPT: Final = _PRELUDE + """
local mode = ARGV[4]
local paused = num(h[3], 0, 0, now + tonumber(ARGV[6]))
advance()
if mode == 'pause' then
  local till = now + tonumber(ARGV[5])
  if till > paused then paused = till end
end
local held = 0
if paused > now then held = paused - now end
local granted = 0
local wait = 0
local i = 3
local shared = math.max(rate - lshare, rate * 1e-9)
while i <= #ARGV do
  local cost = tonumber(ARGV[i])
  wait = held
  if level < cost then wait = math.max(wait, (cost - level) / shared) end
  if mode == 'take' then asked = asked + cost end
  if mode ~= 'take' or wait > 0 then break end
  level = level - cost
  granted = granted + 1
  wait = 0
  if i == 3 then i = 7 else i = i + 1 end
end
if mode == 'take' and wait > 0 then waiting_until = math.max(waiting_until, now + wait) end
save(paused)
return {granted, tostring(wait), tostring(level), tostring(math.max(0, paused - now))}
"""

# ARGV: burst, rate, lease id, demand (per second), seconds, spare (whole permits the holder's
# bucket has left), the holding share (per second; -1: none) and burst, release (1|0), the part
# of the burst that may be leased, the least share kept for the callers without a lease (per
# second), the least share worth holding (per second: a holder that holds nothing now and would
# get less is given nothing and not kept; its takes count with the callers' without a lease).
# The share: max-min fair over the live holders' demands and the callers without a
# lease (their demand: the permits their takes asked for since the last lease, granted or not,
# smoothed; all of the rate while a refused take waits), never more than is not reserved for the
# others. Returns {share
# per second, burst, initial permits moved to the holder, pause remaining (floats as strings),
# 1 if the holder was not kept (under the least share) else 0, then the lease ids to tell to renew
# now}.
LEASE_SCRIPT: Final = _PRELUDE + """
local paused = num(h[3], 0, 0, now + MAXL * 24)
read_leases()
advance()
local id = ARGV[3]
local seconds = num(ARGV[5], 1, 0.001, MAXL)
local per = burst / rate
local hs = redis.call('HMGET', KEYS[1], 'sampled_at', 'sampled', 'sdemand')
local sampled_at = num(hs[1], now, 0, now)
local sdemand = num(hs[3], 0, 0, rate)
if now > sampled_at then
  local sample = math.max(0, asked - num(hs[2], asked, 0, asked)) / (now - sampled_at)
  sdemand = sdemand + 0.5 * (math.min(sample, rate) - sdemand)
end
redis.call('HSET', KEYS[1], 'sampled_at', tostring(now), 'sampled', tostring(asked),
           'sdemand', tostring(sdemand))
local function put(lid, e)
  redis.call('HSET', KEYS[2], lid, string.format('%.17g %d %.17g %.17g %d %.17g %.17g %d',
                                                 e[1], e[2], e[3], e[4], e[5], e[6], e[7], e[8]))
end
local shared_demand = math.max(sdemand, num(ARGV[11], 0, 0, rate))
if waiting_until > now then shared_demand = rate end  -- callers wait for the shared bucket now
-- max-min fair over the callers without a lease ('') and every holder (`extra`: a new demand)
local function fair_split(extra, extra_demand)
  local order = {{'', shared_demand}}
  if extra ~= nil then order[2] = {extra, extra_demand} end
  for lid, e in pairs(leases) do
    if lid ~= extra then order[#order + 1] = {lid, e[7]} end
  end
  table.sort(order, function(x, y) if x[2] ~= y[2] then return x[2] < y[2] end return x[1] < y[1] end)
  local left, fair = rate, {}
  for i, p in ipairs(order) do
    local part = math.min(p[2], left / (#order - i + 1))
    fair[p[1]] = part
    left = left - part
  end
  return fair
end
local old = leases[id]
local count = 0
for _ in pairs(leases) do count = count + 1 end
local share, b, initial, dropped = 0, 0, 0, 0
local least = num(ARGV[12], 0, 0, 1e15)
local holds = 0
if old ~= nil then holds = reserved(old, now) + select(2, reserved(old, now)) end
local demand = num(ARGV[4], 0, 0, rate)
if ARGV[9] ~= '1' and least > 0 and holds <= 0 and fair_split(id, demand)[id] < least then
  dropped = 1  -- not worth holding now: not now, and not kept
  leases[id] = nil
  redis.call('HDEL', KEYS[2], id)
elseif ARGV[9] == '1' then
  leases[id] = nil
  redis.call('HDEL', KEYS[2], id)
elseif old ~= nil or count < @MAX_LEASES@ then
  local keep_part = num(ARGV[10], 0.5, 0, 1)
  local others_s, others_b = 0, 0
  for lid, e in pairs(leases) do
    if lid ~= id then
      local es, eb = reserved(e, now)
      others_s, others_b = others_s + es, others_b + eb
    end
  end
  local fair = fair_split(id, demand)
  share = math.max(0, math.min(fair[id], rate - fair[''] - others_s))
  b = math.min(math.max(1, math.floor(share * per * keep_part + 1e-9)),
               math.floor(burst * keep_part + 1e-9) - others_b)
  if paused > now or b < 1 or share <= 0 then share, b = 0, 0 end
  local ps, pb, pu = 0, 0, 0
  if old ~= nil then
    local hold_s, hold_b = num(ARGV[7], -1, -1, rate), num(ARGV[8], -1, -1, burst)
    local same = math.abs(hold_s - old[1]) * per <= 2e-6 * math.max(1, old[1] * per)
    if old[3] > now and hold_b == old[2] and same then
      ps, pb, pu = old[1], old[2], old[3]  -- the holder spends the last grant: the one before is done
    else
      ps, pb = reserved(old, now)
      pu = math.max(old[3], old[6])
    end
  end
  -- a holder given nothing now stays (reserving nothing) so that its demand counts at the others'
  -- renewals, and it gets its part at its own next one
  -- kept aside a little longer than its holder may spend it: the holder counts the lease on its
  -- own clock, which may run up to 1000 ppm (twice NTP's slew limit) slower than this one
  leases[id] = {share, b, now + seconds * 1.001 + 0.01, ps, pb, pu, demand, 0}
  put(id, leases[id])
end
-- who should renew now (leases.py `_rebalance`): the holders under what they could have now, and
-- those over their fair part while someone (a holder, or the callers without a lease) is short of
-- theirs; each told once until it renews
local told = {}
if paused <= now then
  local fair = fair_split(nil, 0)
  local function margin(f) return math.max(1 / per, 0.1 * f) end
  local total, held = 0, {}
  for lid, e in pairs(leases) do
    held[lid] = reserved(e, now)
    total = total + held[lid]
  end
  local short = rate - total < fair[''] - margin(fair[''])
  for lid, e in pairs(leases) do
    if e[3] > now and e[1] < fair[lid] - margin(fair[lid]) then short = true end
  end
  for lid, e in pairs(leases) do
    local reachable = math.min(fair[lid], rate - fair[''] - (total - held[lid]))
    local under = e[3] > now and e[1] < reachable - margin(reachable)
    local over = short and held[lid] > fair[lid] + margin(fair[lid])
    if lid ~= id and e[8] == 0 and (under or over) then
      told[#told + 1] = lid
      e[8] = 1
      put(lid, e)
    end
  end
end
local last
lshare, lburst, lnext, last = sums(now)
if b > 0 then
  -- the holder's first permits, above one period of the shared share kept for the others
  local keep = math.min(burst - lburst, math.max(1, math.ceil((rate - lshare) * per - 1e-9)))
  initial = math.max(0, math.min(b - num(ARGV[6], 0, 0, burst), math.floor(level - keep + 1e-9)))
  level = level - initial
end
level = math.min(level, burst - lburst)
dirty = true
save(paused)
if lnext ~= nil then redis.call('PEXPIRE', KEYS[2], math.ceil((last - now + 60) * 1000)) end
local reply = {tostring(share), b, initial, tostring(math.max(0, paused - now)), dropped}
for _, lid in ipairs(told) do reply[#reply + 1] = lid end
return reply
""".replace("@MAX_LEASES@", str(MAX_LEASES_PER_KEY))
