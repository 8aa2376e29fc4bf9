-- 03 Sharing KV blocks: a common system prompt stored once (its full blocks
-- shared, no copy when the requests diverge), and copy-on-write when the
-- samples of one request (a fork) write into their shared, partly filled
-- last block.
lab.lesson{
    title = "Sharing blocks: prefix caching and copy-on-write",
    claims = {"tf10", "edge6"},
}

-- fp32 weights, and every answer is checked against the reference forward
-- pass (lab.reference_logits): the model's math written again apart from
-- the engine, run alone on the same tokens with nothing shared. Comparing
-- the engine with itself (cached against uncached) would pass even when
-- both ran the same wrong forward pass.
local model = lab.model{model = "tiny", dtype = "fp32"}
local system_prompt = "You are a helpful assistant who answers in one short sentence. "
    .. "Be polite and precise, and never make anything up."

-- These engines keep their KV in fp16, so the reference rounds its own
-- cache to fp16 too. The two then attend over the same stored values,
-- except where inputs a few fp32 bits apart round to neighbouring fp16
-- values: one fp16 step, 2^-11 of an element, is the bound
-- (tests/engine/test_reference_forward.c measured 1.1e-4 on this model).
local REFERENCE_BOUND = 2 ^ -11
-- The largest difference between sequence `id`'s last logits and the
-- reference's on the same tokens, over the reference's largest logit.
local function from_reference(e, id)
    local logits, position = e:logits(id)
    local tokens, ids = e:sequence(id).tokens, {}
    for i = 1, position + 1 do ids[i] = tokens[i] end
    return lab.logits_difference(logits, lab.reference_logits{model = model, tokens = ids, kv_dtype = "fp16"})
end
lab.say("Blocks of 16 tokens, the tiny model in fp32. Every answer is checked against the reference forward pass: "
    .. "the model's math written again apart from the engine, run on the same tokens with nothing shared.")

