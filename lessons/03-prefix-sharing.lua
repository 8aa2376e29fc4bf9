-- 03 Sharing KV blocks: a common system prompt stored once, and
-- copy-on-write when sharers write into the same block.
lab.lesson{
    title = "Sharing blocks: prefix caching and copy-on-write",
    claims = {"tf10", "edge6"},
}

-- fp32 weights: a request's logits then have the same bits however its KV
-- was reached (computed, shared from the prefix cache, or copied), so
-- "sharing is correct" is checked as equality, not closeness.
local model = lab.model{model = "tiny", dtype = "fp32"}
local system_prompt = "You are a helpful assistant who answers in one short sentence. "
    .. "Be polite and precise, and never make anything up."

-- True when two logit arrays have the same values, element by element.
local function same_logits(x, y)
    if #x ~= #y then return false end
    for v = 1, #x do
        if x[v] ~= y[v] then return false end
    end
    return true
end

-- tf10: two requests with the same system prompt and different questions,
-- first with prefix caching, then without.
local function serve_two(prefix_caching)
    local e = lab.engine{model = model, block_size = 16, num_blocks = 64, prefix_caching = prefix_caching}
    local a = e:add{prefix = system_prompt, prompt = "What is a cache?", max_tokens = 8}
    local b = e:add{prefix = system_prompt, prompt = "Why is the sky blue?", max_tokens = 8}
    -- Run until both are decoding, then compare their tables with the pool:
    -- a block listed by both tables must hold one reference per table plus
    -- the prefix cache's own.
    local record
    e:run{stop_when = function(r)
        record = r
        return r.decode_tokens == 2
    end}
    local table_a, table_b = e:sequence(a).block_table, e:sequence(b).block_table
    local ref_counts = e:pool().ref_counts -- (blocks_total) indexed by block id + 1
    local shared, references_right, references = 0, true, {}
    for i = 1, math.min(#table_a, #table_b) do
        if table_a[i] == table_b[i] then
            shared = shared + 1
            local count = ref_counts[table_a[i] + 1]
            references[#references + 1] = count
            references_right = references_right and count == 2 + (prefix_caching and 1 or 0)
        end
    end
    local result = {
        prompt_tokens = e:sequence(a).n_prompt,
        table_entries = #table_a + #table_b,
        physical = record.blocks_used,
        shared = shared,
        references = references,
        references_right = references_right,
    }
    e:run()
    local totals = e:totals()
    result.hits = totals.prefix_hit_tokens
    result.kv_written = totals.bytes.kv_written -- bytes the kernels stored, over the whole run
    result.bytes_per_slot = e:pool().bytes_per_slot
    result.logits = {e:logits(a), e:logits(b)}
    e:close()
    return result
end
local cached = serve_two(true)
local uncached = serve_two(false)
lab.say(string.format("With prefix caching the two tables list %d blocks but the pool holds %d: %d are shared.",
    cached.table_entries, cached.physical, cached.shared))
-- Stored once: every prompt token reused from the cache is a slot the
-- kernels did not write, so the bytes written differ by exactly that.
local saved_bytes = uncached.kv_written - cached.kv_written
local expected_saving = cached.hits * cached.bytes_per_slot
local same_answers = same_logits(cached.logits[1], uncached.logits[1]) and same_logits(cached.logits[2], uncached.logits[2])
local stored_once = cached.shared > 0 and cached.physical < cached.table_entries and cached.hits > 0
    and cached.references_right and saved_bytes == expected_saving and same_answers
lab.check{
    id = "tf10",
    claim = "two requests sharing a system prompt must each store its KV",
    bank_answer = false,
    verdict = not stored_once,
    evidence = string.format("%s: prompts of %d tokens; with prefix caching %d table entries in %d physical blocks "
        .. "(%d shared, references per shared block {%s}, 3 = two tables + the cache); %d prompt tokens reused, "
        .. "KV bytes written %d vs %d without caching (%d saved, %d tokens x %d bytes = %d); final logits with and "
        .. "without caching bit-identical: %s; without caching %d entries in %d blocks",
        stored_once and "stored once" or "not stored once as it should be", cached.prompt_tokens,
        cached.table_entries, cached.physical, cached.shared, table.concat(cached.references, ","), cached.hits,
        cached.kv_written, uncached.kv_written, saved_bytes, cached.hits, cached.bytes_per_slot, expected_saving,
        tostring(same_answers), uncached.table_entries, uncached.physical),
    breaks_with = {"prefix-no-refcount", "kv-count-dropped", "kv-count-doubled"},
}
lab.pause()

-- edge6: one request, two samples (a fork). After the prompt both share
-- every block, including the partly filled last one; the first decode step
-- writes a new token into that block from both samples, so one of them
-- must get its own copy first.
local e = lab.engine{model = model, block_size = 16, num_blocks = 64}
local first = e:add{prompt = "Once upon a time, in a small town", max_tokens = 6, n = 2, temperature = 1.0, seed = 7}
local prefill = e:step()
local shared_tail = prefill.sequences[1].block_table[#prefill.sequences[1].block_table]
local tail_filled = e:pool().filled[shared_tail + 1] -- slots the copy must carry
local bytes_per_slot = e:pool().bytes_per_slot
local copies, copy_bytes, events = 0, 0, {}
e:run{stop_when = function(r)
    copies = copies + r.copies
    copy_bytes = copy_bytes + r.copy_bytes
    for _, ev in ipairs(r.events) do
        if ev.kind == "copy" then events[#events + 1] = string.format("block %d -> %d", ev.block, ev.other_block) end
    end
    return r.copies > 0 or r.decode_tokens > 0
end}
local one, two = e:sequence(first), e:sequence(first + 1)
local last_one, last_two = one.block_table[#one.block_table], two.block_table[#two.block_table]
local same_front = one.block_table[1] == two.block_table[1]
local front_block, n_prompt = one.block_table[1], one.n_prompt
e:run() -- both samples to the end; finished, they hand their blocks back
one, two = e:sequence(first), e:sequence(first + 1)

-- Each sample's last logits against the same tokens computed alone, in a
-- fresh engine with nothing shared: equal only if neither sample ever read
-- the other's keys and values.
local function logits_alone(sample)
    local logits, position = e:logits(sample.id)
    local ids = {}
    for i = 1, position + 1 do ids[i] = sample.tokens[i] end
    local fresh = lab.engine{model = model, block_size = 16, num_blocks = 64}
    local id = fresh:add{ids = ids, max_tokens = 1}
    fresh:run()
    local alone = fresh:logits(id)
    fresh:close()
    return same_logits(logits, alone)
end
local one_right, two_right = logits_alone(one), logits_alone(two)
local expected_copy_bytes = tail_filled * bytes_per_slot
local private_copies = copies >= 1 and last_one ~= last_two and same_front and copy_bytes == expected_copy_bytes
    and one_right and two_right
lab.check{
    id = "edge6",
    claim = "when two sharers write into a shared block, copy-on-write gives each its own copy",
    bank_answer = true,
    verdict = private_copies,
    evidence = string.format("%s: prompt of %d tokens in %d blocks, the last holding %d; first decode step: %d "
        .. "copy-on-write (%s), %d bytes copied (%d slots x %d bytes = %d); last blocks now %d and %d, first block "
        .. "still shared (%d); each sample's final logits equal the same tokens computed alone: %s, %s",
        private_copies and "each writer got its own copy" or "the samples did not get private, complete copies",
        n_prompt, #prefill.sequences[1].block_table, tail_filled, copies,
        #events > 0 and table.concat(events, ", ") or "none", copy_bytes, tail_filled, bytes_per_slot,
        expected_copy_bytes, last_one, last_two, front_block, tostring(one_right), tostring(two_right)),
    breaks_with = {"no-cow", "cow-short-copy"},
}
