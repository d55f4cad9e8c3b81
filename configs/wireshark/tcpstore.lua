-- TCPStore (PyTorch's torch.distributed key-value store) for Wireshark and tshark.
--
-- Load:   wireshark -X lua_script:configs/wireshark/tcpstore.lua
--         tshark -X lua_script:configs/wireshark/tcpstore.lua -r capture.pcapng -Y tcpstore
--   or copy it to ~/.local/lib/wireshark/plugins/. The store's port is 29500; another one:
--   -d tcp.port==PORT,tcpstore (Decode As), or the "Ports" preference.
--
-- What it shows: each client message (the store's replies are unframed: where one ends is known only
-- from the request it answers, so they are shown as reply bytes), its op, key, value, counts and
-- lengths, and the protocol generation the stream speaks, with why:
--   G0 (torch 1.13, 2.0), G1 (2.1): no VALIDATE; read as G0 unless the "Generation without VALIDATE"
--     preference says G1 (a 2.1 client), as storeguard replay does (--generation 2.1).
--   G2 to G6 (2.2 and later): the stream starts with VALIDATE 00 ce f7 85 3c; opcodes are those of
--     the newest table, and the generation is the oldest that has every op seen so far (PING: G3,
--     queue ops: G4, LIST_KEYS: G5, BARRIER: G6), as storeguard replay reports it.
-- Expert info marks a length or count past the store's or storeguard's default limits (key 8192 B,
-- value 8 MiB, 131072 keys, message 32 MiB), an opcode the generation lacks, a VALIDATE missing,
-- repeated or with a wrong magic. nmap -sV's TerminalServer probe (PyTorch #106294) reads as an ADD
-- whose key length is about 962 GB, and is shown as that. After the first such violation the rest
-- of the stream is shown as data: storeguard would have closed it there.
--
-- tcpstore.op and tcpstore.generation use storeguard's names (storeguard replay --json), so that a
-- capture's messages can be compared stream by stream (scripts/dissector-vs-replay.sh).

local p = Proto("tcpstore", "PyTorch TCPStore")

local pf = {
    op = ProtoField.string("tcpstore.op", "Operation"),
    opcode = ProtoField.uint8("tcpstore.opcode", "Opcode", base.DEC),
    generation = ProtoField.string("tcpstore.generation", "Generation"),
    why = ProtoField.string("tcpstore.generation_why", "Generation decided by"),
    key_len = ProtoField.uint64("tcpstore.key_len", "Key length", base.DEC),
    key = ProtoField.bytes("tcpstore.key", "Key"),
    key_text = ProtoField.string("tcpstore.key_text", "Key (text)"),
    value_len = ProtoField.uint64("tcpstore.value_len", "Value length", base.DEC),
    value = ProtoField.bytes("tcpstore.value", "Value"),
    count = ProtoField.uint64("tcpstore.count", "Count", base.DEC),
    delta = ProtoField.int64("tcpstore.delta", "Delta", base.DEC),
    world = ProtoField.uint64("tcpstore.world_size", "World size", base.DEC),
    magic = ProtoField.uint32("tcpstore.magic", "Magic", base.HEX),
    nonce = ProtoField.uint32("tcpstore.nonce", "Nonce", base.HEX),
    reply = ProtoField.bytes("tcpstore.reply", "Reply bytes"),
    violation = ProtoField.string("tcpstore.violation", "Violation (storeguard closes the stream here)"),
    rest = ProtoField.bytes("tcpstore.after_violation", "Bytes after a violation (storeguard closes the stream there)"),
}
p.fields = pf

local ef = {
    limit = ProtoExpert.new("tcpstore.limit", "Length or count past a limit", expert.group.MALFORMED, expert.severity.ERROR),
    opcode = ProtoExpert.new("tcpstore.unknown_opcode", "Opcode not in this generation", expert.group.MALFORMED, expert.severity.ERROR),
    validate = ProtoExpert.new("tcpstore.validate", "VALIDATE missing, repeated or wrong", expert.group.PROTOCOL, expert.severity.ERROR),
    probe = ProtoExpert.new("tcpstore.probe", "A scanner's probe", expert.group.SECURITY, expert.severity.WARN),
}
p.experts = ef

p.prefs.ports = Pref.range("Ports", "29500", "TCP ports of TCPStore servers", 65535)
-- -o tcpstore.legacy:G1 reads them as torch 2.1's.
p.prefs.legacy = Pref.enum("Generation without VALIDATE", 0,
    "How a stream that does not start with VALIDATE is read: G0 (torch 1.13, 2.0) or G1 (torch 2.1)",
    { { 1, "G0", 0 }, { 2, "G1", 1 } }, false)

-- Limits: the store's own (libuv) and storeguard's defaults.
local MAX_KEY, MAX_VALUE, MAX_KEYS, MAX_MESSAGE = 8192, 8 * 1024 * 1024, 131072, 32 * 1024 * 1024
local MAGIC = 0x3C85F7CE

-- Each op's fields: head once, then loop count times ("count" in head).
local K, V, E, D, C, DL, W, M, N = "key", "value", "expected", "desired", "count", "delta", "world_size", "magic", "nonce"
local layouts = {
    validate = { M }, set = { K, V }, compare_set = { K, E, D }, get = { K }, add = { K, DL },
    check = { C, loop = { K } }, wait = { C, loop = { K } }, get_num_keys = {}, watch_key = { K }, delete_key = { K },
    append = { K, V }, multi_get = { C, loop = { K } }, multi_set = { C, loop = { K, V } }, cancel_wait = {},
    ping = { N }, queue_push = { K, V }, queue_pop = { K }, queue_len = { K }, list_keys = {}, barrier = { K, W },
}

local g0 = { "set", "compare_set", "get", "add", "check", "wait", "get_num_keys", "watch_key", "delete_key" }
local g1 = { "set", "compare_set", "get", "add", "check", "wait", "get_num_keys", "delete_key", "append", "multi_get",
    "multi_set", "cancel_wait" }
local g6 = { "validate" }
for _, op in ipairs(g1) do g6[#g6 + 1] = op end
for _, op in ipairs({ "ping", "queue_push", "queue_pop", "queue_len", "list_keys", "barrier" }) do g6[#g6 + 1] = op end
-- The oldest generation that has each op (G2+ streams).
local first_gen = { ping = 3, queue_push = 4, queue_pop = 4, queue_len = 4, list_keys = 5, barrier = 6 }

local function op_of(st, byte)
    local t = (st.gen == 0 and g0) or (st.gen == 1 and g1) or g6
    return t[byte + 1]
end

-- Per stream: gen (0, 1, or 2 for the G2+ table), min_gen, validated, dead; per frame what it showed.
local streams = {}
local tcp_stream = Field.new("tcp.stream")

local function u64(tvb, off)
    return tvb(off, 8):le_uint64()
end

-- parse reads one message at off of the client's bytes; returns its length, -1 when it goes on in
-- a later segment, or nil when it breaks a rule (the tree items say which).
local function parse(tvb, off, st, tree, pinfo)
    local avail = tvb:len() - off
    if avail < 1 then return -1 end
    local opcode = tvb(off, 1):uint()
    local op
    if st.gen >= 2 then
        op = g6[opcode + 1]
    else
        op = op_of(st, opcode)
    end
    local pos = off + 1
    -- Walk the fields, checking each length as its 8 bytes arrive.
    local fields = {}
    local lay = op and layouts[op]
    local function need(n)
        if tvb:len() < pos + n then return false end
        return true
    end
    local problem
    if not op then
        problem = { ef.opcode, string.format("opcode %d is not in %s", opcode, st.gen >= 2 and "G2-G6" or ("G" .. st.gen)) }
    elseif st.gen >= 2 and not st.validated and op ~= "validate" then
        problem = { ef.validate, op == "ping" and "PING before VALIDATE" or "the first message is not VALIDATE" }
    elseif st.gen >= 2 and st.validated and op == "validate" then
        problem = { ef.validate, "a second VALIDATE" }
    end
    if problem then
        local t = tree:add(p, tvb(off, 1), "TCPStore message: " .. (op or "unknown"))
        t:add(pf.opcode, tvb(off, 1))
        t:add(pf.violation, tvb(off, 1), problem[2])
        t:add_proto_expert_info(problem[1], problem[2])
        return nil
    end
    local items = {}
    local function field(kind)
        if kind == M or kind == N then
            if not need(4) then return false end
            local v = tvb(pos, 4):le_uint()
            items[#items + 1] = { kind, pos, 4, v }
            if kind == M and v ~= MAGIC then
                items[#items].bad = { ef.validate, string.format("VALIDATE magic 0x%08x, not 0x%08x", v, MAGIC) }
                return nil
            end
            pos = pos + 4
            return true
        end
        if not need(8) then return false end
        local n = u64(tvb, pos)
        if kind == K or kind == V or kind == E or kind == D then
            local limit = (kind == K) and MAX_KEY or MAX_VALUE
            items[#items + 1] = { kind, pos, 8, n }
            if n > UInt64(limit) then
                local gb = n:tonumber() / 1e9
                local what = string.format("%s length %s B (%.1f GB) > %d", kind, tostring(n), gb, limit)
                if op == "add" and kind == K and tvb(off, 1):uint() == 3 and tvb(off + 1, 3):bytes():tohex() == "00000B" then
                    what = what .. ": nmap -sV's TerminalServer probe (RDP X.224), the allocation of PyTorch #106294"
                    items[#items].probe = true
                end
                items[#items].bad = { ef.limit, what }
                return nil
            end
            pos = pos + 8
            local len = n:tonumber()
            if not need(len) then return false end
            items[#items + 1] = { kind .. "_body", pos, len }
            pos = pos + len
            return true
        end
        items[#items + 1] = { kind, pos, 8, n }
        if kind == C and n > UInt64(MAX_KEYS) then
            items[#items].bad = { ef.limit, string.format("count %s > %d", tostring(n), MAX_KEYS) }
            return nil
        end
        pos = pos + 8
        return true
    end
    local ok = true
    local count = 0
    for _, kind in ipairs(lay) do
        ok = field(kind)
        if ok ~= true then break end
        if kind == C then count = items[#items][4]:tonumber() end
    end
    if ok == true and lay.loop then
        for _ = 1, count do
            for _, kind in ipairs(lay.loop) do
                ok = field(kind)
                if ok ~= true then break end
            end
            if ok ~= true then break end
        end
    end
    if ok == true and pos - off > MAX_MESSAGE then
        ok = nil
        items[#items + 1] = { "message", off, 1, 0, bad = { ef.limit, string.format("message of %d B > %d", pos - off, MAX_MESSAGE) } }
    end
    if ok == false then
        return -1 -- the message goes on in a later segment; reassembly asks again
    end
    -- A whole message, or one that broke a rule: show it.
    if ok == true then
        if op == "validate" then st.validated = true end
        if st.gen >= 2 then st.min_gen = math.max(st.min_gen, first_gen[op] or 2) end
    end
    local shown = math.min(pos - off, tvb:len() - off)
    local t = tree:add(p, tvb(off, shown), "TCPStore " .. op:upper())
    t:add(pf.opcode, tvb(off, 1))
    if ok == true then -- a message that broke a rule is no message: storeguard forwards none of it
        t:add(pf.op, tvb(off, 1), op)
    end
    local gname = "G" .. ((st.gen >= 2) and st.min_gen or st.gen)
    t:add(pf.generation, gname):set_generated()
    t:add(pf.why, st.why):set_generated()
    for _, it in ipairs(items) do
        local kind, at, len = it[1], it[2], it[3]
        local item
        if kind == K then
            item = t:add_le(pf.key_len, tvb(at, 8))
        elseif kind == V or kind == E or kind == D then
            item = t:add_le(pf.value_len, tvb(at, 8)):append_text(" (" .. kind .. ")")
        elseif kind == "key_body" then
            if len > 0 then
                t:add(pf.key, tvb(at, len))
                t:add(pf.key_text, tvb(at, len), tvb(at, len):string())
            end
        elseif kind:sub(-5) == "_body" then
            if len > 0 then t:add(pf.value, tvb(at, len)) end
        elseif kind == C then
            item = t:add_le(pf.count, tvb(at, 8))
        elseif kind == DL then
            item = t:add_le(pf.delta, tvb(at, 8))
        elseif kind == W then
            item = t:add_le(pf.world, tvb(at, 8))
        elseif kind == M then
            item = t:add_le(pf.magic, tvb(at, 4))
        elseif kind == N then
            item = t:add_le(pf.nonce, tvb(at, 4))
        else
            item = t
        end
        if it.bad then
            t:add(pf.violation, tvb(at, len), it.bad[2])
            ;(item or t):add_proto_expert_info(it.bad[1], it.bad[2])
            if it.probe then (item or t):add_proto_expert_info(ef.probe, "nmap -sV TerminalServer probe") end
        end
    end
    if ok == nil then return nil end
    return pos - off
end

local function is_server_port(port)
    for lo, hi in tostring(p.prefs.ports):gmatch("(%d+)%-?(%d*)") do
        local l, h = tonumber(lo), tonumber(hi ~= "" and hi or lo)
        if port >= l and port <= h then return true end
    end
    return false
end

function p.dissector(tvb, pinfo, tree)
    local sid = tcp_stream().value
    local to_server = is_server_port(pinfo.dst_port) or pinfo.match_uint == pinfo.dst_port
    pinfo.cols.protocol = "TCPStore"
    if not to_server then
        local t = tree:add(p, tvb(), "TCPStore reply bytes")
        t:add(pf.reply, tvb())
        pinfo.cols.info = "reply, " .. tvb:len() .. " bytes"
        return tvb:len()
    end
    local st = streams[sid]
    if st == nil then
        -- The stream's first bytes decide: VALIDATE 00 ce f7 85 3c, or a G0/G1 message (a G0/G1 SET
        -- starts with 00 too, and torch <= 2.0 sends the opcode in a segment of its own: wait for 5).
        if tvb(0, 1):uint() == 0 and tvb:len() < 5 then
            pinfo.desegment_offset = 0
            pinfo.desegment_len = DESEGMENT_ONE_MORE_SEGMENT
            return tvb:len()
        end
        st = { dead = false, validated = false, min_gen = 2 }
        streams[sid] = st
        if tvb(0, 1):uint() == 0 and tvb(1, 4):le_uint() == MAGIC then
            st.gen, st.why = 2, "the stream starts with VALIDATE (torch 2.2+); the oldest generation with every op seen"
        else
            st.gen = p.prefs.legacy
            st.why = "no VALIDATE first (torch <= 2.1); read as G" .. st.gen .. " (the preference)"
        end
    end
    if st.dead then
        tree:add(p, tvb(), "TCPStore"):add(pf.rest, tvb())
        return tvb:len()
    end
    local off, ops = 0, {}
    while off < tvb:len() do
        local n = parse(tvb, off, st, tree, pinfo)
        if n == nil then
            st.dead = true
            ops[#ops + 1] = "VIOLATION"
            break
        end
        if n < 0 then
            pinfo.desegment_offset = off
            pinfo.desegment_len = DESEGMENT_ONE_MORE_SEGMENT
            break
        end
        local op = op_of(st, tvb(off, 1):uint())
        if st.gen >= 2 then op = g6[tvb(off, 1):uint() + 1] end
        ops[#ops + 1] = op:upper()
        off = off + n
    end
    if #ops > 0 then pinfo.cols.info = table.concat(ops, ", ") end
    return tvb:len()
end

DissectorTable.get("tcp.port"):add(29500, p)