-- tf10: two requests with the same system prompt and different questions,
-- first with prefix caching, then without.
local BLOCK_SIZE = 16
local function serve_two(prefix_caching)
    local e = lab.engine{model = model, block_size = BLOCK_SIZE, num_blocks = 64, prefix_caching = prefix_caching}
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
    -- The tokens both prompts start with: the BOS, the system prompt, and
    -- whatever the two questions happen to share ("W" of What/Why).
    local tokens_a, tokens_b = e:sequence(a).tokens, e:sequence(b).tokens
    local common = 0
    while common < e:sequence(a).n_prompt and tokens_a[common + 1] == tokens_b[common + 1] do common = common + 1 end
    local result = {
        prompt_tokens = e:sequence(a).n_prompt,
        common_tokens = common,
        table_entries = #table_a + #table_b,
        physical = record.blocks_used,
        shared = shared,
        references = references,
        references_right = references_right,
    }
    e:run()
    local totals = e:totals()
    result.hits = totals.prefix_hit_tokens
    result.copies = totals.copies -- copy-on-write copies over the whole run, both requests to their end
    result.kv_written = totals.bytes.kv_written -- bytes the kernels stored, over the whole run
    result.bytes_per_slot = e:pool().bytes_per_slot
    result.from_reference = math.max(from_reference(e, a), from_reference(e, b))
    -- Both are done: the shared blocks are the cache's alone now. A third
    -- request asking A's question again takes every full block of its
    -- prompt but the one holding its last token from the cache.
    local c = e:add{prefix = system_prompt, prompt = "What is a cache?", max_tokens = 8}
    e:run()
    result.later_hits = e:totals().prefix_hit_tokens - totals.prefix_hit_tokens
    result.later_from_reference = from_reference(e, c)
    -- A fourth request starts with the 16 tokens of A's second block: the
    -- same tokens at another position, after no block at all. A block's hash
    -- covers every token before it, so nothing may be reused here.
    local moved = {}
    for i = BLOCK_SIZE + 1, 2 * BLOCK_SIZE do moved[#moved + 1] = tokens_a[i] end
    for i = 40, 59 do moved[#moved + 1] = tokens_b[i] end
    local hits_before = e:totals().prefix_hit_tokens
    local d = e:add{ids = moved, max_tokens = 4}
    e:run()
    result.moved_hits = e:totals().prefix_hit_tokens - hits_before
    result.moved_from_reference = from_reference(e, d)
    -- A fifth asks for exactly A's first two blocks, both cached: a prompt
    -- ending on a block boundary. Its last token must still be computed
    -- (its logits are what the first new token is sampled from), so only
    -- the first block may come from the cache.
    local exact = {}
    for i = 1, 2 * BLOCK_SIZE do exact[i] = tokens_a[i] end
    hits_before = e:totals().prefix_hit_tokens
    local f = e:add{ids = exact, max_tokens = 4}
    e:run()
    result.exact_hits = e:totals().prefix_hit_tokens - hits_before
    -- A cache that also hands out the last block leaves the request nothing
    -- to compute and so no logits: that is this claim's evidence (an
    -- infinite distance), not an error that would stop the lesson.
    local compared, difference = pcall(from_reference, e, f)
    result.exact_from_reference = compared and difference or math.huge
    e:close()
    return result
end
lab.say(string.format("Two requests start with the same %d-character system prompt and then ask different questions. "
    .. "We serve them twice, with prefix caching and without, and compare the block tables with the pool.",
    #system_prompt))
local cached = serve_two(true)
local uncached = serve_two(false)
-- The block math: the cache shares only full blocks (each is found by the
-- hash of its tokens and of every token before it), so the two requests
-- share floor(common prefix / block size) blocks and the second reuses
-- that many blocks' tokens. The block where their texts part ways is each
-- request's own from the start, so no shared block is ever written.
local predicted_shared = cached.common_tokens // BLOCK_SIZE
local predicted_hits = predicted_shared * BLOCK_SIZE
lab.say(string.format("The prompts are %d tokens long and agree on their first %d. Only full blocks can be shared, "
    .. "so the block math predicts %d // %d = %d shared blocks and %d reused prompt tokens.",
    cached.prompt_tokens, cached.common_tokens, cached.common_tokens, BLOCK_SIZE, predicted_shared, predicted_hits))
lab.say(string.format("Measured: the two tables list %d blocks, the pool holds %d, %d are shared, %d prompt tokens "
    .. "were reused. Owners per shared block: {%s}, the two tables and the cache.", cached.table_entries, cached.physical,
    cached.shared, cached.hits, table.concat(cached.references, ",")))
lab.say(string.format("Watch the copies: after the shared blocks each request writes its question and its answer "
    .. "into blocks of its own, so the generations part ways with %d copy-on-write copies.", cached.copies))
lab.pause()
-- Stored once: every prompt token reused from the cache is a slot the
-- kernels did not write, so the bytes written differ by exactly that.
local saved_bytes = uncached.kv_written - cached.kv_written
local expected_saving = cached.hits * cached.bytes_per_slot
local same_answers = cached.from_reference <= REFERENCE_BOUND and uncached.from_reference <= REFERENCE_BOUND
local block_math_holds = cached.shared == predicted_shared and cached.hits == predicted_hits
    and cached.physical == cached.table_entries - cached.shared and cached.copies == 0 and uncached.copies == 0
-- The later request: (prompt tokens - 1) // block size full blocks reused
-- from the cache with caching on, none without.
local predicted_later_hits = (cached.prompt_tokens - 1) // BLOCK_SIZE * BLOCK_SIZE
local predicted_exact_hits = (2 * BLOCK_SIZE - 1) // BLOCK_SIZE * BLOCK_SIZE
local later_reuse_holds = cached.later_hits == predicted_later_hits and uncached.later_hits == 0
    and cached.later_from_reference <= REFERENCE_BOUND and cached.moved_hits == 0
    and cached.moved_from_reference <= REFERENCE_BOUND and cached.exact_hits == predicted_exact_hits
    and cached.exact_from_reference <= REFERENCE_BOUND
local stored_once = cached.shared > 0 and cached.hits > 0 and block_math_holds and cached.references_right
    and saved_bytes == expected_saving and same_answers and later_reuse_holds
lab.say(string.format("Without the prefix cache the same prompts took %d blocks instead of %d, and the kernels wrote "
    .. "%d KV bytes instead of %d. The final logits against the reference: largest relative difference %.3g with "
    .. "caching, %.3g without (one fp16 step allows %.3g).", uncached.physical, cached.physical, uncached.kv_written,
    cached.kv_written, cached.from_reference, uncached.from_reference, REFERENCE_BOUND))
lab.check{
    id = "tf10",
    claim = "two requests sharing a system prompt must each store its KV",
    bank_answer = false,
    verdict = not stored_once,
    evidence = string.format("%s: prompts of %d tokens agreeing on the first %d; with prefix caching %d table entries "
        .. "in %d physical blocks (%d shared, predicted %d // %d = %d; references per shared block {%s}, 3 = two tables "
        .. "+ the cache); %d prompt tokens reused (predicted %d); %d copy-on-write copies with caching, %d without; "
        .. "KV bytes written %d vs %d without caching (%d saved, %d tokens x %d bytes = %d); final logits against the "
        .. "reference forward pass %.3g with caching, %.3g without (bound 2^-11 = %.3g); without caching %d entries in "
        .. "%d blocks; a third request after both finished reused %d prompt tokens from the cache (predicted (%d - 1) // "
        .. "%d x %d = %d; %d without caching), its logits %.3g from the reference; a request starting with A's "
        .. "second block (same tokens, position 0) reused %d tokens (predicted 0: the hash covers the tokens before), "
        .. "logits %.3g from the reference; a prompt of exactly A's first %d tokens reused %d (predicted (%d - 1) // %d "
        .. "x %d = %d: the block holding the last token is computed), logits %.3g from the reference",
        stored_once and "stored once" or "not stored once as the block math says", cached.prompt_tokens,
        cached.common_tokens, cached.table_entries, cached.physical, cached.shared, cached.common_tokens, BLOCK_SIZE,
        predicted_shared, table.concat(cached.references, ","), cached.hits, predicted_hits, cached.copies,
        uncached.copies, cached.kv_written, uncached.kv_written, saved_bytes, cached.hits, cached.bytes_per_slot,
        expected_saving, cached.from_reference, uncached.from_reference, REFERENCE_BOUND, uncached.table_entries,
        uncached.physical, cached.later_hits, cached.prompt_tokens, BLOCK_SIZE, BLOCK_SIZE, predicted_later_hits,
        uncached.later_hits, cached.later_from_reference, cached.moved_hits, cached.moved_from_reference,
        2 * BLOCK_SIZE, cached.exact_hits, 2 * BLOCK_SIZE, BLOCK_SIZE, BLOCK_SIZE, predicted_exact_hits,
        cached.exact_from_reference),
    breaks_with = {"prefix-no-refcount", "kv-count-dropped", "kv-count-doubled"},
    note = string.format("the bank says a private copy is made once the generations diverge; this engine measured %d "
        .. "copies: requests share only full prompt blocks, and they diverge in blocks that were never shared",
        cached.copies),
}
lab.pause()

-- edge6: the only sharers that write into a shared block are the samples of
-- one request (a fork, n > 1): after the prompt they share every block,
-- including a partly filled last one. The block math: writing the first
-- new token into a shared block with k owners takes a copy for each writer
-- but the last, who is then the only owner and writes in place, so k - 1
-- copies of `filled` slots each; a prompt that fills its last block leaves
-- nothing shared to write into, so 0 copies.
local function copies_predicted(n_prompt, n_samples)
    if n_prompt % BLOCK_SIZE == 0 then return 0, 0 end
    return n_samples - 1, n_prompt % BLOCK_SIZE
end
-- Runs one fork to its end; returns what the pool and the records showed.
local function fork(fields, n_samples)
    local e = lab.engine{model = model, block_size = BLOCK_SIZE, num_blocks = 64}
    fields.max_tokens, fields.n, fields.temperature, fields.seed = 6, n_samples, 1.0, 7
    local first = e:add(fields)
    local prefill = e:step()
    local prompt_table = prefill.sequences[1].block_table
    local tail = prompt_table[#prompt_table]
    local result = {
        e = e, first = first, n_prompt = e:sequence(first).n_prompt, prompt_blocks = #prompt_table,
        tail_filled = e:pool().filled[tail + 1], tail_owners = e:pool().ref_counts[tail + 1],
        bytes_per_slot = e:pool().bytes_per_slot, events = {},
    }
    local decode = e:step() -- the first decode step: every sample writes its first new token
    result.first_step_copies = decode.copies
    for _, ev in ipairs(decode.events) do
        if ev.kind == "copy" then
            result.events[#result.events + 1] = string.format("block %d -> %d", ev.block, ev.other_block)
        end
    end
    local lasts, front_shared = {}, true
    for k = 0, n_samples - 1 do
        local t = e:sequence(first + k).block_table
        lasts[#lasts + 1] = t[#t]
        front_shared = front_shared and t[1] == e:sequence(first).block_table[1]
    end
    result.lasts, result.front_shared = lasts, front_shared
    e:run() -- every sample to the end; finished, they hand their blocks back
    result.copies, result.copy_bytes = e:totals().copies, e:totals().copy_bytes
    return result
end
-- True when the last blocks of the samples are all different.
local function all_different(blocks)
    for i = 1, #blocks do
        for j = i + 1, #blocks do
            if blocks[i] == blocks[j] then return false end
        end
    end
    return true
end
local SAMPLES = 3
lab.say(string.format("Now one request asks for %d samples. After its prompt they share every block, the partly "
    .. "filled last one too, and the first decode step writes a new token into that block from every sample.", SAMPLES))
local partial = fork({prompt = "Once upon a time, in a small town"}, SAMPLES)
local want_copies, want_slots = copies_predicted(partial.n_prompt, SAMPLES)
local want_bytes = want_copies * want_slots * partial.bytes_per_slot
lab.say(string.format("The prompt has %d tokens: %d blocks, the last holding %d of %d slots and owned by %d samples. "
    .. "Block math: %d - 1 = %d copies of %d slots, %d bytes; the last writer keeps the original.",
    partial.n_prompt, partial.prompt_blocks, partial.tail_filled, BLOCK_SIZE, partial.tail_owners, SAMPLES, want_copies,
    want_slots, want_bytes))
lab.say(string.format("Measured on the first decode step: %d copies (%s); over the whole run %d copies, %d bytes. "
    .. "The samples' last blocks are now %s.", partial.first_step_copies,
    #partial.events > 0 and table.concat(partial.events, ", ") or "none", partial.copies, partial.copy_bytes,
    table.concat(partial.lasts, ", ")))
-- Each sample's last logits against the reference on its own tokens, with
-- nothing shared: within one fp16 step only if no sample ever read
-- another's keys and values.
local samples_right, samples_text = true, {}
for k = 0, SAMPLES - 1 do
    local difference = from_reference(partial.e, partial.first + k)
    samples_right = samples_right and difference <= REFERENCE_BOUND
    samples_text[#samples_text + 1] = string.format("%.3g", difference)
end
partial.e:close()
lab.say(string.format("Each sample's last logits against the reference forward pass on its own tokens: largest "
    .. "relative differences %s (one fp16 step allows %.3g).", table.concat(samples_text, ", "), REFERENCE_BOUND))
lab.pause()

local aligned_ids = {1}
for k = 1, 2 * BLOCK_SIZE - 1 do aligned_ids[#aligned_ids + 1] = 3 + k * 7 % 250 end
lab.say(string.format("The same fork with a prompt of exactly %d tokens: its last block is full, so each sample's "
    .. "first new token goes into a fresh block of its own. Watch for copies: the block math says 0.",
    #aligned_ids))
local aligned = fork({ids = aligned_ids}, 2)
local aligned_want = copies_predicted(aligned.n_prompt, 2)
lab.say(string.format("Measured: %d copies, %d bytes copied; the two samples' last blocks are %s.", aligned.copies,
    aligned.copy_bytes, table.concat(aligned.lasts, ", ")))
aligned.e:close()

local private_copies = partial.tail_owners == SAMPLES and partial.tail_filled == want_slots
    and partial.first_step_copies == want_copies and partial.copies == want_copies and partial.copy_bytes == want_bytes
    and all_different(partial.lasts) and partial.front_shared and samples_right
    and aligned.copies == aligned_want and aligned.copy_bytes == 0 and all_different(aligned.lasts)
lab.check{
    id = "edge6",
    claim = "when two sharers write into a shared block, copy-on-write gives each its own copy",
    bank_answer = true,
    verdict = private_copies,
    evidence = string.format("%s: a fork of %d samples after a %d-token prompt (%d blocks, the last holding %d, %d owners): "
        .. "first decode step %d copies (%s), whole run %d copies and %d bytes, predicted %d - 1 = %d copies of %d slots "
        .. "x %d bytes = %d; last blocks %s, first block still shared: %s; each sample's final logits against the "
        .. "reference forward pass: %s (bound 2^-11); a fork of 2 after a %d-token prompt (last block full): %d copies, %d bytes "
        .. "(predicted %d), last blocks %s",
        private_copies and "each writer but the last got its own copy, as the block math predicts"
            or "the copies are not the ones the block math predicts",
        SAMPLES, partial.n_prompt, partial.prompt_blocks, partial.tail_filled, partial.tail_owners,
        partial.first_step_copies, #partial.events > 0 and table.concat(partial.events, ", ") or "none", partial.copies,
        partial.copy_bytes, SAMPLES, want_copies, want_slots, partial.bytes_per_slot, want_bytes,
        table.concat(partial.lasts, ","), tostring(partial.front_shared), table.concat(samples_text, ","),
        aligned.n_prompt, aligned.copies, aligned.copy_bytes, aligned_want, table.concat(aligned.lasts, ",")),
    breaks_with = {"no-cow", "cow-short-copy"},
    note = string.format("in this engine the sharers that write into a shared block are forks of one request; "
        .. "requests that only share a system prompt share full blocks and never write into them (the system-prompt "
        .. "check above counted %d copies)", cached.copies),
}
