//! The Lua scripts of the Redis store: one per step, each run atomically by the server (see the
//! parent module for the record layout they share).

use super::route::Script;

use super::SCHEMA_VERSION;

// Redis spends microseconds on each `redis.call` (argument and reply conversion), on each closure
// a script creates per run, and on a table reply (it looks for `err`, `ok` and other fields
// first); a scalar reply is cheaper. So the scripts make few calls, share four small functions,
// and give the common answer bare: a fresh claim its fence, a replay the record, complete,
// release and renew `1`, the re-check of a wait the lease time left. Any other answer is a table
// whose first item says what happened.
//
// A wake-up is published with `redis.pcall`: it is a hint (waiters re-check on a timer), sent
// after the step's writes, and Redis does not undo a script's writes when a later command fails.
// A user the ACL gives no pub/sub channel (Redis 7's `acl-pubsub-default resetchannels` makes
// that every new user's default) would otherwise see every step that publishes fail after it
// did its work.
//
// Every script but forget starts with the version (see `Scripts::new`) and `HEAD`, the record's
// GET: a key of another type answers WRONGTYPE, caught by `pcall`, so the common path pays no
// TYPE lookup. Claim then answers a replay, before the prelude has cost anything.
const HEAD: &str = r#"
local v = redis.pcall('GET', KEYS[1])
"#;

// `now` reads the server's clock, only in the steps that need it. `record` migrates a version 1
// hash, the only time a type is looked at. `header` reads the header with one match and never
// copies the payload. `%d` prints an integer-valued Lua number without an exponent (Lua's own
// tostring would print 1.7e+15).
// Redis 3.2 to 4 replicate scripts verbatim unless told to replicate their effects, and refuse
// writes after `TIME` in verbatim mode; 5 and later replicate effects anyway.
const PRELUDE: &str = r#"
if redis.replicate_commands then redis.replicate_commands() end
local format = string.format
-- Lua numbers are doubles: a fence at or above 2^53 - 1 has no exact successor.
local EXACT = 9007199254740991
local function now()
  local t = redis.call('TIME')
  local us = tonumber(t[1]) * 1000000 + tonumber(t[2])
  return us, math.floor(us / 1000)
end
local function inflight(fence, w, lu, fp, owner, since, origin)
  return V .. '|f|' .. fence .. '|' .. w .. '|' .. lu .. '|' .. fp .. '|' .. owner .. '|' .. since
    .. '|' .. origin .. '|'
end
-- Of the GET's answer: the record (false when there is none), or an 'incompatible' answer. A
-- version 1 record is a hash (fields v st fence fp lu ok p w): rewritten as a string with the
-- same content and expiry, it goes on as if it had always been one. Anything else is left as it
-- is.
local function record(v)
  if type(v) ~= 'table' then return v end
  -- Refused, not of another type (an ACL without GET or without these keys): say so.
  if v['err'] and not string.find(v['err'], 'WRONGTYPE', 1, true) then
    return {'refused', v['err']}
  end
  local t = redis.call('TYPE', KEYS[1])['ok']
  if t ~= 'hash' then return {'incompatible', 'key ' .. KEYS[1] .. ' holds a ' .. t} end
  local h = redis.call('HMGET', KEYS[1], 'v', 'st', 'fence', 'fp', 'lu', 'ok', 'p', 'w')
  local bad = 'record ' .. KEYS[1] .. ' (schema version 1) is malformed'
  if h[1] ~= '1' then
    bad = 'record ' .. KEYS[1] .. ' is a hash of schema version ' .. (h[1] or 'none')
  end
  local st, fence, fp, w = h[2], h[3] or '', h[4] or '', h[8] or '0'
  local lu, ok, p = '', '', ''
  if st == 'f' then lu = h[5] or '' elseif st == 'd' then ok, p = h[6], h[7] or '' end
  -- Version 1 always wrote `p` once done: the JSON with success and failure, '' with unknown.
  local paid = (ok == 's' or ok == 'f') and h[7]
  if h[1] ~= '1' or not (st == 'f' or paid or (ok == 'u' and p == ''))
      or not (string.match(fence, '^%d+$') and #fp == 64 and string.match(fp, '^[0-9a-f]+$')
        and string.match(lu, '^%d*$') and (w == '0' or w == '1')) then
    return {'incompatible', bad}
  end
  -- No since nor origin: version 1 did not store them.
  v = V .. '|' .. st .. '|' .. fence .. '|' .. w .. '|' .. lu .. '|' .. fp .. '|' .. ok .. '|||' .. p
  local ttl = redis.call('PTTL', KEYS[1])
  redis.call('DEL', KEYS[1])
  if ttl > 0 then redis.call('SET', KEYS[1], v, 'PX', ttl) else redis.call('SET', KEYS[1], v) end
  return v
