-- 03 Sharing KV blocks: a common system prompt stored once, and
-- copy-on-write when sharers write into the same block.
lab.lesson{
    title = "Sharing blocks: prefix caching and copy-on-write",
    claims = {"tf10", "edge6"},
}

local model = lab.model("tiny")
local system_prompt = "You are a helpful assistant who answers in one short sentence. "
    .. "Be polite and precise, and never make anything up."

-- tf10: two requests with the same system prompt and different questions,
-- first with prefix caching, then without.
local function serve_two(prefix_caching)
    local e = lab.engine{model = model, block_size = 16, num_blocks = 64, prefix_caching = prefix_caching}
    local a = e:add{prefix = system_prompt, prompt = "What is a cache?", max_tokens = 8}
    local b = e:add{prefix = system_prompt, prompt = "Why is the sky blue?", max_tokens = 8}
    -- Run until both are decoding, then compare their tables with the pool.
    local record
    e:run{stop_when = function(r)
        record = r
        return r.decode_tokens == 2
    end}
    local table_a, table_b = e:sequence(a).block_table, e:sequence(b).block_table
    local shared = 0
    for i = 1, math.min(#table_a, #table_b) do
        if table_a[i] == table_b[i] then shared = shared + 1 end
    end
    local result = {
        prompt_tokens = e:sequence(a).n_prompt,
        table_entries = #table_a + #table_b,
        physical = record.blocks_used,
        shared = shared,
        hits = e:totals().prefix_hit_tokens,
    }
    e:close()
    return result
end
local cached = serve_two(true)
local uncached = serve_two(false)
lab.say(string.format("With prefix caching the two tables list %d blocks but the pool holds %d: %d are shared.",
    cached.table_entries, cached.physical, cached.shared))
lab.check{
    id = "tf10",
    claim = "two requests sharing a system prompt must each store its KV",
    bank_answer = false,
    verdict = cached.physical == cached.table_entries and cached.hits == 0,
    evidence = string.format("prompts of %d tokens: with prefix caching %d table entries in %d physical blocks (%d shared, "
        .. "%d prompt tokens reused); without it %d entries in %d blocks",
        cached.prompt_tokens, cached.table_entries, cached.physical, cached.shared, cached.hits, uncached.table_entries,
        uncached.physical),
}
lab.pause()

-- edge6: one request, two samples (a fork). After the prompt both share
-- every block, including the partly filled last one; the first decode step
-- writes a new token into that block from both samples, so one of them
-- must get its own copy first.
local e = lab.engine{model = model, block_size = 16, num_blocks = 64}
local first = e:add{prompt = "Once upon a time, in a small town", max_tokens = 6, n = 2, temperature = 1.0, seed = 7}
local prefill = e:step()
local copies, copy_bytes, events = 0, 0, {}
e:run{stop_when = function(r)
    copies = copies + r.copies
    copy_bytes = copy_bytes + r.copy_bytes
    for _, ev in ipairs(r.events) do
        if ev.kind == "copy" then events[#events + 1] = string.format("block %d -> %d", ev.block, ev.other_block) end
    end
    return r.copies > 0
end}
local one, two = e:sequence(first), e:sequence(first + 1)
local last_one, last_two = one.block_table[#one.block_table], two.block_table[#two.block_table]
local same_front = one.block_table[1] == two.block_table[1]
lab.check{
    id = "edge6",
    claim = "when two sharers write into a shared block, copy-on-write gives each its own copy",
    bank_answer = true,
    verdict = copies >= 1 and last_one ~= last_two and same_front,
    evidence = string.format("prompt of %d tokens in %d blocks; first decode step: %d copy-on-write (%s, %d bytes); "
        .. "last blocks now %d and %d, first block still shared (%d)",
        one.n_prompt, #prefill.sequences[1].block_table, copies, table.concat(events, ", "), copy_bytes, last_one, last_two,
        one.block_table[1]),
}