end
local HEADER = '^' .. V .. '|([fd])|(%d+)|([01])|(%d*)|([0-9a-f]+)|([^|]*)|(%d*)|([^|]*)|'
-- Version 2 had no since nor origin; its records read with both empty (unknown).
local HEADER2 = '^2|([fd])|(%d+)|([01])|(%d*)|([0-9a-f]+)|([^|]*)|'
-- Of what `record` returned: nothing when there is no record; else an answer to return, or nil
-- and the header: state, fence, waited on, lease end, fingerprint, the seventh field (the owner
-- token in flight, after a `t` in a takeover's, empty in records written before owners; the
-- outcome kind once done), since (ms) and origin (both empty when unknown).
local function header(v)
  if not v then return end
  if type(v) == 'table' then return v end
  local st, fence, w, lu, fp, o, since, origin = string.match(v, HEADER)
  if st and #fp == 64 then return nil, st, fence, w, lu, fp, o, since, origin end
  st, fence, w, lu, fp, o = string.match(v, HEADER2)
  if st and #fp == 64 then return nil, st, fence, w, lu, fp, o, '', '' end
  local version = string.match(v, '^(%w+)|')
  if not version then
    return {'incompatible', 'key ' .. KEYS[1] .. ' holds a string that is not an idem record'}
  end
  if version ~= V and version ~= '2' then
    return {'incompatible', 'record ' .. KEYS[1] .. ' has schema version ' .. version}
  end
  return {'incompatible', 'record ' .. KEYS[1] .. ' (schema version ' .. V .. ') is malformed'}
end
"#;

// KEYS: rec, fence counter. ARGV: fingerprint, lease ms, on_expired (t|u), owner token, origin
// (see `reply::encode_origin`).
// A completed record is returned as it is stored: it does not change until it expires or is
// forgotten, so the client can check its version and fingerprint and decode it, and a replay
// costs the server one GET and no parsing. A fresh record starts above the counter; a takeover
// above the record's own fence (a record's fence is never below the counter).
const REPLAY: &str = r#"
if type(v) == 'string' and (string.sub(v, 1, #V + 3) == V .. '|d|' or string.sub(v, 1, 4) == '2|d|')
then return v end
"#;

const CLAIM: &str = r#"
v = record(v)
if not v then
  local now_us, now_ms = now()
  local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if c >= EXACT then return {'incompatible', 'fence counter ' .. KEYS[2] .. ' is beyond 2^53, which idem never writes: DEL it (forget leaves counters; new fences continue above the server clock in microseconds)'} end
  local f = math.max(c + 1, now_us)
  local lu = format('%d', now_ms + ARGV[2])
  redis.call('SET', KEYS[1],
    inflight(format('%d', f), '0', lu, ARGV[1], ARGV[4], format('%d', now_ms), ARGV[5]))
  return f
end
-- A version 1 record that was completed, just migrated.
if type(v) == 'string' and string.sub(v, 1, #V + 3) == V .. '|d|' then return v end
local bad, st, fence, w, lu, fp, o, since, origin = header(v)
if bad then return bad end
if fp ~= ARGV[1] then return {'mismatch'} end
local now_us, now_ms = now()
-- This claim's own record: an earlier send created it (or took it over: its token then starts
-- with `t`) and its reply was lost, or the native claim wrote it with a fence from the client's
-- estimate of this clock. It is still ours (another takeover would have changed the owner):
-- acquired again, with a fresh lease, and a fence above the counter (nobody has seen this fence
-- yet); a takeover answers a takeover again, so the caller still treats the dead owner's
-- attempt as one that may have happened.
local took = o == 't' .. ARGV[4]
if o == ARGV[4] or took then
  local f = tonumber(fence)
  local c = tonumber(redis.call('GET', KEYS[2]) or '0') or 0
  if c >= f then
    if c >= EXACT then return {'incompatible', 'fence counter ' .. KEYS[2] .. ' is beyond 2^53, which idem never writes: DEL it (forget leaves counters; new fences continue above the server clock in microseconds)'} end
    f = math.max(c + 1, now_us)
    fence = format('%d', f)
  end
  redis.call('SET', KEYS[1],
    inflight(fence, w, format('%d', now_ms + ARGV[2]), fp, o, since, origin))
  if took then return {'takeover', f} end
  return f
end
lu = tonumber(lu) or 0
if lu > now_ms then return {'inflight', tonumber(fence), lu - now_ms} end
if ARGV[3] == 'u' then return {'unknown'} end
if tonumber(fence) >= EXACT then
  return {'incompatible', 'record ' .. KEYS[1] .. ' has a fence beyond 2^53'}
end
local f = math.max(tonumber(fence) + 1, now_us)
-- The owner token marked as a takeover's (`t` first): a resend of this claim answers a takeover,
-- and a release by owner token (a claim that gave up) leaves the record to its lease.
redis.call('SET', KEYS[1],
  inflight(format('%d', f), '0', format('%d', now_ms + ARGV[2]), fp, 't' .. ARGV[4],
    format('%d', now_ms), ARGV[5]))
if w == '1' then redis.pcall('PUBLISH', string.sub(KEYS[1], 1, -4) .. 'ev', 'takeover') end
return {'takeover', f}
"#;

// The common completion, before the prelude: this version's record in flight under the fence,
// kept for a while. It writes what the full path below would, matched by the same header
// pattern, without the prelude's setup and helper calls (15% of the full script's instructions
// on Redis 7.0). Anything else (a resend finding the record done or gone, a lost lease, a
// version 1 or 2 record, no retention) goes on to the full path. `{V}` is the schema version.
const COMPLETE_COMMON: &str = r#"
if type(v) == 'string' and ARGV[4] ~= '0' then
  local fence, w, fp, origin = string.match(v,
    '^{V}|f|(%d+)|([01])|%d*|([0-9a-f]+)|[^|]*|%d*|([^|]*)|')
  if fence == ARGV[1] and #fp == 64 then
    if redis.replicate_commands then redis.replicate_commands() end
    local t = redis.call('TIME')
    redis.call('SET', KEYS[1], V .. '|d|' .. fence .. '|0||' .. fp .. '|' .. ARGV[2] .. '|'
      .. t[1] .. string.format('%03d', math.floor(t[2] / 1000)) .. '|' .. origin .. '|' .. ARGV[3],
      'PX', ARGV[4])
    redis.call('SET', KEYS[2], fence, 'PX', string.format('%d', ARGV[4] + ARGV[5]))
    if w == '1' then redis.pcall('PUBLISH', string.sub(KEYS[1], 1, -4) .. 'ev', 'complete') end
    return 1
  end
end
"#;

// KEYS: rec, fence counter. ARGV: fence, kind (s|f|u), payload, ttl ms, counter grace ms, resend
// (1|0). On a resend, a record completed under the fence was completed by the first send (only
// the fence's holder completes, and no two owners share a fence), and a record gone with the
// fence in its counter was completed with no retention (or has expired) since: done. A second
// completion that is not a resend is refused as before.
// The record gets its expiry in the write that completes it, so expiry removes it whole. The
// counter takes the fence for as long as the record may live, plus the grace.
const COMPLETE: &str = r#"
local bad, st, fence, w, lu, fp, o, since, origin = header(record(v))
if bad then return bad end
if ARGV[6] == '1' and ((st == 'd' and fence == ARGV[1])
    or (not st and redis.call('GET', KEYS[2]) == ARGV[1])) then
  return 1
end
if st ~= 'f' or fence ~= ARGV[1] then return {'lost'} end
if ARGV[4] == '0' then
  -- Kept for no time (`SET .. PX 0` is refused): gone at once, as in the other stores.
  redis.call('DEL', KEYS[1])
else
  local _, now_ms = now()
  redis.call('SET', KEYS[1], V .. '|d|' .. fence .. '|0||' .. fp .. '|' .. ARGV[2] .. '|'
    .. format('%d', now_ms) .. '|' .. origin .. '|' .. ARGV[3], 'PX', ARGV[4])
end
redis.call('SET', KEYS[2], fence, 'PX', format('%d', ARGV[4] + ARGV[5]))
if w == '1' then redis.pcall('PUBLISH', string.sub(KEYS[1], 1, -4) .. 'ev', 'complete') end
return 1
"#;

// KEYS: rec, fence counter. ARGV: fence, counter grace ms, resend (1|0). On a resend, a record no
// longer held under the fence was released by the first copy (or the lease is gone anyway).
const RELEASE: &str = r#"
local bad, st, fence, w = header(record(v))
if bad then return bad end
if st ~= 'f' or fence ~= ARGV[1] then
  if ARGV[3] == '1' then return 1 end
  return {'lost'}
end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], fence, 'PX', ARGV[2])
if w == '1' then redis.pcall('PUBLISH', string.sub(KEYS[1], 1, -4) .. 'ev', 'release') end
return 1
"#;

// KEYS: rec. ARGV: fence, lease ms.
const RENEW: &str = r#"
local bad, st, fence, w, lu, fp, o, since, origin = header(record(v))
if bad then return bad end
if st ~= 'f' or fence ~= ARGV[1] then return {'lost'} end
local _, now_ms = now()
redis.call('SET', KEYS[1], inflight(fence, w, format('%d', now_ms + ARGV[2]), fp, o, since, origin))
return 1
"#;

// KEYS: rec, fence counter. ARGV: owner token, counter grace ms. Releases the record if it is in
// flight under the owner (a claim that gave up after losing its replies); 1 if it did, else 0.
// A record the claim took over carries `t` and the token, so it never matches: deleting it would
// erase the dead owner's attempt, and the next caller would run the tool as if it never had. It
// is left to its lease, and the next claim takes it over again.
const RELEASE_OWNED: &str = r#"
local bad, st, fence, w, lu, fp, o = header(record(v))
if bad then return bad end
if st ~= 'f' or o ~= ARGV[1] then return 0 end
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], fence, 'PX', ARGV[2])
if w == '1' then redis.pcall('PUBLISH', string.sub(KEYS[1], 1, -4) .. 'ev', 'release') end
return 1
"#;

// KEYS: rec, fence counter. ARGV: counter grace ms. Removes whatever is there (an
// operator's reconciliation) and answers how many keys it removed; a record's fence goes to the
// counter, from either layout. The record is deleted before the counter is written: a full Redis
// (`noeviction`) refuses a script's first command that uses memory, and a script that has written
// (here, deleted) is let finish, so removing a record works when the server is full, which is
// when an operator frees memory. (The order is invisible to other clients: a script is atomic.)
const FORGET: &str = r#"
local v = redis.pcall('GET', KEYS[1])
local f
if type(v) == 'string' then f = string.match(v, '^[^|]*|[^|]*|(%d+)|')
elseif type(v) == 'table' then f = redis.pcall('HGET', KEYS[1], 'fence') end
local n = redis.call('DEL', KEYS[1])
if type(f) == 'string' and string.match(f, '^%d+$') then
  redis.call('SET', KEYS[2], f, 'PX', ARGV[1])
end
if n > 0 then redis.pcall('PUBLISH', string.sub(KEYS[1], 1, -4) .. 'ev', 'forget') end
return n
"#;

// KEYS: rec, fence counter. ARGV: counter grace ms, fence, state (f|d). Removes the record only
// if it is still as an operator saw it (that fence, that state): 1; 0 when there is none; -1 when
// it changed meanwhile (taken over, completed), and nothing is removed.
const FORGET_SEEN: &str = r#"
local bad, st, fence, w = header(record(v))
if bad then return bad end
if not st then return 0 end
if fence ~= ARGV[2] or st ~= ARGV[3] then return -1 end
-- Deleted first, as in FORGET: a full Redis lets a script that has written go on.
redis.call('DEL', KEYS[1])
redis.call('SET', KEYS[2], fence, 'PX', ARGV[1])
redis.pcall('PUBLISH', string.sub(KEYS[1], 1, -4) .. 'ev', 'forget')
return 1
"#;

// KEYS: rec. ARGV: fence, mark (1|0). The lease time left (ms) if the record is in flight under
// `fence`, else -1. With mark, flags the record as waited on (`w`), so that the steps that end or
// move the lease publish on its channel.
const WATCH: &str = r#"
local bad, st, fence, w, lu, fp, o, since, origin = header(record(v))
if bad then return bad end
if st ~= 'f' or fence ~= ARGV[1] then return -1 end
local _, now_ms = now()
local left = (tonumber(lu) or 0) - now_ms
if left <= 0 then return -1 end
if ARGV[2] == '1' and w ~= '1' then
  redis.call('SET', KEYS[1], inflight(fence, '1', lu, fp, o, since, origin))
end
return left
"#;

// KEYS: rec. The server's time (ms) and the record as it is stored; the client reads it
// (`admin.rs`). A version 1 hash is migrated first, as by every step.
const INSPECT: &str = r#"
v = record(v)
local _, now_ms = now()
if not v then return {'none', now_ms} end
if type(v) == 'table' then return v end
return {'rec', now_ms, v}
"#;

// KEYS: rec, fence counter. ARGV: fence, resolution (h happened | n not happened), kind (s|f|u|n),
// payload, ttl ms, counter grace ms. Acts only if the record is under `fence` and resolvable: its
// outcome is unknown, or it is in flight with a lease that ended. Happened stores the outcome as
// complete does; not happened removes the record as release does. Either way the fence moves to
// the counter, so the key's next fence is above it.
const RESOLVE: &str = r#"
local bad, st, fence, w, lu, fp, o, since, origin = header(record(v))
if bad then return bad end
if not st or fence ~= ARGV[1] then return {'lost'} end
local _, now_ms = now()
if st == 'f' then
  if (tonumber(lu) or 0) > now_ms then return {'lost'} end
elseif o ~= 'u' then
  return {'lost'}
end
if ARGV[2] == 'h' then
  if ARGV[5] == '0' then
    redis.call('DEL', KEYS[1])
  else
    redis.call('SET', KEYS[1], V .. '|d|' .. fence .. '|0||' .. fp .. '|' .. ARGV[3] .. '|'
      .. format('%d', now_ms) .. '|' .. origin .. '|' .. ARGV[4], 'PX', ARGV[5])
  end
  redis.call('SET', KEYS[2], fence, 'PX', format('%d', ARGV[5] + ARGV[6]))
else
  redis.call('DEL', KEYS[1])
  redis.call('SET', KEYS[2], fence, 'PX', ARGV[6])
end
if w == '1' then redis.pcall('PUBLISH', string.sub(KEYS[1], 1, -4) .. 'ev', 'resolve') end
return 1
"#;

/// The scripts, with the schema version in their text.
pub(super) struct Scripts {
    pub(super) claim: Script,
    pub(super) complete: Script,
    pub(super) release: Script,
    pub(super) release_owned: Script,
    pub(super) renew: Script,
    pub(super) forget: Script,
    pub(super) forget_seen: Script,
    pub(super) watch: Script,
    pub(super) inspect: Script,
    pub(super) resolve: Script,
}

impl Scripts {
    pub(super) fn new() -> Self {
        // The version is part of the script's text: a script knows one layout.
        let script = |first: &str, body: &str| {
            Script::new(&format!("local V = '{SCHEMA_VERSION}'{HEAD}{first}{PRELUDE}{body}"))
        };
        Scripts {
            claim: script(REPLAY, CLAIM),
            complete: script(&COMPLETE_COMMON.replace("{V}", SCHEMA_VERSION), COMPLETE),
            release: script("", RELEASE),
            release_owned: script("", RELEASE_OWNED),
            renew: script("", RENEW),
            forget: Script::new(FORGET),
            forget_seen: script("", FORGET_SEEN),
            watch: script("", WATCH),
            inspect: script("", INSPECT),
            resolve: script("", RESOLVE),
        }
    }
}
